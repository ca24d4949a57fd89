"""Near-duplicate recall inside large LSH buckets: a templated site (pages sharing 60–85 % boilerplate) against exact truth."""
from __future__ import annotations

import math

import numpy as np
import pytest

import tasks.dedup.lsh_buckets as lsh_buckets
import tasks.dedup.pair_jaccard as pair_jaccard
from bench.templated_site import pairs_at_least, removals_from_pairs, shingle_set, templated_site
from tasks.dedup.fuzzy import DedupFuzzyConfig, run_dedup_fuzzy
from tasks.dedup.minhash import HashFamily, band_keys, signatures
from tasks.dedup.shingles import TokenHashCache, batch_ngram_hashes, jaccard_of_sets, tokens
from tasks.dedup.signature_filter import agreeing_pairs, minimum_agreement
from tasks.runner.stage_runner import read_stage_audit


@pytest.fixture(scope="module")
def site():
    return templated_site(pages=360, copies=30, variants=30, seed=5)


@pytest.fixture(scope="module")
def site_sets(site):
    cache = TokenHashCache()
    return [shingle_set(text, cache) for text in site.texts]


def removed_ids(stage_dir) -> set[str]:
    return set(read_stage_audit(stage_dir).column("id").to_pylist())


def lsh_reachable_truth(site, config: DedupFuzzyConfig) -> set[str]:
    """Truth removals restricted to pairs that share at least one band key: what no bucket shortcut may lose."""
    hashes, offsets = batch_ngram_hashes([tokens(text) for text in site.texts], config.shingle_size, TokenHashCache())
    keys_BN = band_keys(signatures(hashes, offsets, HashFamily.from_seed(config.num_hashes, config.seed)), config.bands, config.rows)
    pairs = [(a, b, j) for a, b, j in pairs_at_least(site.texts, config.jaccard_threshold) if np.any(keys_BN[:, a] == keys_BN[:, b])]
    return removals_from_pairs(site.ids, pairs)


def test_bulk_pair_jaccard_equals_pair_by_pair(site_sets):
    sets = site_sets[300:] + site_sets[:60]  # every planted copy and variant, and some of their pages
    every_pair = [(i, j, jaccard_of_sets(sets[i], sets[j])) for i in range(len(sets)) for j in range(i + 1, len(sets))]
    for threshold in (0.3, 0.6, 0.8):
        expected = [pair for pair in every_pair if pair[2] >= threshold]
        for dense_from in (2, 16, 10_000):  # all shingles dense, the default split, all counted pair by pair
            firsts, seconds, similarities = pair_jaccard.pairs_at_least(sets, threshold, dense_from=dense_from, block_rows=37)
            assert list(zip(firsts.tolist(), seconds.tolist(), similarities.tolist())) == expected
    assert pair_jaccard.pairs_at_least(site_sets, 0.8, dense_bytes_limit=0) is None


def test_bulk_pair_jaccard_keeps_very_long_pairs_exactly_at_the_threshold():
    """|A| = |B| = 176,472 shingles, 156,864 shared: J = 0.8 exactly; a float32 test with a fixed 0.01 slack dropped it."""
    shared_count = 156_864
    own_count = 176_472 - shared_count
    shared = np.arange(shared_count, dtype=np.uint64)
    a = np.concatenate((shared, np.arange(own_count, dtype=np.uint64) + np.uint64(10**9)))
    b = np.concatenate((shared, np.arange(own_count, dtype=np.uint64) + np.uint64(2 * 10**9)))
    assert jaccard_of_sets(a, b) >= 0.8
    for dense_from in (2, 16):  # common shingles by matrix product, rare ones by pair counting
        firsts, seconds, similarities = pair_jaccard.pairs_at_least([a, b, b[:-1]], 0.8, dense_from=dense_from)
        assert (0, 1) in set(zip(firsts.tolist(), seconds.tolist()))
        assert similarities.tolist()[0] == jaccard_of_sets(a, b)


def test_signature_filter_margin_and_all_pairs_agreement():
    minimum = minimum_agreement(112, 0.8, 1e-6)
    tail = sum(math.comb(112, k) * 0.8**k * 0.2 ** (112 - k) for k in range(minimum))
    assert tail <= 1e-6 < tail + math.comb(112, minimum) * 0.8**minimum * 0.2 ** (112 - minimum)
    prints = np.random.default_rng(0).integers(0, 3, size=(41, 112), dtype=np.uint8)
    firsts, seconds = agreeing_pairs(prints, 40)
    expected = [(i, j) for i in range(41) for j in range(i + 1, 41) if np.count_nonzero(prints[i] == prints[j]) >= 40]
    assert list(zip(firsts.tolist(), seconds.tolist())) == expected and expected


def test_templated_site_every_reachable_near_copy_is_removed_and_nothing_else(tmp_path, upstream, site):
    config = DedupFuzzyConfig()
    manifest = run_dedup_fuzzy(config, upstream(dict(zip(site.ids, site.texts)), shards=3), tmp_path / "fuzzy", workers=1)
    truth = removals_from_pairs(site.ids, pairs_at_least(site.texts, 0.8))
    removed = removed_ids(tmp_path / "fuzzy")
    stats = manifest.extra["context"]
    assert stats["largest_bucket"] > 64 and stats["bulk_exact_pairs"] > 0  # the case the old first/neighbour shortcut got wrong
    assert removed == lsh_reachable_truth(site, config) and removed <= truth
    assert len(removed) >= len(truth) - 1 and not removed & set(site.planted_variant)  # one pair shares no band at all
    assert stats["fallback_buckets"] == stats["fallback_skipped_pairs"] == 0


def test_signature_filtered_path_and_audited_fallback(tmp_path, upstream, site, monkeypatch):
    corpus = dict(zip(site.ids, site.texts))
    run_dedup_fuzzy(DedupFuzzyConfig(), upstream(corpus, 2, "bulk"), tmp_path / "bulk", workers=1)
    monkeypatch.setattr(lsh_buckets, "pair_blocks", lambda sets, threshold: None)  # as if every bucket were too dense for bulk
    filtered = run_dedup_fuzzy(DedupFuzzyConfig(), upstream(corpus, 2, "filtered"), tmp_path / "filtered", workers=1)
    assert removed_ids(tmp_path / "filtered") == removed_ids(tmp_path / "bulk")
    assert filtered.extra["context"]["below_signature_agreement"] > 0
    fallback = run_dedup_fuzzy(DedupFuzzyConfig(max_bucket_members=50), upstream(corpus, 2, "fallback"), tmp_path / "fallback", workers=1)
    stats = fallback.extra["context"]
    assert stats["fallback_buckets"] > 0 and stats["fallback_skipped_pairs"] > 0


def test_a_mass_of_near_identical_pages_becomes_one_cluster(tmp_path, upstream):
    rng = np.random.default_rng(4)
    words = ["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), size=6)) for _ in range(1000)]
    base = words[:600]
    texts = {f"mass-{n:04d}": " ".join(base[:n] + [words[600 + n]] + base[n + 1:]) for n in range(400)}  # one word differs
    manifest = run_dedup_fuzzy(DedupFuzzyConfig(), upstream(texts, shards=2), tmp_path / "fuzzy", workers=1)
    stats = manifest.extra["context"]
    assert manifest.counts["kept"] == 1 and stats["clusters"] == 1 and stats["bulk_exact_pairs"] > 0
    assert stats["linked_edges"] < 2 * 400  # ~80k verified pairs, reduced to a forest and each page's best edge
