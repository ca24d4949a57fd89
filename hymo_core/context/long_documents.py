"""The data plan of a context extension: training windows cut from documents at least as long as the window.

The shards pack documents end to end with EOS between them, so an ordinary window of N tokens is
mostly several short documents, which teaches nothing about long-range dependencies. Here a
document is a run of tokens between EOS tokens; a window of N + 1 tokens is taken only inside a
document that holds it (stride N, like the ordinary loader), so packed short documents never count.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from hymo_core.train.data import CorpusError, CorpusReader, TokenLoader


def document_spans(tokens: np.ndarray, eos_id: int) -> np.ndarray:
    """(start, length) of every EOS-delimited document in a shard (the EOS itself excluded)."""
    eos = np.flatnonzero(np.asarray(tokens) == eos_id)
    ends = np.concatenate([eos, [len(tokens)]])
    starts = np.concatenate([[0], eos + 1])
    return np.stack([starts, ends - starts], axis=1).astype(np.int64)


def long_document_windows(reader: CorpusReader, split: str, seq_len: int) -> tuple[list[np.memmap], np.ndarray, dict[str, int]]:
    """(shards, (shard, offset) windows of seq_len + 1 tokens inside long documents, counts)."""
    shards = reader.open_all(split)
    rows, counts = [], {"documents": 0, "long_documents": 0, "tokens_in_long_documents": 0}
    for index, tokens in enumerate(shards):
        spans = document_spans(tokens, reader.eos_id)
        counts["documents"] += int((spans[:, 1] > 0).sum())
        for start, length in spans[spans[:, 1] >= seq_len + 1]:
            count = (length - 1) // seq_len
            rows.append(np.stack([np.full(count, index), start + np.arange(count) * seq_len], axis=1))
            counts["long_documents"] += 1
            counts["tokens_in_long_documents"] += int(length)
    windows = np.concatenate(rows).astype(np.int64) if rows else np.zeros((0, 2), np.int64)
    counts["windows"] = len(windows)
    return shards, windows, counts


class LongDocumentLoader(TokenLoader):
    """TokenLoader's shuffled epochs and checkpointable cursor over long-document windows only."""

    def __init__(self, corpus: CorpusReader, split: str = "train", seq_len: int = 1024, batch_size: int = 8, seed: int = 0):
        if seq_len < 1 or batch_size < 1:
            raise ValueError(f"seq_len and batch_size must be >= 1, got {seq_len}, {batch_size}")
        self.corpus, self.split, self.seq_len, self.batch_size, self.seed = corpus, split, seq_len, batch_size, seed
        self.rank, self.world_size, self.step_windows = 0, 1, batch_size
        self.shards, self.windows, self.counts = long_document_windows(corpus, split, seq_len)
        if len(self.windows) < batch_size:
            raise CorpusError(f"{corpus.path}: {split} has {len(self.windows)} windows of {seq_len + 1} tokens inside documents "
                              f"that long ({self.counts['long_documents']} of {self.counts['documents']} documents), fewer than "
                              f"one batch of {batch_size}")
        self.epoch, self.position = 0, 0
        self._order = self._permutation(0)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "kind": "long_documents"}
