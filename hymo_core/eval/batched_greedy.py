"""Greedy decoding of many prompts at once, token for token what `evaluation.sample_tokens` gives each alone.

Why: a small model's decode step is mostly per-op dispatch, paid once per step for the whole batch
(on the sample model a step for 32 rows costs a few times one row's, not 32 times).

The scheme is exact and pads nothing:

* The batch cache is per row (`model.new_cache(B, per_row=True)`): row b's new token sits at b's own
  position, is rotated by that position's RoPE angle and attends to b's keys 0 .. position only
  (attention and MLA mask the rest of the preallocated cache); GDN's recurrent state and short-conv
  tail are per row anyway. So ragged prompts need neither left padding nor no-op pad steps.
* Every token comes out of one batched single-token step. A row whose window must be (re)built
  first has that window's tokens but the last prefilled on a fresh one-sequence-per-row cache, and
  the last goes through the step. The window is sample_tokens's: the prompt's last max_seq_len
  tokens at the start, and once the row's position reaches max_seq_len (per row, whenever that
  happens), its newest `keep_on_slide` tokens (None: max_seq_len, the exact slide). Rows that
  (re)fill the same number of tokens in a step share one prefill forward, so nothing is padded.
* Rows stop on their own (EOS, their stop predicate, their max_new_tokens): a finished row leaves
  the batch and the next waiting prompt takes its slot; prompts are taken by length, so those
  that start together prefill together.

Each token is computed from exactly the context the one-at-a-time decoder uses, by the same layers
(a cached single-token step equals the full forward, the decode caches' contract); only float
summation order differs (batched matmuls, a masked softmax over more key slots, GDN's
recurrent step for a prompt's last token instead of the chunked pass), well under the decode-cache
tests' 1e-5 on fp32 logits, so the greedy tokens are the same (in bf16 the same reordering is
~1e-2 and could flip a near tie). Exception: MoE with a capacity factor drops tokens depending on
how many share a forward, so such a model decodes one prompt at a time.

Memory: `batch_size` rows of decode cache (max_seq_len positions each) and, per prefill forward,
at most FILL_TOKENS positions of logits.
"""
from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
import torch.nn as nn

from hymo_core.eval.evaluation import sample_tokens

BATCH_SIZE = 64  # rows decoded together (as score_requests's 64 sequences per forward)
FILL_TOKENS = 16384  # positions of one prefill forward (its logits are FILL_TOKENS x vocab)

Stop = Callable[[list[int]], bool]


@dataclass
class _Row:
    index: int  # into the prompts
    ids: list[int]
    max_new_tokens: int
    stop: Stop | None
    new: list[int] = field(default_factory=list)
    steps: int = 0
    started: bool = False  # has a window in the cache


def drops_tokens(model: nn.Module) -> bool:
    """Whether a forward's output depends on what else is in it: MoE capacity dropping."""
    return any(moe.config.capacity_factor > 0 for _, moe in getattr(model, "moe_layers", list)())


@torch.no_grad()
def greedy_tokens_batched(model: nn.Module, prompts: Sequence[list[int]], max_new_tokens: Sequence[int], eos_id: int | None,
                          stops: Sequence[Stop | None], keep_on_slide: int | None = None, batch_size: int = BATCH_SIZE,
                          device: torch.device | str = "cpu") -> list[list[int]]:
    """For each (non-empty) prompt, the new ids `sample_tokens(model, prompt, n, 0.0, 0, ..., eos_id, stop, keep_on_slide)` gives."""
    device = torch.device(device)
    if not len(prompts) == len(max_new_tokens) == len(stops):
        raise ValueError("one max_new_tokens and one stop per prompt")
    if any(not ids for ids in prompts):
        raise ValueError("an empty prompt: give at least one token (e.g. EOS) to condition on")
    if drops_tokens(model):
        return [sample_tokens(model, list(ids), n, 0.0, 0, torch.Generator(device=device), eos_id, stop, keep_on_slide)
                for ids, n, stop in zip(prompts, max_new_tokens, stops)]
    limit = model.config.max_seq_len
    keep = limit if keep_on_slide is None else max(1, min(int(keep_on_slide), limit))
    results: list[list[int]] = [[] for _ in prompts]
    waiting = deque(sorted((i for i, n in enumerate(max_new_tokens) if n > 0), key=lambda i: (min(len(prompts[i]), limit), i)))
    slots: list[_Row | None] = [None] * min(max(1, int(batch_size)), len(waiting))
    cache = model.new_cache(len(slots), device, per_row=True)
    while True:
        for s, row in enumerate(slots):
            if row is None and waiting:
                i = waiting.popleft()
                slots[s] = _Row(i, list(prompts[i]), int(max_new_tokens[i]), stops[i])
        live = [s for s, row in enumerate(slots) if row is not None]
        if not live:
            return results
        if len(live) < len(slots):  # nothing waits for the free slots: drop them
            cache.keep_rows(live)
            slots = [slots[s] for s in live]
        rows: list[_Row] = slots  # type: ignore[assignment]
        inputs = _refill(model, cache, rows, limit, keep, device)
        logits_BV = model(torch.tensor(inputs, device=device)[:, None], cache=cache)[0][:, 0]
        for s, (row, token) in enumerate(zip(rows, logits_BV.float().argmax(dim=-1).tolist())):
            row.steps += 1
            finished = eos_id is not None and token == eos_id
            if not finished:
                row.new.append(token)
                finished = row.stop is not None and row.stop(row.new)
            if finished or row.steps >= row.max_new_tokens:
                results[row.index] = row.new
                slots[s] = None


def _refill(model: nn.Module, cache, rows: list[_Row], limit: int, keep: int, device: torch.device) -> list[int]:
    """(Re)build the window of each row that needs one (all its tokens but the last prefilled into its cache row),
    grouped by length; the token each row feeds to this step."""
    inputs, fills = [], defaultdict(list)
    for s, row in enumerate(rows):
        if row.started and cache.row_positions[s] < limit:
            inputs.append(row.new[-1])
            continue
        fed = (row.ids + row.new)[-(keep if row.started else limit):]
        row.started = True
        fills[len(fed) - 1].append((s, fed[:-1]))
        inputs.append(fed[-1])
    for length, group in fills.items():
        per_forward = max(1, FILL_TOKENS // max(1, length))
        for start in range(0, len(group), per_forward):
            chunk = group[start:start + per_forward]
            fresh = model.new_cache(len(chunk), device)
            if length:
                model(torch.tensor([ids for _, ids in chunk], device=device), cache=fresh)
            cache.write_rows([s for s, _ in chunk], fresh)
    return inputs
