from __future__ import annotations

import json
from collections import defaultdict

import pyarrow.parquet as pq
import pytest

import tasks.dedup.exact as dedup_exact
import tasks.runner.stage_runner as stage_runner
from tasks.dedup.exact import DedupExactConfig, keepers_by_text, run_dedup_exact
from tasks.dedup.shingles import normalise
from tasks.dedup.spill_reader import SpillFiles
from tasks.runner.host_traffic import count_host_traffic
from tasks.runner.stage_runner import read_stage_audit, read_stage_docs


def removed(stage_dir) -> dict[str, dict]:
    return {row["id"]: json.loads(row["detail"]) for row in read_stage_audit(stage_dir).to_pylist() if row["rule"] == "exact_duplicate"}


def test_normalise_lowercases_and_collapses_whitespace():
    assert normalise("  Hello\n\tWORLD  again ") == "hello world again"


def test_keepers_by_text_keeps_smallest_id_per_distinct_text():
    assert keepers_by_text([("b", "x"), ("a", "x"), ("c", "y"), ("d", "x")]) == {"b": "a", "d": "a"}


def test_exact_copies_removed_keeping_smallest_id_across_shards(tmp_path, upstream):
    texts = {"z-first": "The Same Text\n\nhere", "a-second": "the same   text here", "m-third": "THE SAME TEXT HERE",
             "other": "a different text", "empty-1": "", "empty-2": "  "}
    manifest = run_dedup_exact(DedupExactConfig(), upstream(texts, shards=3), tmp_path / "exact", workers=1)
    assert removed(tmp_path / "exact") == {"m-third": {"kept_id": "a-second"}, "z-first": {"kept_id": "a-second"}, "empty-2": {"kept_id": "empty-1"}}
    assert sorted(read_stage_docs(tmp_path / "exact").column("id").to_pylist()) == ["a-second", "empty-1", "other"]
    assert manifest.extra["context"]["duplicate_groups"] == 2
    # issue 56: a removal's statistic and threshold, like every removing rule's (the normalised texts are equal)
    assert {(row["value"], row["threshold"]) for row in read_stage_audit(tmp_path / "exact").to_pylist()} == {(1.0, 1.0)}


def test_a_digest_collision_never_merges_different_texts(tmp_path, upstream, monkeypatch):
    monkeypatch.setattr(dedup_exact, "text_digest", lambda text: b"\x00" * 20)  # every text collides
    texts = {"a": "one text", "b": "another text", "c": "One  text"}
    manifest = run_dedup_exact(DedupExactConfig(), upstream(texts), tmp_path / "exact", workers=1)
    assert removed(tmp_path / "exact") == {"c": {"kept_id": "a"}}
    assert manifest.extra["context"]["digest_collisions_with_different_text"] == 1


def test_same_removals_for_one_and_seven_shards(tmp_path, upstream):
    texts = {f"d{i:02d}": f"text number {i % 5}" for i in range(30)}
    run_dedup_exact(DedupExactConfig(), upstream(texts, 1, "one"), tmp_path / "e1", workers=1)
    run_dedup_exact(DedupExactConfig(), upstream(texts, 7, "seven"), tmp_path / "e7", workers=2)
    assert removed(tmp_path / "e1") == removed(tmp_path / "e7") and len(removed(tmp_path / "e1")) == 25


def test_colliding_texts_read_back_in_small_batches_and_many_group_ranges_give_the_same_removals(tmp_path, upstream, monkeypatch):
    texts = {f"d{i:02d}": f"text number {i % 4}" + " padding" * (i % 3) for i in range(40)}
    run_dedup_exact(DedupExactConfig(), upstream(texts, 3, "whole"), tmp_path / "whole", workers=1)
    monkeypatch.setattr(stage_runner, "PARTITION_BYTES", 8)  # a range per 8 bytes of colliding text: more ranges than groups
    monkeypatch.setattr(dedup_exact, "READ_BATCH_ROWS", 2)
    manifest = run_dedup_exact(DedupExactConfig(), upstream(texts, 3, "batched"), tmp_path / "batched", workers=1)
    assert removed(tmp_path / "batched") == removed(tmp_path / "whole") and len(removed(tmp_path / "whole")) == 28
    assert manifest.extra["context"]["partitions"] > manifest.extra["context"]["duplicate_groups"]


def test_partition_counts_follow_the_data_bytes_not_only_the_workers():
    assert stage_runner.partition_count(4, 0) == 8  # at least two ranges a worker
    assert stage_runner.partition_count(4, 100 * stage_runner.PARTITION_BYTES) == 100  # then one per PARTITION_BYTES
    assert stage_runner.partition_count(4, 100 * stage_runner.PARTITION_BYTES + 1) == 101


# --- planning memory, by counting: the host exchanges slices and counts, never per-document values ---

ROWS_PER_SHARD = 24


def duplicated_corpus(upstream, shards: int, rows: int, name: str):
    """`rows` documents a shard, all of them duplicates: even rows copy the same row of every other shard,
    odd rows pair up within their shard. Doc (shard s, row r) is the r-th document of shard s."""
    texts = {}
    for row in range(rows):
        for shard in range(shards):  # publish_docs deals ids round-robin: this order puts (shard, row) there
            texts[f"d{row:04d}-{shard:04d}"] = f"Shared row {row}" if row % 2 == 0 else f"own text {shard} {row // 4}"
    return upstream(texts, shards, name)


def counted_pass(upstream, tmp_path, monkeypatch, shards: int, rows: int):
    """(host traffic, spill elements + Parquet rows read by each per-shard job, by task) of one exact pass."""
    read: dict[str, list[int]] = defaultdict(list)
    running: list[str] = []

    def per_job(name, fn):
        def run(*job):
            running.append(name)
            read[name].append(0)
            try:
                return fn(*job)
            finally:
                running.pop()
        return run

    def counting_read(self, path, start, stop):
        values = real_read(self, path, start, stop)
        if running:
            read[running[-1]][-1] += len(values)
        return values

    def counting_batches(self, *args, **kwargs):
        for batch in real_batches(self, *args, **kwargs):
            if running:
                read[running[-1]][-1] += batch.num_rows
            yield batch

    real_read, real_batches = SpillFiles.read, pq.ParquetFile.iter_batches
    with monkeypatch.context() as patch:
        patch.setattr(SpillFiles, "read", counting_read)
        patch.setattr(pq.ParquetFile, "iter_batches", counting_batches)
        for name in ("digest_shard", "key_text_shard", "shard_removals"):
            if hasattr(dedup_exact, name):
                patch.setattr(dedup_exact, name, per_job(name, getattr(dedup_exact, name)))
        source = duplicated_corpus(upstream, shards, rows, f"in-{shards}-{rows}")
        with count_host_traffic() as traffic:
            manifest = run_dedup_exact(DedupExactConfig(), source, tmp_path / f"out-{shards}-{rows}", workers=1)
    assert manifest.counts["removed"]["exact_duplicate"] == (shards - 1) * rows // 2 + shards * rows // 4
    return traffic, read


def test_host_traffic_per_shard_stays_flat_with_8x_the_shards_and_shard_jobs_read_the_same(tmp_path, upstream, monkeypatch):
    small, small_read = counted_pass(upstream, tmp_path, monkeypatch, 4, ROWS_PER_SHARD)
    large, large_read = counted_pass(upstream, tmp_path, monkeypatch, 32, ROWS_PER_SHARD)
    assert large.total() / 32 <= 1.2 * small.total() / 4
    assert large.largest_result <= 1.2 * small.largest_result  # no task hands back a list over all shards
    assert max(large.job_bytes[label] / large.jobs[label] for label in large.jobs) <= 1.2 * max(
        small.job_bytes[label] / small.jobs[label] for label in small.jobs)  # nor is handed one
    assert set(small_read) == set(large_read) == {"digest_shard", "key_text_shard", "shard_removals"}
    for task, counts in small_read.items():
        assert max(large_read[task]) <= 1.2 * max(counts), task  # one shard's rows, whatever the corpus
    assert max(small_read["digest_shard"]) == max(large_read["digest_shard"]) == ROWS_PER_SHARD


def test_host_traffic_does_not_follow_the_documents_at_a_fixed_shard_count(tmp_path, upstream, monkeypatch):
    """8× the documents in the same shards: the host's bytes stay put (main's per-document digests grew 28 B a document)."""
    small, _ = counted_pass(upstream, tmp_path, monkeypatch, 4, ROWS_PER_SHARD)
    large, _ = counted_pass(upstream, tmp_path, monkeypatch, 4, 8 * ROWS_PER_SHARD)
    assert large.total() <= 1.2 * small.total()
    assert large.largest_result <= 1.2 * small.largest_result


def test_the_key_text_collapses_exactly_the_whitespace_the_regex_did():
    """normalise's split/join is the old `\\s+` regex collapse on every Unicode space (and on non-spaces like ZWSP)."""
    import random
    import re

    from tasks.dedup.shingles import normalise

    spaces = [chr(c) for c in range(0x3001) if chr(c).isspace()] + ["\u200b", "\ufeff", "\u180e", "\x1c", "\x85"]
    rng = random.Random(5)
    texts = ["".join(rng.choice(spaces + ["Ab", "é", "İ", "ß", "x"]) for _ in range(rng.randint(0, 25))) for _ in range(5000)]
    assert [normalise(t) for t in texts] == [re.sub(r"\s+", " ", t.lower()).strip() for t in texts]
