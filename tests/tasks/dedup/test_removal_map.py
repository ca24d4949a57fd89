"""A shard job of a global stage reads only its own part of the removal map (counted, not timed)."""
import pickle

import pyarrow.parquet as pq
import pytest

from manifests.schema import docs_table
from manifests.stage_manifest import read_manifest
from tasks.dedup import removal_map
from tasks.dedup.removal_map import RemovalContext, ShardSlice, apply_removals, removal_table, write_removal_table
from tasks.dedup.table_slices import write_table_slices
from tasks.runner.stage_runner import StageDef, StageWriter, _run_one_shard, plan_stage, read_stage_audit, read_stage_docs, run_stage, shard_name

DOCS_PER_SHARD = 10
REMOVED_PER_SHARD = 4


def doc_id(shard: int, row: int) -> str:
    return f"doc-{(row * 7919 + shard) % 100_000:05d}-{shard}-{row}"  # ids not in shard order


def write_upstream(directory, shards: int):
    writer = StageWriter("extract", "test", {}, "key", [], directory)
    for shard in range(shards):
        writer.write_shard(shard, docs_table([{"id": doc_id(shard, row), "text": f"text {row}", "source": "s", "meta": {}}
                                              for row in range(DOCS_PER_SHARD)]), [])
    return writer.publish()


def remove_some(upstream, config, work_dir) -> RemovalContext:
    """A global pass: the first REMOVED_PER_SHARD documents of every shard go."""
    ids, shards = [], []
    for index, _ in enumerate(upstream.files("data")):
        for row in range(REMOVED_PER_SHARD):
            ids.append(doc_id(index, row))
            shards.append(shard_name(index))
    count = len(ids)
    table = removal_table(ids, shards, ["test_rule"] * count, [1.0] * count, [0.5] * count, ['{"why": "test"}'] * count)
    return write_removal_table(work_dir, table, {"removed": count})


STAGE = StageDef("dedup_test", "1", apply_removals, prepare=remove_some)


def rows_read_by_first_shard_job(tmp_path, shards: int, monkeypatch) -> tuple[int, int]:
    """(rows of global results read by shard 0's job, pickled size of that job)."""
    upstream = write_upstream(tmp_path / f"up-{shards:03d}", shards)
    plan = plan_stage(STAGE, None, upstream.directory, tmp_path / f"out-{shards:03d}", workers=1)
    read = []
    real_read_table = pq.read_table

    def counting_read_table(*args, **kwargs):
        table = real_read_table(*args, **kwargs)
        read.append(table.num_rows)
        return table

    removal_map.load_checked_table.cache_clear()
    monkeypatch.setattr(removal_map.pq, "read_table", counting_read_table)
    result = _run_one_shard(*plan.jobs[0])
    monkeypatch.undo()
    assert result.docs_in == DOCS_PER_SHARD and result.kept == DOCS_PER_SHARD - REMOVED_PER_SHARD
    plan.writer.abandon()
    return sum(read), len(pickle.dumps(plan.jobs[0]))


def test_rows_read_per_shard_job_stay_constant_as_removals_grow_100x(tmp_path, monkeypatch):
    small_rows, small_job = rows_read_by_first_shard_job(tmp_path, 1, monkeypatch)  # 4 removals in all
    large_rows, large_job = rows_read_by_first_shard_job(tmp_path, 100, monkeypatch)  # 400 removals in all
    assert small_rows == large_rows == REMOVED_PER_SHARD
    assert small_job == large_job  # the job carries one slice's path and digest, not the map


def test_each_shard_loses_exactly_its_own_removals(tmp_path):
    upstream = write_upstream(tmp_path / "up", 5)
    manifest = run_stage(STAGE, None, upstream.directory, tmp_path / "out", workers=1)
    kept = set(read_stage_docs(manifest.directory).column("id").to_pylist())
    removed = set(read_stage_audit(manifest.directory).column("id").to_pylist())
    assert removed == {doc_id(s, r) for s in range(5) for r in range(REMOVED_PER_SHARD)}
    assert kept == {doc_id(s, r) for s in range(5) for r in range(REMOVED_PER_SHARD, DOCS_PER_SHARD)}
    artifacts = [f.path for f in read_manifest(manifest.directory).files("artifact")]
    assert artifacts == [f"removals/{shard_name(s)}.parquet" for s in range(5)]


def test_a_shard_without_removals_gets_no_file_and_reads_nothing(tmp_path):
    table = removal_table(["a"], [shard_name(1)], ["r"], [None], [None], ["{}"])
    context = write_removal_table(tmp_path, table, {})
    assert context.for_shard(shard_name(0)) == ShardSlice(None, None)
    docs = docs_table([{"id": "a", "text": "x", "source": "s", "meta": {}}])
    assert apply_removals(docs, None, context.for_shard(shard_name(0))).kept.num_rows == 1  # "a" is on shard 1, not here
    assert apply_removals(docs, None, context.for_shard(shard_name(1))).kept.num_rows == 0


def test_a_corrupt_shard_file_fails_with_its_path(tmp_path):
    table = removal_table(["a"], [shard_name(0)], ["r"], [None], [None], ["{}"])
    part = write_removal_table(tmp_path, table, {}).for_shard(shard_name(0))
    with open(part.path, "ab") as handle:
        handle.write(b"x")
    removal_map.load_checked_table.cache_clear()
    with pytest.raises(removal_map.ChecksumMismatch, match="part-00000.parquet"):
        apply_removals(docs_table([{"id": "a", "text": "x", "source": "s", "meta": {}}]), None, part)


def test_removal_files_assembled_from_pieces_have_write_by_shards_bytes(tmp_path):
    """Tasks that each write part of a removal map (any split, any order) give the files the host's writer gives."""
    ids = [doc_id(shard, row) for shard in range(3) for row in range(REMOVED_PER_SHARD)]
    shards = [shard_name(shard) for shard in range(3) for _ in range(REMOVED_PER_SHARD)]
    count = len(ids)
    table = removal_table(ids, shards, ["r"] * count, [0.5] * count, [None] * count, [f'{{"n": {n}}}' for n in range(count)])
    whole = removal_map.write_by_shard(tmp_path / "whole", "removals", table)
    pieces = {}
    for n in (2, 0, 1):  # three writers, each with some rows of every shard
        by_shard = removal_map.tables_by_shard(table.take(list(range(n, count, 3))))
        for (shard, _), part in zip(by_shard, write_table_slices(tmp_path / f"piece-{n}.npy", [rows for _, rows in by_shard])):
            pieces.setdefault(shard, []).append(part)
    assembled = {shard: removal_map.assemble_shard_file(str(tmp_path / "pieces"), "removals", shard, parts, removal_map.REMOVALS_SCHEMA)
                 for shard, parts in pieces.items()}
    assert {s: (sha, rows) for s, (_, _, sha, rows) in assembled.items()} == {s: (sha, rows) for s, (_, sha, rows) in whole.files.items()}
    assert sorted(assembled) == [shard_name(s) for s in range(3)]
    with open(pieces[shard_name(2)][0].path, "r+b") as handle:
        handle.seek(-1, 2)  # the last byte: inside shard 2's slice
        handle.write(b"\xff")
    with pytest.raises(removal_map.ChecksumMismatch, match="piece-2.npy"):
        removal_map.assemble_shard_file(str(tmp_path / "again"), "removals", shard_name(2), pieces[shard_name(2)], removal_map.REMOVALS_SCHEMA)
