"""The near-duplicate pass's planning process holds no per-document data: counted as the bytes it exchanges with its tasks.

Every job the flow host sends and every result it gets back is pickled and
counted (tasks/runner/host_traffic.py). At one shard size the bytes per shard
must stay flat as the corpus grows 8× in shards, and they must not follow the
documents a shard holds either (a host that receives every shard's ids holds
O(N) bytes, however it frees them).
"""
from __future__ import annotations

import random
import string

import tasks.dedup.fuzzy as dedup_fuzzy
from tasks.dedup.fuzzy import DedupFuzzyConfig, run_dedup_fuzzy
from tasks.runner.host_traffic import count_host_traffic

WORDS = ["".join(random.Random(i).choice(string.ascii_lowercase) for _ in range(6)) for i in range(500)]


def corpus(documents: int, seed: int) -> dict[str, str]:
    """Short documents in a shuffled id order, a quarter of them with a light near-copy."""
    rng = random.Random(seed)
    texts: dict[str, str] = {}
    for i in range(documents):
        doc_id = f"{rng.getrandbits(40):010x}-{i}"
        if i % 4 == 3:
            source = texts[next(reversed(texts))].split()
            source[rng.randrange(len(source))] = "river"
            texts[doc_id] = " ".join(source)
        else:
            texts[doc_id] = " ".join(rng.choice(WORDS) for _ in range(80))
    return texts


def traffic_of(tmp_path, upstream, name: str, documents: int, shards: int):
    with count_host_traffic() as traffic:
        manifest = run_dedup_fuzzy(DedupFuzzyConfig(), upstream(corpus(documents, documents), shards, name), tmp_path / f"{name}-out",
                                   workers=1)
    assert manifest.counts["removed"].get("near_duplicate", 0) >= documents // 8  # near-copies found at every size
    return traffic


def test_host_traffic_per_shard_does_not_grow_with_the_corpus(tmp_path, upstream):
    small = traffic_of(tmp_path, upstream, "small", documents=48, shards=4)
    more_shards = traffic_of(tmp_path, upstream, "more-shards", documents=384, shards=32)  # 8N at the same shard size
    larger_shards = traffic_of(tmp_path, upstream, "larger-shards", documents=384, shards=4)  # 8N in shards 8× larger
    assert more_shards.total() / 32 <= 1.2 * small.total() / 4, (small.total(), more_shards.total())
    assert larger_shards.total() / 4 <= 1.2 * small.total() / 4, (small.total(), larger_shards.total())  # nothing per document
    # and no single job carries one value per shard: Dask holds every submitted job at once
    assert more_shards.largest_job <= 1.2 * small.largest_job, (small.largest_job, more_shards.largest_job)


def traffic_at(tmp_path, upstream, monkeypatch, partitions: int):
    monkeypatch.setattr(dedup_fuzzy, "partition_count", lambda workers, data_bytes: partitions)
    with count_host_traffic() as traffic:
        manifest = run_dedup_fuzzy(DedupFuzzyConfig(), upstream(corpus(192, 7), 4, f"p{partitions}"), tmp_path / f"p{partitions}-out",
                                   workers=1)
    assert manifest.extra["context"]["partitions"] == partitions
    return traffic


def test_no_message_grows_with_the_number_of_partitions(tmp_path, upstream, monkeypatch):
    """Slices of (shard, partition) and (key, rank partition) stay in their writers' index files: a task is sent a path
    and a digest, not one slice per shard or partition, and returns counts (the old design sent S × P and P² slices)."""
    few, many = traffic_at(tmp_path, upstream, monkeypatch, 2), traffic_at(tmp_path, upstream, monkeypatch, 16)
    for label in few.jobs:
        per_job = few.job_bytes[label] / few.jobs[label], many.job_bytes[label] / many.jobs[label]
        if label != "clusters":  # one job, sent one digest per rank partition
            assert per_job[1] <= 1.1 * per_job[0], (label, per_job)
        per_result = few.result_bytes[label] / few.jobs[label], many.result_bytes[label] / many.jobs[label]
        # by design: the id sample, one count per range, and the one component task's digest per range
        if label not in ("minhash", "id ranges", "clusters"):
            assert per_result[1] <= 1.1 * per_result[0], (label, per_result)
    assert many.total() <= 1.2 * (16 / 2) * few.total()  # linear in the partitions at most (it was S × P + P²)
