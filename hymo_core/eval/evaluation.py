"""Cloze / multiple-choice scoring and sampling from a trained checkpoint.

Cloze (seed 001, evaluation): each option is scored by the summed
log-probability of its *full continuation* given the context. The context's
tokens must be a prefix of the tokens of context + option, otherwise the
boundary merged into one BPE token and "the continuation" is ill-defined; such
items are scored on the separately encoded ids and counted as `boundary_merged`.
Raw accuracy (argmax of the sum) and length-normalised accuracy (argmax of the
mean per continuation token) are reported separately, each with its binomial
standard error sqrt(p (1 - p) / n), next to the chance level.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

SAMPLE_CLOZE = Path(__file__).resolve().parent / "cloze_sample.jsonl"


@dataclass(frozen=True)
class ClozeItem:
    id: str
    context: str
    options: tuple[str, ...]
    answer: int


def load_cloze(path: str | Path = SAMPLE_CLOZE) -> list[ClozeItem]:
    """JSON lines {"id", "context", "options": [...], "answer": index}; a bad line names file and line."""
    items = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            item = ClozeItem(str(row["id"]), row["context"], tuple(row["options"]), int(row["answer"]))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}:{number}: not a cloze item ({exc})") from exc
        if len(item.options) < 2 or not 0 <= item.answer < len(item.options):
            raise ValueError(f"{path}:{number}: needs >= 2 options and an answer index among them")
        items.append(item)
    return items


def load_tokenizer(path: str | Path):
    """The corpus tokenizer, encoding special-token text as text (as the shards stage did)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.encode_special_tokens = True
    return tokenizer


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


@torch.no_grad()
def continuation_logprob(model: nn.Module, context_ids: list[int], continuation_ids: list[int], device: torch.device) -> float:
    """sum_i log p(continuation_i | context, continuation_<i), keeping the last max_seq_len tokens."""
    ids = (context_ids + continuation_ids)[-(model.config.max_seq_len + 1):]
    n = len(continuation_ids)
    if n == 0 or len(ids) < 2:
        raise ValueError("empty continuation or nothing to condition on")
    tokens_1T = torch.tensor(ids[:-1], device=device).unsqueeze(0)
    targets_T = torch.tensor(ids[1:], device=device)
    logits_1TV, _ = model(tokens_1T)
    logprobs_TV = F.log_softmax(logits_1TV[0].float(), dim=-1)
    picked_T = logprobs_TV.gather(1, targets_T.unsqueeze(1)).squeeze(1)
    return float(picked_T[-n:].sum())


def split_ids(tokenizer, context: str, option: str) -> tuple[list[int], list[int], bool]:
    """(context ids, continuation ids, context was a token prefix of context + option)."""
    context_ids = encode(tokenizer, context)
    full_ids = encode(tokenizer, context + option)
    if full_ids[: len(context_ids)] == context_ids and len(full_ids) > len(context_ids):
        return context_ids, full_ids[len(context_ids):], True
    return context_ids, encode(tokenizer, option), False


def binomial_stderr(p: float, n: int) -> float:
    return math.sqrt(p * (1.0 - p) / n) if n else float("nan")


ContinuationScorer = Callable[[list[tuple[list[int], list[int]]]], list[float]]


def score_cloze(model: nn.Module, tokenizer, items: list[ClozeItem], device: torch.device | str = "cpu",
                scorer: ContinuationScorer | None = None) -> dict[str, Any]:
    """Raw and length-normalised accuracy with standard errors, chance level, and per-item choices.

    `scorer(pairs)`: the summed continuation log-probability of every (context ids, continuation
    ids) pair, in order; default one `continuation_logprob` after another (ranks split them:
    hymo_core.train.trainer.continuations_over_ranks).
    """
    device = torch.device(device)
    was_training = model.training
    model.eval()
    splits = [[split_ids(tokenizer, item.context, option) for option in item.options] for item in items]
    pairs = [(context_ids, cont_ids) for options in splits for context_ids, cont_ids, _ in options]
    try:
        totals = scorer(pairs) if scorer is not None else [continuation_logprob(model, c, o, device) for c, o in pairs]
    finally:
        model.train(was_training)
    raw_correct = norm_correct = merged = 0
    chance = 0.0
    per_item = []
    position = 0
    for item, options in zip(items, splits):
        sums = totals[position:position + len(options)]
        position += len(options)
        means = [total / len(cont_ids) for total, (_, cont_ids, _) in zip(sums, options)]
        merged += sum(not prefix_ok for _, _, prefix_ok in options)
        raw_pick = max(range(len(sums)), key=sums.__getitem__)
        norm_pick = max(range(len(means)), key=means.__getitem__)
        raw_correct += raw_pick == item.answer
        norm_correct += norm_pick == item.answer
        chance += 1.0 / len(item.options)
        per_item.append({"id": item.id, "answer": item.answer, "raw_pick": raw_pick, "norm_pick": norm_pick, "logprob_sums": sums})
    n = len(items)
    raw, norm = raw_correct / n, norm_correct / n
    return {
        "items": n, "accuracy": raw, "accuracy_stderr": binomial_stderr(raw, n),
        "accuracy_length_normalised": norm, "accuracy_length_normalised_stderr": binomial_stderr(norm, n),
        "chance": chance / n, "boundary_merged": merged, "per_item": per_item,
    }


@torch.no_grad()
def sample_tokens(model: nn.Module, ids: list[int], max_new_tokens: int, temperature: float, top_k: int,
                  generator: torch.Generator, eos_id: int | None = None, stop: Callable[[list[int]], bool] | None = None,
                  keep_on_slide: int | None = None) -> list[int]:
    """New token ids after `ids`, decoding through the model's per-layer caches; `stop(new)` true ends it.

    The prompt is prefilled once (its last max_seq_len tokens) and each new token costs one
    single-position step until the window is full. Then the window slides: `keep_on_slide` None
    re-prefills the last max_seq_len tokens for every later token, so each token sees exactly what
    a full recomputation sees; k re-prefills only the newest k tokens, once per max_seq_len - k new
    tokens, so a later token sees between k and max_seq_len tokens of context (an evaluation
    convention: about two positions per token instead of a window's).
    """
    device = generator.device  # the caller's device: the generator samples there
    limit = model.config.max_seq_len
    keep = limit if keep_on_slide is None else max(1, min(int(keep_on_slide), limit))
    new: list[int] = []
    cache = None
    for _ in range(max_new_tokens):
        if cache is None or cache.position >= limit:
            fed = (ids + new)[-(limit if cache is None else keep):]
            cache = model.new_cache(1, device)
        else:
            fed = new[-1:]
        logits_1TV, _ = model(torch.tensor(fed, device=device).unsqueeze(0), cache=cache)
        logits_V = logits_1TV[0, -1].float()
        if temperature <= 0:
            token = int(logits_V.argmax())
        else:
            logits_V = logits_V / temperature
            if top_k:
                kth = torch.topk(logits_V, min(top_k, logits_V.numel())).values[-1]
                logits_V = logits_V.masked_fill(logits_V < kth, float("-inf"))
            token = int(torch.multinomial(F.softmax(logits_V, dim=-1), 1, generator=generator))
        if eos_id is not None and token == eos_id:
            break
        new.append(token)
        if stop is not None and stop(new):
            break
    return new


@torch.no_grad()
def generate(model: nn.Module, tokenizer, prompt: str, max_new_tokens: int = 64, temperature: float = 0.8,
             top_k: int = 50, seed: int = 0, device: torch.device | str = "cpu", eos_id: int | None = None) -> str:
    """Sample a continuation (temperature + top-k) with a private generator; returns the decoded new text."""
    device = torch.device(device)
    generator = torch.Generator(device=device).manual_seed(seed)
    ids = encode(tokenizer, prompt) or [eos_id if eos_id is not None else 0]
    was_training = model.training
    model.eval()
    try:
        new = sample_tokens(model, ids, max_new_tokens, temperature, top_k, generator, eos_id)
    finally:
        model.train(was_training)
    return tokenizer.decode(new)
