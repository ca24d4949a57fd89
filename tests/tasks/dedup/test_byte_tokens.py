"""The byte-level tokens of a batch are `shingles.tokens` + xxh64, document for document, and skip Python where they can."""
from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest
import xxhash

from tasks.dedup import byte_tokens
from tasks.dedup.byte_tokens import batch_token_hashes, needs_python, utf8_buffers, xxh64_of_packed_tokens, xxh64_of_tokens
from tasks.dedup.shingles import TokenHashCache, tokens

EDGES = [
    "", " ", "...", "A", "Hello, World! It's 3.14 or 1,000,000.5 or 1.,2 or 1..2 or .5 or 5. or a1.2b",
    "3.14abc x9,5y 12:30 10.0.0.1 v2.3.4-rc1 1,2,3 ,1, .1. 007",  # numbers joined, cut and glued to words
    "9", "9.", ".9", "1.2", "x.1", "1.x", "ends with 4", "5 starts", "a 7.", "8 b", "c 6", ",4 d",  # joiners and digits at document edges
    "MiXeD CaSe ÀB", "curly “quotes” and – dashes — and … ellipses ‘1.5’", "non-breaking\u00a0space and\u2009thin",
    "Kelvin \u212a sign", "Turkish \u0130stanbul", "Arabic-Indic \u0663\u0664 digits 12", "fullwidth \uff11\uff12 and 12",
    "Thai baht \u0e3f 5", "CJK 中文 text 12", "かな", "Ελληνικά ΣΟΦΟΣ", "naïve café", "emoji 🙂 ok 🙂🙂", "tab\tnew\nline\rcr",
    "x" * 31 + " " + "y" * 32 + " " + "z" * 33 + " " + "w" * 64 + "7" * 40,  # xxh64's short path and its long one
    " ".join("t" * length for length in range(1, 41)), "control\x1c\x1dchars\x1e\x1f", "under_score snake_case",
    "ÉCOLE Ärger ÖL Übel straße STRASSE \u1e9e", "Москва ЖУРНАЛ ёж", "ΣΟΦΟΣ σοφός Σ ΣΑ", "é12.5 12é 1.5é é1,5é",  # letters, cases, numbers
    "Ǆungla ǅ ǆ", "ﬁne ﬂow", "x² + y³ ½", "cafe\u0301 combining", "हिन्दी भाषा", "עברית عربي", "Ωmega ωmega \u2126hm", "ʼapostrophe ꞌ",
]


def reference(texts: list[str], fold: bool) -> tuple[np.ndarray, np.ndarray]:
    doc_tokens = [tokens(text, fold) for text in texts]
    hashes = [xxhash.xxh64_intdigest(token.encode("utf-8")) for one in doc_tokens for token in one]
    return np.array(hashes, np.uint64), np.array([len(one) for one in doc_tokens], np.int64)


def assert_same(texts: list[str], fold: bool) -> None:
    hashes, per_doc = batch_token_hashes(pa.array(texts, pa.string()), fold, TokenHashCache())
    expected_hashes, expected_per_doc = reference(texts, fold)
    assert per_doc.tolist() == expected_per_doc.tolist()
    assert np.array_equal(hashes, expected_hashes)


@pytest.mark.parametrize("fold", [True, False])
def test_edge_texts_give_the_tokens_and_hashes_of_shingles_tokens(fold):
    assert_same(EDGES, fold)
    for text in EDGES:  # each alone: nothing before or after it in the batch
        assert_same([text], fold)


@pytest.mark.parametrize("fold", [True, False])
def test_random_texts_batched_together_match_document_by_document(fold):
    alphabet = list("aZ09.,  -\n_'") + ["é", "“", "—", "\u00a0", "K", "\u212a", "\u0663", "中", "\u0e3f", "🙂",
                                         "É", "ß", "\u1e9e", "Σ", "σ", "Ж", "²", "\u0301", "Ǆ", "İ", "ﬁ", "\U0001d400"]
    rng = random.Random(7)
    for _ in range(30):
        texts = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 60))) for _ in range(rng.randrange(1, 40))]
        assert_same(texts, fold)
        assert_same([t for t in texts if t.isascii()], fold)


def test_sliced_and_chunked_columns_read_their_own_bytes():
    column = pa.array(EDGES, pa.string())
    expected = reference(EDGES[3:9], True)
    for part in (column.slice(3, 6), pa.chunked_array([column.slice(3, 2), column.slice(5, 4)])):
        hashes, per_doc = batch_token_hashes(part, True, TokenHashCache())
        assert per_doc.tolist() == expected[1].tolist() and np.array_equal(hashes, expected[0])


def test_xxh64_of_tokens_is_xxhash_at_every_length():
    data = np.frombuffer(bytes(range(256)) * 2, np.uint8)
    starts = np.arange(0, 200, 3)
    lengths = np.arange(len(starts)) % 70
    hashes = xxh64_of_tokens(data, starts, lengths)
    assert hashes.tolist() == [xxhash.xxh64_intdigest(data[s: s + n].tobytes()) for s, n in zip(starts, lengths)]


def test_packed_tokens_hashed_once_per_distinct_token_are_xxhash_of_each():
    rng = np.random.default_rng(7)
    vocabulary = [bytes(rng.integers(0, 256, length, dtype=np.uint8)) for length in range(41)] + [b"the", b"cat", b"", b"\x00\x00"]
    tokens = [vocabulary[i] for i in rng.integers(0, len(vocabulary), 3000)]  # every word many times, every length 0..40
    data = np.frombuffer(b"".join(tokens), np.uint8)
    starts = np.cumsum([0] + [len(token) for token in tokens[:-1]])
    assert xxh64_of_packed_tokens(data, starts).tolist() == [xxhash.xxh64_intdigest(token) for token in tokens]
    assert xxh64_of_packed_tokens(np.zeros(0, np.uint8), np.zeros(0, np.int64)).tolist() == []


def test_a_batch_hashes_each_distinct_token_once(monkeypatch):
    """A shard's 580k tokens hold ~20k distinct ones: xxh64 runs on those, not on every occurrence."""
    hashed = []
    real = byte_tokens.xxh64_of_tokens
    monkeypatch.setattr(byte_tokens, "xxh64_of_tokens", lambda data, starts, lengths: hashed.append(len(starts)) or real(data, starts, lengths))
    texts = pa.array(["the cat sat on the mat " * 50, "The cat, the mat and 12 dogs.", "a mat"])
    hashes, per_doc = batch_token_hashes(texts, True, TokenHashCache())
    assert hashed == [len({"the", "cat", "sat", "on", "mat", "and", "0", "dogs", "a"})] and per_doc.tolist() == [300, 7, 2]
    assert hashes.tolist() == [xxhash.xxh64_intdigest(t.encode()) for text in texts.to_pylist() for t in tokens(text)]


def test_only_documents_with_a_character_outside_the_byte_rule_go_through_python_tokens(monkeypatch):
    """Letters whose lower case is one character of the same length stay in the byte rule (2.5 % of the bench's web
    documents, which cost as much through Python as the other 97.5 % in numpy); a space-less script, a decimal digit,
    a lower case of another length (Kelvin sign to k) or one that depends on the next character (Σ) do not."""
    texts = ["plain ascii 1.5", "curly “quotes” – dash", "naïve ÉTÉ", "Москва", "Kelvin \u212a", "digit \u0663", "baht \u0e3f",
             "ΣΟΦΟΣ", "ok…"]
    data, offsets = utf8_buffers(pa.array(texts))
    assert byte_tokens.non_ascii_classes(data, offsets)[0].tolist() == [False, False, False, False, True, True, True, True, False]
    assert needs_python(data, offsets).tolist() == [False, False, True, True, True, True, True, True, False]  # needs_python keeps its rule
    called = []
    monkeypatch.setattr(byte_tokens, "tokens", lambda text, fold: called.append(text) or tokens(text, fold))
    batch_token_hashes(pa.array(texts * 50), True, TokenHashCache())
    assert sorted(set(called)) == sorted(texts[4:8]) and len(called) == 4 * 50
