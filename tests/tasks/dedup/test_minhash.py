from __future__ import annotations

import numpy as np
import pytest

from tasks.dedup.minhash import (ChecksumMismatch, HashFamily, UnionFind, band_keys, candidate_probability, read_checked_array,
                           signatures, write_checked_array)
from tasks.dedup.shingles import (NUMBER, WORD, TokenHashCache, batch_ngram_hashes, jaccard_of_sets, ngram_hashes, sorted_set,
                                  tokens)


def test_tokens_fold_numbers_and_split_spaceless_scripts():
    assert tokens("Page 12, v3.5 — Café!") == ["page", "0", "v0", "café"]
    assert tokens("Page 12", fold_numbers=False) == ["page", "12"]
    assert tokens("我爱Python编程") == ["我", "爱", "python", "编", "程"]


def test_tokens_take_the_ascii_path_only_when_the_words_are_the_regexs():
    """Texts whose only non-ASCII characters are punctuation go through the ASCII path; the words must be what the
    word regex finds, for every mix (digits such as '²' and '½' are word characters, as are letters like 'é')."""
    rng = np.random.default_rng(7)
    alphabet = list("abcXYZ019 .,-_'!?\n\t") + ["\u2019", "\u201c", "\u2014", "\u2026", "\u00a0", "\u00e9", "\u00df", "\u00b2",
                                                   "\u00bd", "\u0301", "\u0663", "\u00b7"]
    for _ in range(2000):
        text = "".join(rng.choice(alphabet, size=int(rng.integers(0, 40))))
        folded = NUMBER.sub("0", text.lower()) if any(d in text for d in "0123456789") else text.lower()  # as tokens() folds
        assert tokens(text) == WORD.findall(folded), repr(text)
        assert tokens(text, fold_numbers=False) == WORD.findall(text.lower()), repr(text)


def test_batch_ngram_hashes_match_per_document_hashes_and_skip_short_documents():
    cache = TokenHashCache()
    docs = [tokens("a b c d e f g"), tokens("x y"), tokens("a b c d e")]
    hashes, offsets = batch_ngram_hashes(docs, 5, cache)
    assert offsets.tolist() == [0, 3, 3, 4]
    first = ngram_hashes(np.array([cache[t] for t in docs[0]], dtype=np.uint64), 5)
    assert hashes[:3].tolist() == first.tolist() and hashes[3] == hashes[0]  # same 5-gram, same hash


def test_batch_ngram_hashes_keep_exactly_each_documents_own_windows_at_any_lengths():
    rng = np.random.default_rng(11)
    cache = TokenHashCache()
    for n in (1, 2, 5, 13):
        docs = [[f"w{t}" for t in rng.integers(0, 30, size=int(length))] for length in rng.integers(0, 3 * n, size=40)]
        hashes, offsets = batch_ngram_hashes(docs, n, cache)
        for i, doc in enumerate(docs):
            alone = ngram_hashes(np.array([cache[t] for t in doc], dtype=np.uint64), n)
            assert hashes[offsets[i]: offsets[i + 1]].tolist() == alone.tolist(), (n, i, len(doc))


def test_jaccard_of_sets_is_exact():
    a, b = sorted_set(np.array([5, 1, 3, 3], dtype=np.uint64)), sorted_set(np.array([3, 9, 1], dtype=np.uint64))
    assert a.tolist() == [1, 3, 5] and jaccard_of_sets(a, b) == pytest.approx(2 / 4)
    assert jaccard_of_sets(a[:0], b[:0]) == 1.0


def test_signature_agreement_estimates_jaccard_within_binomial_error():
    rng = np.random.default_rng(0)
    family = HashFamily.from_seed(112, 1)
    errors = []
    for shared in (20, 60, 100, 150):
        common = rng.integers(0, 2**63, size=shared, dtype=np.uint64)
        a = np.concatenate([common, rng.integers(0, 2**63, size=200 - shared, dtype=np.uint64)])
        b = np.concatenate([common, rng.integers(0, 2**63, size=200 - shared, dtype=np.uint64)])
        sig = signatures(np.concatenate([a, b]), np.array([0, 200, 400]), family)
        truth = shared / (400 - shared)
        errors.append(abs((sig[0] == sig[1]).mean() - truth) / np.sqrt(truth * (1 - truth) / 112))
    assert max(errors) < 3.5  # within 3.5 standard deviations of the ideal estimator


def test_signatures_of_a_document_do_not_depend_on_blocking_or_neighbours():
    rng = np.random.default_rng(1)
    family = HashFamily.from_seed(16, 3)
    doc = rng.integers(0, 2**63, size=150_000, dtype=np.uint64)  # spans three blocks
    alone = signatures(doc, np.array([0, len(doc)]), family)
    with_neighbours = signatures(np.concatenate([doc[:7], doc]), np.array([0, 0, 7, 7 + len(doc)]), family)
    assert (with_neighbours[2] == alone[0]).all() and (with_neighbours[0] == 0xFFFFFFFF).all()
    assert (alone[0] == (((doc[:, None] * family.multipliers + family.increments) >> np.uint64(32)).min(0))).all()


def test_band_keys_equal_exactly_when_band_rows_equal():
    sig = np.array([[1, 2, 3, 4], [1, 2, 9, 9], [7, 2, 3, 4]], dtype=np.uint32)
    keys = band_keys(sig, bands=2, rows=2)
    assert keys[0, 0] == keys[0, 1] != keys[0, 2] and keys[1, 0] == keys[1, 2] != keys[1, 1]


def test_candidate_probability_is_the_s_curve():
    assert float(candidate_probability(0.8, 16, 8)) == pytest.approx(0.947, abs=5e-4)


def test_union_find_root_is_smallest_member_and_giant_chain_is_fast():
    clusters = UnionFind(200_000)
    for i in range(199_999, 0, -1):
        clusters.union(i, i - 1)
    assert clusters.find(199_999) == 0 and clusters.union(5, 7) is False


def test_checked_array_detects_corruption(tmp_path):
    path = tmp_path / "x.npy"
    digest = write_checked_array(path, np.arange(10, dtype=np.uint64))
    assert read_checked_array(path, digest).tolist() == list(range(10))
    path.write_bytes(path.read_bytes()[:-1] + b"\x01")
    with pytest.raises(ChecksumMismatch, match="x.npy.*corrupt"):
        read_checked_array(path, digest)
