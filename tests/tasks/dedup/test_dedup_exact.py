from __future__ import annotations

import json

import pytest

import tasks.dedup.exact as dedup_exact
import tasks.runner.stage_runner as stage_runner
from tasks.dedup.exact import DedupExactConfig, keepers_by_text, run_dedup_exact
from tasks.dedup.shingles import normalise
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
