"""Exact dedup's keys of a batch, from its bytes, are `normalise`'s, and only a few documents need `normalise` itself."""
from __future__ import annotations

import hashlib
import random

import numpy as np
import pyarrow as pa
import pytest

from tasks.dedup import byte_keys
from tasks.dedup.byte_keys import batch_key_digests, batch_key_texts, byte_rule_keys, key_rule_holds
from tasks.dedup.byte_tokens import needs_python, utf8_buffers
from tasks.dedup.shingles import normalise

EDGES = ["", " ", "  \t\n ", "a", " a", "a ", "  a  b  ", "The Same Text\n\nhere", "THE SAME TEXT HERE", "tab\tsep\x0bvt\x0cff\rcr",
         "file\x1cgroup\x1drecord\x1eunit\x1fsep", "non-breaking\u00a0space", "thin\u2009space", "ideographic\u3000space",
         "next line\x85here", "line\u2028separator", "Ünïcödé Uppercase", "ünïcödé lowercase", "Kelvin \u212a", "İstanbul",
         "ΣΟΦΟΣ σοφος", "curly “quotes” — dash …", "中文 文本  ", "emoji 🙂\t🙂 ", "\x00nul and \x7f del", "ends with tabs\t\t"]


def keys_of(texts: list[str]) -> list[bytes]:
    data, offsets = utf8_buffers(pa.array(texts, pa.string()))
    skip = needs_python(data, offsets, key_rule_holds)
    key, key_offsets = byte_rule_keys(data, offsets, skip)
    return [None if skip[i] else key[key_offsets[i]: key_offsets[i + 1]].tobytes() for i in range(len(texts))]


def check(texts: list[str]) -> None:
    for text, key in zip(texts, keys_of(texts)):
        if key is not None:
            assert key == normalise(text).encode("utf-8"), repr(text)
    digests, lengths = batch_key_digests(pa.array(texts, pa.string()))
    expected = [normalise(text).encode("utf-8") for text in texts]
    assert digests == [hashlib.sha1(key).digest() for key in expected] and lengths == [len(key) for key in expected]


def test_edge_texts_have_the_keys_of_normalise_alone_and_together():
    check(EDGES)
    for text in EDGES:
        check([text])


def test_random_texts_have_the_keys_of_normalise():
    alphabet = list("aZ0 .\t\n\r\x0b\x0c\x1c\x1f") + ["é", "É", "\u00a0", "\u3000", "中", "“", "\x85", "🙂"]
    rng = random.Random(5)
    for _ in range(40):
        check(["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40))) for _ in range(rng.randrange(1, 30))])


@pytest.mark.parametrize("normalised", [True, False])
def test_a_sliced_column_reads_its_own_bytes(normalised):
    column = pa.array(EDGES, pa.string()).slice(5, 9)
    digests, lengths = batch_key_digests(column, normalised)
    expected = [(normalise(text) if normalised else text).encode("utf-8") for text in EDGES[5:14]]
    assert digests == [hashlib.sha1(key).digest() for key in expected] and lengths == [len(key) for key in expected]


def test_only_documents_with_a_non_ascii_capital_or_space_go_through_normalise(monkeypatch):
    texts = ["plain Text", "curly “quotes” – é 中", "Ünïcödé", "no-break\u00a0space", "ideographic\u3000space", "lower ünï"]
    called = []
    monkeypatch.setattr(byte_keys, "normalise", lambda text: called.append(text) or normalise(text))
    digests, _ = batch_key_digests(pa.array(texts * 20))
    assert sorted(set(called)) == sorted(texts[2:5]) and len(called) == 3 * 20
    assert digests[:6] == [hashlib.sha1(normalise(text).encode("utf-8")).digest() for text in texts]
    assert np.array_equal(needs_python(*utf8_buffers(pa.array(texts)), key_rule_holds), [False, False, True, True, True, False])


@pytest.mark.parametrize("normalised", [True, False])
def test_key_texts_are_normalise_in_order_with_the_python_documents_in_place(normalised):
    texts = EDGES + ["Ünïcödé first"] + EDGES[::-1] + ["last\u00a0one"]
    keys = batch_key_texts(pa.chunked_array([pa.array(texts[:10]), pa.array(texts[10:])]), normalised)
    assert keys.type == pa.string() and keys.to_pylist() == [normalise(text) if normalised else text for text in texts]
