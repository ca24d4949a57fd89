"""The held-out rule itself, shared by the distributed plan and the in-memory reference: the seeded order and where it stops.

Per source, families are taken in `seeded_rank` order (ties by family id)
while the documents (or estimated tokens) taken *before* a family are short of
the target or of the minimum document count; the first family past both ends
the choice. Both quantities grow along the order, so the choice is a prefix,
and a planner that knows the running totals where a rank range starts can
decide that range alone.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SplitConfig:
    # Seed 001 Lab 2 holds out ~5% (1,000 of 21,990 stories) before fitting BPE.
    validation_fraction: float = 0.05  # of each source's documents
    # Alternative budget per source, in estimated tokens (UTF-8 bytes / bytes_per_token_estimate):
    # the tokenizer does not exist yet, so the budget can only be an estimate.
    validation_tokens_per_source: int | None = None
    bytes_per_token_estimate: float = 4.0
    min_validation_docs_per_source: int = 1  # a source with >= 2 families always gets held-out loss
    seed: int = 0


def seeded_rank(seed: int, key: str) -> str:
    """A stable pseudo-random order: independent of shard layout and input order."""
    return hashlib.blake2b(f"{seed}\x00{key}".encode("utf-8"), digest_size=8).hexdigest()


def taken_before_stop(docs_before: np.ndarray, bytes_before: np.ndarray, source_docs: int, config: SplitConfig) -> int:
    """How many families, in order, are held out: the index of the first whose running totals before it
    (documents, UTF-8 bytes) reach the budget and the minimum, or all of them when none does."""
    docs_before = np.asarray(docs_before, dtype=np.int64)
    if config.validation_tokens_per_source is not None:
        reached = np.asarray(bytes_before, dtype=np.int64) / config.bytes_per_token_estimate >= config.validation_tokens_per_source
    else:
        reached = docs_before >= config.validation_fraction * np.int64(source_docs)
    done = reached & (docs_before >= config.min_validation_docs_per_source)
    return int(np.argmax(done)) if done.any() else len(docs_before)
