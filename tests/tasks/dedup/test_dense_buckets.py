"""Dense LSH buckets are bounded (issue 45, part 5): a mass of near-identical pages is linked as a star to
bucket leaders with verified edges, ~one comparison a member and band instead of all m²/2 pairs, and
gives the clusters the all-pairs paths give."""
from __future__ import annotations

import json
import random
import string

import numpy as np
import pyarrow.parquet as pq

import tasks.dedup.lsh_buckets as lsh_buckets
import tasks.dedup.near_dup_files as near_dup_files
from tasks.dedup.fuzzy import DedupFuzzyConfig, run_dedup_fuzzy
from tasks.runner.stage_runner import read_stage_audit

RNG = random.Random(3)
VOCAB = ["".join(RNG.choice(string.ascii_lowercase) for _ in range(RNG.randint(3, 9))) for _ in range(4000)]


def story(words: int, rng: random.Random) -> list[str]:
    return [rng.choice(VOCAB) for _ in range(words)]


def letters(number: int) -> str:
    word = "q"
    while True:
        number, digit = divmod(number, 26)
        word += string.ascii_lowercase[digit]
        if not number:
            return word


def three_families(rng: random.Random) -> dict[str, str]:
    """Three families of 150 near-copies of a 200-word story (each word replaced with probability 0.01)."""
    texts = {}
    for family in range(3):
        base = story(200, rng)
        for variant in range(150):
            words = [("river" if rng.random() < 0.01 else word) for word in base]
            texts[f"f{family}-{variant:016x}"] = " ".join(words)
    return texts


def clusters(stage_dir) -> dict[str, str]:
    table = pq.read_table(stage_dir / "clusters.parquet")
    return dict(zip(table.column("id").to_pylist(), table.column("kept_id").to_pylist()))


def test_20k_pages_identical_but_for_one_word_are_one_cluster_with_bounded_comparisons(upstream, tmp_path) -> None:
    base = story(300, random.Random(5))
    pages = {}
    for i in range(20_000):
        words = list(base)
        words[i % 300] = letters(i)  # one word differs (letters: numbers would be folded): every pair at Jaccard ≈ 0.97
        pages[f"mirror-{i:016x}"] = " ".join(words)
    manifest = run_dedup_fuzzy(DedupFuzzyConfig(), upstream(pages, shards=2), tmp_path / "fuzzy", workers=1)
    found = manifest.extra["context"]
    assert found["star_buckets"] >= 1
    # at most one verified comparison per member and band (14 bands), against 20,000²/2 = 2e8 pairs per bucket before
    assert found["star_compared_pairs"] <= 14 * 20_000, found
    # every comparison made (star, the bulk counts of the buckets under STAR_FROM, verified candidates) against the
    # pairs the buckets hold (all compared before: 1.7e9 here)
    compared = found["star_compared_pairs"] + found["bulk_exact_pairs"] + found["verified_pairs"]
    assert compared * 100 < found["candidate_pairs"], found
    removed = read_stage_audit(manifest.directory).to_pylist()
    assert len(removed) == 19_999 and len(set(clusters(manifest.directory).values())) == 1
    assert all(json.loads(row["detail"])["kept_id"] != row["id"] for row in removed)
    print({k: found[k] for k in ("largest_bucket", "buckets", "star_buckets", "star_compared_pairs", "bulk_exact_pairs", "verified_pairs", "candidate_pairs")})


def test_the_star_gives_the_clusters_of_the_all_pairs_paths(upstream, tmp_path, monkeypatch) -> None:
    rng = random.Random(9)
    texts = three_families(rng)
    for single in range(100):
        texts[f"single-{single:016x}"] = " ".join(story(200, rng))
    corpus = upstream(texts, shards=3)
    monkeypatch.setattr(lsh_buckets, "STAR_FROM", 10**9)
    all_pairs = run_dedup_fuzzy(DedupFuzzyConfig(), corpus, tmp_path / "all_pairs", workers=1)
    monkeypatch.setattr(lsh_buckets, "STAR_FROM", 64)
    star = run_dedup_fuzzy(DedupFuzzyConfig(), corpus, tmp_path / "star", workers=1)
    assert star.extra["context"]["star_buckets"] >= 3 and star.extra["context"]["bulk_exact_pairs"] == 0
    assert all_pairs.extra["context"]["bulk_exact_pairs"] > 0
    assert clusters(star.directory) == clusters(all_pairs.directory)
    assert {r["id"] for r in read_stage_audit(star.directory).to_pylist()} == {r["id"] for r in read_stage_audit(all_pairs.directory).to_pylist()}
    assert len(set(clusters(star.directory).values())) == 3


def test_a_bucket_whose_agreeing_pairs_pass_the_cap_takes_the_audited_fallback(upstream, tmp_path, monkeypatch) -> None:
    """With the star and the bulk Jaccard out of the way (a bucket of many families that the star gave up on and
    bulk refused), the fingerprint filter's pairs are capped: past MAX_BUCKET_CANDIDATES the bucket is linked
    first/neighbour only, the skipped pairs counted, and one-family buckets still give nearly the same clusters."""
    corpus = upstream(three_families(random.Random(11)), shards=3)
    monkeypatch.setattr(lsh_buckets, "STAR_FROM", 10**9)
    monkeypatch.setattr(lsh_buckets, "FOLD_IDENTICAL_FROM", 10**9)
    uncapped = run_dedup_fuzzy(DedupFuzzyConfig(), corpus, tmp_path / "uncapped", workers=1)
    monkeypatch.setattr(lsh_buckets, "MAX_BUCKET_CANDIDATES", 1000)  # a 150-member family bucket agrees in ~11k pairs
    capped = run_dedup_fuzzy(DedupFuzzyConfig(), corpus, tmp_path / "capped", workers=1)
    before, after = uncapped.extra["context"], capped.extra["context"]
    assert before["fallback_buckets"] == 0 and after["fallback_buckets"] >= 3 and after["fallback_skipped_pairs"] > 0
    assert after["verified_pairs"] * 5 < before["verified_pairs"], (before, after)
    # the fallback trades recall for its bound, never precision: what it clusters, the all-pairs path clusters alike
    found, reference = clusters(capped.directory), clusters(uncapped.directory)
    assert found.items() <= reference.items() and len(found) >= 0.95 * len(reference), (len(found), len(reference))
    assert len(set(found.values())) == 3


def test_two_member_buckets_are_linked_at_once_with_the_counts_and_clusters_of_one_at_a_time(upstream, tmp_path, monkeypatch) -> None:
    """Most buckets hold two documents; a key partition reads all their fingerprints in one pass (two reads), not one
    read per bucket, and decides what `link_bucket` decides for each of them."""
    rng = random.Random(13)
    texts = {}
    for pair in range(40):
        words = story(150, rng)
        texts[f"p{pair:03d}-a"] = " ".join(words)
        texts[f"p{pair:03d}-b"] = " ".join(("river" if rng.random() < 0.02 else word) for word in words)
    texts.update({f"single-{single:03d}": " ".join(story(150, rng)) for single in range(40)})
    corpus = upstream(texts, shards=3)
    reads = []
    real_read = near_dup_files.RankedArrays.__getitem__
    monkeypatch.setattr(near_dup_files.RankedArrays, "__getitem__",
                        lambda self, ranks: (self.part == "prints.npy" and reads.append(len(ranks))) or real_read(self, ranks))
    at_once = run_dedup_fuzzy(DedupFuzzyConfig(), corpus, tmp_path / "at_once", workers=1)
    found = at_once.extra["context"]
    assert found["largest_bucket"] == 2 and found["buckets"] > 100 and found["removed"] >= 20, found
    assert len(reads) == 2 * found["partitions"]
    monkeypatch.setattr(lsh_buckets.BucketLinker, "link_pairs", lambda self, firsts, seconds: [
        self.link_bucket(np.array([a, b])) for a, b in zip(firsts.tolist(), seconds.tolist())])
    one_at_a_time = run_dedup_fuzzy(DedupFuzzyConfig(), corpus, tmp_path / "one_at_a_time", workers=1)
    timings = ("signature_seconds", "candidate_and_cluster_seconds")
    assert {k: v for k, v in found.items() if k not in timings} == {k: v for k, v in one_at_a_time.extra["context"].items() if k not in timings}
    assert len(reads) == 2 * found["partitions"] + found["buckets"]  # the one-at-a-time run: a read per bucket
    assert clusters(at_once.directory) == clusters(one_at_a_time.directory)
    assert read_stage_audit(at_once.directory).equals(read_stage_audit(one_at_a_time.directory))
