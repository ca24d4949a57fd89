"""Which training windows an update reads: the loader's order, computed without torch or the token files.

The training loader (hymo_core/train/data.py) cuts each train shard of n tokens into (n - 1) // T windows
starting at multiples of T, in shard order, and reads them in a permutation drawn from a private numpy
Generator seeded with (seed, epoch). An update reads the next batch_size x gradient_accumulation_steps
windows of that order (whatever the ranks and micro-batches), and an epoch turns between updates when
fewer windows are left. So update N's windows follow from the shard lengths and the recipe alone:
`hymo trace RUN --step N` names the documents behind a loss spike without loading the model or the tokens.
(Not followed: a non-finite loss skipped in a single process stops reading that update's later
micro-batches, which shifts every later update; `overfit_one_batch` reads one batch throughout.)
"""
from __future__ import annotations

import numpy as np


def window_table(shard_tokens: list[int], seq_len: int) -> np.ndarray:
    """(shard index, start offset) of every window of seq_len + 1 tokens, in shard order."""
    rows = []
    for index, tokens in enumerate(shard_tokens):
        count = max(0, (int(tokens) - 1) // seq_len)
        rows.append(np.stack([np.full(count, index, dtype=np.int64), np.arange(count, dtype=np.int64) * seq_len], axis=1))
    return np.concatenate(rows) if rows else np.zeros((0, 2), dtype=np.int64)


def window_permutation(seed: int, epoch: int, windows: int) -> np.ndarray:
    """The order the loader reads the split's windows in during `epoch`."""
    generator = np.random.Generator(np.random.PCG64([seed, epoch]))  # private: global RNGs untouched
    return generator.permutation(windows)


def update_windows(shard_tokens: list[int], seq_len: int, seed: int, update_windows_count: int, step: int) -> tuple[int, np.ndarray]:
    """(epoch, [(shard, start offset)] in reading order) of update `step` (1-based, as metrics.jsonl counts)."""
    table = window_table(shard_tokens, seq_len)
    per_epoch = len(table) // update_windows_count
    if step < 1:
        raise ValueError(f"update {step}: updates count from 1")
    if per_epoch == 0:
        raise ValueError(f"{len(table)} windows of {seq_len + 1} tokens, fewer than one update of {update_windows_count}")
    epoch, index = divmod(step - 1, per_epoch)
    order = window_permutation(seed, epoch, len(table))
    return epoch, table[order[index * update_windows_count:(index + 1) * update_windows_count]]
