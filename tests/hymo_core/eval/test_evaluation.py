"""Cloze scoring: summed continuation log-probability, the prefix check, raw vs length-normalised, standard error."""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from hymo_core.eval.evaluation import (SAMPLE_CLOZE, ClozeItem, binomial_stderr, continuation_logprob, generate, load_cloze,
                                  score_cloze, split_ids)
from hymo_core.models.model import DecodeCache

V = 8


class CharTokenizer:
    """One id per character 'a'..'h'; `merge` turns 'ab' into one token 'h' to break the prefix property."""

    def __init__(self, merge: bool = False):
        self.merge = merge

    def encode(self, text: str, add_special_tokens: bool = False):
        text = text.replace("ab", "h") if self.merge else text
        return SimpleNamespace(ids=[ord(c) - ord("a") for c in text])

    def decode(self, ids):
        return "".join(chr(ord("a") + i) for i in ids)


class Preferring(nn.Module):
    """Logits independent of the input: log-probabilities `table` at every position."""

    def __init__(self, table: list[float]):
        super().__init__()
        self.config = SimpleNamespace(max_seq_len=32)
        self.table = torch.tensor(table).log()  # log-probabilities as logits

    def new_cache(self, batch_size, device=None):
        return DecodeCache([])

    def forward(self, tokens, targets=None, cache=None):
        if cache is not None:
            cache.position += tokens.shape[1]
        return self.table.expand(*tokens.shape, V).clone(), None


def test_continuation_logprob_sums_only_the_continuation():
    table = [0.5, 0.2, 0.1, 0.1, 0.05, 0.03, 0.01, 0.01]
    model = Preferring(table)
    got = continuation_logprob(model, [0, 1, 2], [1, 0], torch.device("cpu"))
    assert got == pytest.approx(math.log(0.2) + math.log(0.5), abs=1e-6)


def test_raw_and_length_normalised_differ_and_are_reported_separately():
    # 'a' has p=0.5 and 'c' p=0.3: the long option 'aaa' has the lower sum but the higher mean.
    model = Preferring([0.5, 0.05, 0.3, 0.05, 0.05, 0.02, 0.02, 0.01])
    items = [ClozeItem("x", "d", ("aaa", "c"), answer=0)]
    result = score_cloze(model, CharTokenizer(), items)
    assert result["per_item"][0]["raw_pick"] == 1 and result["per_item"][0]["norm_pick"] == 0
    assert result["accuracy"] == 0.0 and result["accuracy_length_normalised"] == 1.0
    assert result["chance"] == 0.5 and result["boundary_merged"] == 0


def test_prefix_check_detects_a_merged_boundary():
    context_ids, cont_ids, ok = split_ids(CharTokenizer(merge=True), "ca", "bd")
    assert not ok and context_ids == [2, 0] and cont_ids == [1, 3]  # scored on separately encoded ids
    _, cont_ids, ok = split_ids(CharTokenizer(merge=True), "cd", "bd")
    assert ok and cont_ids == [1, 3]


def test_binomial_standard_error():
    assert binomial_stderr(0.5, 100) == pytest.approx(0.05)
    assert binomial_stderr(1.0, 10) == 0.0


def test_bundled_cloze_set_loads_and_bad_lines_name_their_place(tmp_path):
    items = load_cloze(SAMPLE_CLOZE)
    assert len(items) == 40 and len({i.answer for i in items}) > 1 and all(len(i.options) == 4 for i in items)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "a", "context": "x", "options": ["y"], "answer": 0}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_cloze(bad)


def test_generate_is_seeded_and_stops_at_eos():
    model = Preferring([0.05, 0.05, 0.3, 0.3, 0.2, 0.05, 0.04, 0.01])
    first = generate(model, CharTokenizer(), "ab", max_new_tokens=6, seed=3)
    assert first == generate(model, CharTokenizer(), "ab", max_new_tokens=6, seed=3) and len(first) == 6
    greedy_to_eos = generate(Preferring([0.9] + [0.1 / 7] * 7), CharTokenizer(), "ab", temperature=0, eos_id=0)
    assert greedy_to_eos == ""
