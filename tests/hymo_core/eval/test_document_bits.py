"""Per-document bits: the same numbers as a direct forward over the document, window by window."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from hymo_core.eval.document_bits import HeldOutDocument, document_bits, group_summary
from hymo_core.models.model import ModelConfig, Transformer


class CharTokenizer:
    """One id per character (ids 1..): enough to check windows and byte counts."""

    def encode(self, text, add_special_tokens=False):
        return type("Encoding", (), {"ids": [1 + (ord(c) % 60) for c in text]})()


def direct_bits(model, ids: list[int], seq_len: int) -> float:
    total = 0.0
    for start in range(0, len(ids) - 1, seq_len):
        window = torch.tensor([ids[start:start + seq_len + 1]])
        logits, _ = model(window[:, :-1])
        total += F.cross_entropy(logits[0], window[0, 1:], reduction="sum").item() / math.log(2)
    return total


def test_bits_match_a_direct_forward_over_each_window():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, ffn_dim=64, max_seq_len=8)).eval()
    documents = [HeldOutDocument("a-1", "short one", "a", "en"), HeldOutDocument("b-1", "a document longer than two windows é", "b", "fr")]
    rows = document_bits(model, CharTokenizer(), 0, documents, seq_len=8, batch_size=3)
    tokenizer = CharTokenizer()
    for row, document in zip(rows, documents):
        ids = [0] + tokenizer.encode(document.text).ids
        assert row["tokens"] == len(ids) - 1 and row["bytes"] == len(document.text.encode("utf-8"))
        assert row["bits"] == pytest.approx(direct_bits(model, ids, 8), rel=1e-5)
    summary = group_summary(rows)
    assert list(summary)[0] == "all" and summary["all"]["documents"] == 2
    assert summary["source:b"]["bpb"] == pytest.approx(rows[1]["bits"] / rows[1]["bytes"])
    assert summary["all"]["bpb"] == pytest.approx(sum(r["bits"] for r in rows) / sum(r["bytes"] for r in rows))
