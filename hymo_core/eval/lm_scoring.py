"""What a benchmark asks of a language model: log-likelihoods of continuations, and greedy text.

Log-likelihood requests are (context ids, continuation ids). They are scored in
batches: each sequence is context + continuation cut to the model's window
(the *context* loses its oldest tokens first; a continuation longer than the
window keeps its last window - 1 tokens and is flagged), right-padded, and the
continuation's target positions are gathered. Right padding is exact for a
causal model: no real position attends to a pad. Requests are sorted by length
inside the scorer and answered in the caller's order, so batching never
changes a number (up to float summation order within one forward).

Greedy generation is lm-evaluation-harness's `generate_until`: argmax each
step (the trainer's own cached decoder, `evaluation.sample_tokens`), stop at
EOS, at `max_new_tokens`, or as soon as the decoded text contains a stop
string (the text is cut before it). A generation that outgrows the model's
window slides it by half (`WINDOW_SLIDE`): the newest half window is
prefilled again once per half window of new tokens, not the whole window once
per token; eval.json names the convention and counts the generations it touched.
`generate_until_batched` decodes many requests together (one step per token
for the whole batch, `batched_greedy`) and gives each the same tokens as
`generate_until` alone: each row keeps its own positions, window and slide.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from hymo_core.eval.batched_greedy import BATCH_SIZE as GENERATION_BATCH, greedy_tokens_batched
from hymo_core.eval.evaluation import sample_tokens


WINDOW_SLIDE = "half"  # what a full window keeps when a generation outgrows it: the newest max_seq_len // 2 tokens


@dataclass(frozen=True)
class Request:
    context_ids: tuple[int, ...]
    continuation_ids: tuple[int, ...]


@dataclass(frozen=True)
class Scored:
    logprob: float  # sum over the continuation's scored tokens
    tokens: int  # continuation tokens scored
    greedy: bool  # every continuation token was the argmax (lm-eval's is_greedy)
    truncated: bool  # the continuation alone did not fit the window
    context_truncated: bool = False  # the context lost its oldest tokens to fit the window


def _window(request: Request, max_seq_len: int) -> tuple[list[int], int, bool]:
    """(input+target ids, continuation tokens scored, continuation truncated) within max_seq_len + 1 ids.

    The context is cut (oldest tokens first) when len(context) + len(continuation) > max_seq_len + 1."""
    cont = list(request.continuation_ids)
    if not cont:
        raise ValueError("empty continuation: nothing to score")
    truncated = len(cont) > max_seq_len
    if truncated:
        return cont[-(max_seq_len + 1):], max_seq_len, True
    ids = (list(request.context_ids) + cont)[-(max_seq_len + 1):]
    if len(ids) == len(cont):  # no context at all: the first continuation token has nothing to condition on
        return ids, len(cont) - 1, False
    return ids, len(cont), False


@torch.no_grad()
def score_requests(model: nn.Module, requests: list[Request], device: torch.device | str = "cpu", batch_size: int = 64) -> list[Scored]:
    """Summed log-probability of each continuation given its context, in the order given."""
    device = torch.device(device)
    max_seq_len = model.config.max_seq_len
    windows = [_window(r, max_seq_len) for r in requests]
    order = sorted(range(len(requests)), key=lambda i: -len(windows[i][0]))
    results: list[Scored | None] = [None] * len(requests)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            T = max(len(windows[i][0]) for i in chunk) - 1
            tokens_BT = torch.zeros(len(chunk), T, dtype=torch.long)
            for row, i in enumerate(chunk):
                ids = windows[i][0][:-1]
                tokens_BT[row, :len(ids)] = torch.tensor(ids)
            logits_BTV, _ = model(tokens_BT.to(device))
            # Only continuation positions are normalised: log-softmax over N x V, not B x T x V.
            rows, cols, targets, counts = [], [], [], []
            for row, i in enumerate(chunk):
                ids, scored, _ = windows[i]
                length = len(ids) - 1
                rows += [row] * scored
                cols += range(length - scored, length)
                targets += ids[length + 1 - scored:]
                counts.append(scored)
            logprobs_NV = F.log_softmax(logits_BTV[torch.tensor(rows, dtype=torch.long), torch.tensor(cols, dtype=torch.long)].float(), dim=-1)
            targets_N = torch.tensor(targets, dtype=torch.long, device=logprobs_NV.device)
            picked_N = logprobs_NV.gather(1, targets_N.unsqueeze(1)).squeeze(1).cpu()
            greedy_N = (logprobs_NV.argmax(dim=-1) == targets_N).cpu()
            start_n = 0
            for i, scored in zip(chunk, counts):
                piece = slice(start_n, start_n + scored)
                request = requests[i]
                context_cut = len(request.context_ids) + len(request.continuation_ids) > max_seq_len + 1
                results[i] = Scored(float(picked_N[piece].sum()), scored, bool(greedy_N[piece].all()), windows[i][2], context_cut)
                start_n += scored
    finally:
        model.train(was_training)
    return results  # type: ignore[return-value]


@dataclass(frozen=True)
class Generation:
    text: str  # cut before the first stop string
    new_tokens: int  # tokens generated (the stop string's included)
    prompt_truncated: bool  # the prompt alone was longer than the window: its oldest tokens were not seen
    window_slid: bool  # prompt + generation outgrew the window, so later tokens saw a cut prompt


def greedy_until(model: nn.Module, tokenizer, prompt_ids: list[int], stop: tuple[str, ...], max_new_tokens: int,
                 eos_id: int | None, device: torch.device | str = "cpu") -> str:
    """Greedy continuation of `prompt_ids` (through the model's decode caches), cut before the first stop string."""
    return generate_until(model, tokenizer, prompt_ids, stop, max_new_tokens, eos_id, device).text


def _prompt(prompt_ids, eos_id: int | None) -> list[int]:
    return list(prompt_ids) or [eos_id if eos_id is not None else 0]


def _stop_check(tokenizer, stop: tuple[str, ...]):
    """True once the new tokens' text contains a stop string (None: no stop strings).

    A stop string first appears when the token holding its last byte arrives, so it lies within the
    last len(bytes) tokens (every token is at least one byte): only that tail is decoded at each step."""
    tail = max((len(s.encode("utf-8")) for s in stop), default=0)
    return (lambda new: any(s in tokenizer.decode(new[-tail:]) for s in stop)) if tail else None


def _generation(tokenizer, ids: list[int], new: list[int], stop: tuple[str, ...], limit: int) -> Generation:
    text = tokenizer.decode(new)
    cut = min((text.find(s) for s in stop if s in text), default=-1)
    return Generation(text[:cut] if cut >= 0 else text, len(new), len(ids) > limit, len(ids) + len(new) > limit)


def _slide(model: nn.Module) -> int:
    return max(1, model.config.max_seq_len // 2)  # WINDOW_SLIDE


@torch.no_grad()
def generate_until(model: nn.Module, tokenizer, prompt_ids: list[int], stop: tuple[str, ...], max_new_tokens: int,
                   eos_id: int | None, device: torch.device | str = "cpu") -> Generation:
    """`greedy_until` with what eval.json records about it: tokens generated and whether the window cut anything.

    One prompt at a time (`evaluation.sample_tokens`); `generate_until_batched` gives the same for many at once."""
    device = torch.device(device)
    ids = _prompt(prompt_ids, eos_id)
    was_training = model.training
    model.eval()
    try:
        new = sample_tokens(model, ids, max_new_tokens, 0.0, 0, torch.Generator(device=device), eos_id,
                            stop=_stop_check(tokenizer, stop), keep_on_slide=_slide(model))
    finally:
        model.train(was_training)
    return _generation(tokenizer, ids, new, stop, model.config.max_seq_len)


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: tuple[int, ...]
    stop: tuple[str, ...]
    max_new_tokens: int


@torch.no_grad()
def generate_until_batched(model: nn.Module, tokenizer, requests: list[GenerationRequest], eos_id: int | None,
                           device: torch.device | str = "cpu", batch_size: int = GENERATION_BATCH) -> list[Generation]:
    """`generate_until` of every request, `batch_size` rows decoded together (hymo_core/eval/batched_greedy.py):
    each Generation is token for token the one `generate_until` gives that request alone, in the order given."""
    if not requests:
        return []
    device = torch.device(device)
    prompts = [_prompt(r.prompt_ids, eos_id) for r in requests]
    was_training = model.training
    model.eval()
    try:
        news = greedy_tokens_batched(model, prompts, [r.max_new_tokens for r in requests], eos_id,
                                     [_stop_check(tokenizer, r.stop) for r in requests], _slide(model), batch_size, device)
    finally:
        model.train(was_training)
    return [_generation(tokenizer, ids, new, r.stop, model.config.max_seq_len) for ids, new, r in zip(prompts, news, requests)]
