"""Needle retrieval across the window: can the model copy a span it saw far back?

A passkey in words needs a model that reads instructions; a proxy a few million parameters large
does not, so the needle is a random span of `span` token ids, and retrieval is the copy that
induction heads do. Each trial takes N tokens of real held-out text (inside one long document),
writes the needle at position p, and writes it again at the end of the window; the score is the
top-1 accuracy of the needle's tokens 2..span at that second copy, given its first token, and their
log-probability gain over a control that writes only the final copy (what the model predicts
without the needle in context; its accuracy is about chance, 1/V). Over p across the whole window
this is retrieval by depth (distance N - span - p).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn as nn

FIRST_ORDINARY_ID = 16  # ids below are EOS / pad / chat specials in HyMo tokenizers: never in a needle


def needle_batches(filler_WT: np.ndarray, vocab_size: int, positions: list[int], span: int, trials: int,
                   seed: int = 0) -> dict[int | str, np.ndarray]:
    """Token windows per needle position (and "control"): each (trials, N), filler rows reused round-robin."""
    rng = np.random.default_rng(seed)
    W, N = filler_WT.shape
    needles = rng.integers(FIRST_ORDINARY_ID, vocab_size, size=(trials, span))
    rows = filler_WT[np.arange(trials) % W].copy()
    rows[:, N - span:] = needles
    batches: dict[int | str, np.ndarray] = {"control": rows.copy()}
    for p in positions:
        if not 0 <= p <= N - 2 * span:
            raise ValueError(f"needle position {p} leaves no room in a window of {N} for two copies of {span} tokens")
        placed = rows.copy()
        placed[:, p:p + span] = needles
        batches[p] = placed
    return batches


@torch.no_grad()
def copy_scores(model: nn.Module, tokens_TN: np.ndarray, span: int, device: torch.device) -> tuple[float, float]:
    """(top-1 accuracy, mean log-probability) of needle tokens 2..span at the window's final copy."""
    model.eval()
    x = torch.from_numpy(tokens_TN).to(device)
    logits, _ = model(x)
    N = x.shape[1]
    scored = logits[:, N - span:N - 1].float()  # positions whose next token is needle token 2..span
    targets = x[:, N - span + 1:]
    logprob = scored.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return float((scored.argmax(-1) == targets).float().mean()), float(logprob.mean())


def needle_positions(seq_len: int, span: int, points: int) -> list[int]:
    """`points` needle starts spread from the window's start to the last place two copies fit."""
    return sorted({int(round(v)) for v in np.linspace(0, seq_len - 2 * span, points)})


def needle_retrieval(model: nn.Module, filler_WT: np.ndarray, vocab_size: int, device: torch.device, span: int = 8,
                     points: int = 8, trials: int = 32, seed: int = 0) -> dict[str, Any]:
    """Per needle position its accuracy and `gain` (nats per token over the control: how much seeing the needle
    helps, which shows retrieval before top-1 accuracy does); the same trials for every model."""
    N = filler_WT.shape[1]
    positions = needle_positions(N, span, points)
    batches = needle_batches(filler_WT, vocab_size, positions, span, trials, seed)
    control_accuracy, control_logprob = copy_scores(model, batches["control"], span, device)
    rows = []
    for p in positions:
        accuracy, logprob = copy_scores(model, batches[p], span, device)
        rows.append({"position": p, "distance": N - span - p, "accuracy": accuracy, "gain": logprob - control_logprob})
    return {"span": span, "trials": trials, "window": N, "by_position": rows, "control": control_accuracy,
            "control_logprob": control_logprob}
