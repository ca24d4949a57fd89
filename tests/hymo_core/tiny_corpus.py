"""Tiny corpora written directly with numpy (token shards + corpus.json), for trainer and checkpoint tests.

A helper module, not a conftest: a second conftest.py would shadow tests/conftest.py for `from conftest import ...`.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from hymo_core.data import _canonical_digest

TINY_VOCAB = 64


def write_corpus(root: Path, seed: int = 0, train_tokens: int = 6000, validation_tokens: int = 1200) -> Path:
    """A corpus of short repeated 'sentences' (so loss can fall) in one train and one validation shard."""
    rng = np.random.default_rng(seed)
    phrases = [rng.integers(1, TINY_VOCAB, size=rng.integers(4, 9)) for _ in range(12)]

    def stream(n: int) -> np.ndarray:
        out: list[int] = []
        while len(out) < n:
            out += [*phrases[int(rng.integers(len(phrases)))].tolist(), 0]
        return np.asarray(out[:n], dtype="<u2")

    (root / "tokens").mkdir(parents=True, exist_ok=True)
    shards = {}
    for split, n in (("train", train_tokens), ("validation", validation_tokens)):
        path = root / "tokens" / f"{split}-00000.bin"
        stream(n).tofile(path)
        shards[split] = [{"path": f"tokens/{split}-00000.bin", "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "tokens": n}]
    manifest = {"dtype": "uint16", "byte_order": "little", "eos_id": 0, "tokenizer": {"vocab_size": TINY_VOCAB}, "shards": shards}
    manifest["digest"] = _canonical_digest(manifest)
    (root / "corpus.json").write_text(json.dumps(manifest), encoding="utf-8")
    return root


@pytest.fixture
def tiny_corpus(tmp_path: Path) -> Path:
    return write_corpus(tmp_path / "corpus")
