"""Exact deduplication: one document per normalised text, the one with the smallest id.

Seed 001, "精确重复": lower-case, collapse whitespace, hash; the key also holds
the normalised string, so a digest collision can never merge two different
texts. A digest group is the set of documents sharing one SHA-1 digest; the
digest itself names it, so groups and the outcome do not depend on the
number of shards, workers or partitions.

Every per-document step is a runner task (process pool, or Dask tasks on a
cluster); tasks exchange checked spill files in the stage's work directory
(shared storage for a multi-machine run), each with its slice index beside it
(tasks/dedup/slice_index.py), so the planning process passes only shard
numbers, range counts and per-task totals between them:
1. map, one task per shard: (digest, row, key length) of every document
   (keys made from the text column's bytes, tasks/dedup/byte_keys.py),
   28 bytes each, written partitioned by digest range
   (tasks/dedup/near_dup_files.write_partitioned);
2. reduce, one task per digest range: its slice of every shard's file, sorted,
   the documents whose digest two or more share, written partitioned by shard;
3. key texts, one task per shard: reads its colliding documents (streamed in
   record batches) and writes their (digest, id, key text) partitioned by
   text range (tasks/dedup/table_slices.py), the shuffle;
4. comparison, one task per text range: the key texts of each of its digest
   groups compared, removed id -> kept id (the smallest id per distinct text),
   the removal rows written partitioned by shard;
5. one task per shard with colliding documents writes `removals/<shard>.parquet`
   from its pieces when it loses any (removal_map.assemble_shard_file).
Digest ranges number one per PARTITION_BYTES of map records, estimated from
the upstream manifest's rows before the map, text ranges one per
PARTITION_BYTES of colliding key text (both at least PARTITIONS_PER_WORKER ×
the workers; tasks/runner/stage_runner.partition_count).

Memory bound. The planning process holds O(shards + ranges) small records
(a shard's path and name, a task's few counts, a removal file's path, sha256
and rows), never a per-document value and no slice list: what passes through
it does not grow with the documents at a fixed shard count (counted in
tests/tasks/dedup/test_dedup_exact.py). Each task holds one shard's record
batch and its 28-byte digest records, or one range: about PARTITION_BYTES of
records or of key text, plus one 48-byte index entry per writer it reads.
Not bounded: one digest group is compared whole by one task, so a text
copied a million times puts a million key texts into one comparison range.
Rule `exact_duplicate`, value and threshold 1.0 (the normalised texts are equal), detail {"kept_id": ...}.
"""
from __future__ import annotations

import hashlib
import shutil
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from manifests.schema import dumps_json
from manifests.stage_manifest import StageManifest
from tasks.dedup.byte_keys import batch_key_digests, batch_key_texts
from tasks.dedup.near_dup_files import Slice, key_partition, write_partitioned
from tasks.dedup.removal_map import (REMOVALS_DIR, REMOVALS_SCHEMA, RemovalContext, ShardFiles, apply_removals, shard_removals,
                                     removal_table, tables_by_shard)
from tasks.dedup.slice_index import indexed_slice, numbered_file, partition_slices, write_slice_index
from tasks.dedup.spill_reader import SpillFiles
from tasks.dedup.table_slices import read_table_slices, write_table_slices
from tasks.runner.stage_runner import StageDef, map_shards, partition_count, run_stage

STAGE = "dedup_exact"
VERSION = "1"
RULE = "exact_duplicate"
SAME_TEXT = 1.0  # a removal's value and threshold: its normalised text equals the keeper's (similarity 1 of 1)
DIGEST_DTYPE = np.dtype(f"S{hashlib.sha1().digest_size}")  # compared as raw bytes: every digest has all 20
DIGEST_RECORD = np.dtype([("digest", DIGEST_DTYPE), ("row", "<u4"), ("key_bytes", "<u4")])  # a document in the map's spill
KEY_TEXTS = pa.schema([("group", pa.binary(DIGEST_DTYPE.itemsize)), ("id", pa.string()), ("key_text", pa.string()), ("shard", pa.string()),
                       ("shard_number", pa.uint32())])
READ_BATCH_ROWS = 1024  # rows decoded at a time: worker and read-back memory follow this, not the shard size
SPILL_DIR = "_spill"


@dataclass(frozen=True)
class DedupExactConfig:
    normalise_case_and_space: bool = True  # seed: lower-case + collapse whitespace before hashing


def text_digest(key_utf8: bytes | memoryview) -> bytes:
    return hashlib.sha1(key_utf8).digest()


def keepers_by_text(members: Iterable[tuple[str, str]]) -> dict[str, str]:
    """For (id, key text) pairs sharing a digest: removed id -> kept id, the smallest id per distinct text."""
    by_text: dict[str, list[str]] = defaultdict(list)
    for doc_id, key_text in members:
        by_text[key_text].append(doc_id)
    return keepers_of_texts(by_text)


def keepers_of_texts(by_text: dict[str, list[str]]) -> dict[str, str]:
    """removed id -> kept id, given the ids of every distinct key text of one digest group."""
    removed = {}
    for ids in by_text.values():
        kept_id = min(ids)
        removed.update({doc_id: kept_id for doc_id in ids if doc_id != kept_id})
    return removed


def digest_range(digests: np.ndarray, partitions: int) -> np.ndarray:
    """The range of each digest: its first 8 bytes, big-endian, scaled onto [0, partitions) (digests are uniform)."""
    raw = np.ascontiguousarray(digests).view(np.uint8).reshape(-1, DIGEST_DTYPE.itemsize)
    return key_partition(np.ascontiguousarray(raw[:, :8]).view(">u8").ravel().astype(np.uint64), partitions)


def digest_shard(shard_path: str, shard: int, config: DedupExactConfig, spill_dir: str, partitions: int) -> int:
    """Task (map): SHA-1 of every document's key text of shard number `shard`, spilled by digest range; returns its documents."""
    digests, key_bytes = bytearray(), []
    for batch in pq.ParquetFile(shard_path, pre_buffer=False).iter_batches(READ_BATCH_ROWS, columns=["text"], use_threads=False):
        batch_digests, batch_key_bytes = batch_key_digests(batch.column("text"), config.normalise_case_and_space, text_digest)
        digests += b"".join(batch_digests)
        key_bytes += batch_key_bytes
    records = np.empty(len(key_bytes), DIGEST_RECORD)
    records["digest"] = np.frombuffer(bytes(digests), dtype=DIGEST_DTYPE)
    records["row"] = np.arange(len(key_bytes))
    records["key_bytes"] = key_bytes
    path = numbered_file(Path(spill_dir) / "digests", shard)
    write_slice_index(path, write_partitioned(Path(path), records, digest_range(records["digest"], partitions), partitions))
    return len(records)


def checked_records(spill: SpillFiles, slices: list[Slice]) -> list[np.ndarray]:
    return [spill.read_checked_slice(s.path, s.start, s.stop, s.sha256) for s in slices]


def colliding_of_digest_range(part: int, shards: int, spill_dir: str) -> dict[str, int]:
    """Task (reduce): of one digest range, the documents whose digest two or more share, written by shard.

    Reads the range's slice of every shard's map file; returns the range's
    counts: digest groups, their documents and their key bytes.
    """
    spill = SpillFiles()
    try:
        parts = checked_records(spill, partition_slices(spill, Path(spill_dir) / "digests", shards, part))
    finally:
        spill.close()
    shard_of = np.repeat(np.arange(len(parts), dtype=np.int64), [len(p) for p in parts])
    records = np.concatenate([np.empty(0, DIGEST_RECORD), *parts])
    del parts
    order = np.argsort(records["digest"], kind="stable")
    ordered = records["digest"][order]
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1]))) if len(ordered) else np.zeros(0, np.int64)
    sizes = np.diff(np.append(starts, len(ordered)))
    del ordered
    colliding = order[np.repeat(sizes > 1, sizes)]
    path = numbered_file(Path(spill_dir) / "colliding", part)
    write_slice_index(path, write_partitioned(Path(path), records[colliding], shard_of[colliding], shards))
    return {"groups": int(np.count_nonzero(sizes > 1)), "documents": len(colliding),
            "key_bytes": int(records["key_bytes"][colliding].sum(dtype=np.int64))}


def key_text_shard(shard_path: str, shard_name: str, shard: int, digest_ranges: int, config: DedupExactConfig, text_ranges: int,
                   spill_dir: str) -> tuple[int, int]:
    """Task: (digest, id, key text) of one shard's colliding documents, spilled by text range; returns (shard, how many).

    The shard is read in record batches of READ_BATCH_ROWS rows, not whole:
    reading a shard at once costs several times its text in decode buffers.
    """
    spill = SpillFiles()
    try:
        slices = [indexed_slice(spill, numbered_file(Path(spill_dir) / "colliding", part), shard) for part in range(digest_ranges)]
        colliding = np.concatenate([np.empty(0, DIGEST_RECORD), *checked_records(spill, slices)])
    finally:
        spill.close()
    colliding = colliding[np.argsort(colliding["row"], kind="stable")]
    rows = colliding["row"].astype(np.int64)
    picked_ids, picked_texts, batch_start = [pa.array([], pa.string())], [pa.array([], pa.string())], 0
    if len(rows):
        for records in pq.ParquetFile(shard_path, pre_buffer=False).iter_batches(READ_BATCH_ROWS, columns=["id", "text"], use_threads=False):
            first, last = np.searchsorted(rows, [batch_start, batch_start + records.num_rows])
            picked = records.take(rows[first:last] - batch_start)
            picked_ids.append(picked.column("id"))
            picked_texts.append(batch_key_texts(picked.column("text"), config.normalise_case_and_space))
            batch_start += records.num_rows
    groups = pa.FixedSizeBinaryArray.from_buffers(KEY_TEXTS.field("group").type, len(rows),
                                                  [None, pa.py_buffer(np.ascontiguousarray(colliding["digest"]).tobytes())])
    text_range = digest_range(colliding["digest"], text_ranges)
    order = np.argsort(text_range, kind="stable")
    table = pa.table([groups, pa.chunked_array(picked_ids), pa.chunked_array(picked_texts), [shard_name] * len(rows),
                      np.full(len(rows), shard, np.uint32)],
                     schema=KEY_TEXTS).take(order)
    bounds = np.searchsorted(text_range[order], np.arange(text_ranges + 1)).tolist()
    path = numbered_file(Path(spill_dir) / "texts", shard)
    write_slice_index(path, write_table_slices(Path(path), [table.slice(start, stop - start) for start, stop in zip(bounds, bounds[1:])]))
    return shard, len(rows)


def keepers_of_text_range(part: int, shards: int, spill_dir: str) -> dict[str, int]:
    """Task: compare the key texts of each digest group of one text range; its removal rows written by shard number.

    Returns the removed count and the groups whose digest hides different texts.
    """
    spill = SpillFiles()
    try:
        table = read_table_slices(spill, partition_slices(spill, Path(spill_dir) / "texts", shards, part), KEY_TEXTS)
    finally:
        spill.close()
    shard_of = dict(zip(table.column("id").to_pylist(), table.column("shard").to_pylist()))
    number_of = dict(zip(table.column("shard").to_pylist(), table.column("shard_number").to_pylist()))
    by_group: dict[bytes, dict[str, list[str]]] = defaultdict(dict)
    for group, doc_id, key_text in zip(table.column("group").to_pylist(), table.column("id").to_pylist(), table.column("key_text").to_pylist()):
        by_group[group].setdefault(key_text, []).append(doc_id)
    del table
    removed_ids, kept_ids = [], []
    for by_text in by_group.values():
        for doc_id, kept_id in keepers_of_texts(by_text).items():
            removed_ids.append(doc_id)
            kept_ids.append(kept_id)
    count = len(removed_ids)
    removals = removal_table(removed_ids, [shard_of[doc_id] for doc_id in removed_ids], [RULE] * count, [SAME_TEXT] * count, [SAME_TEXT] * count,
                             [dumps_json({"kept_id": kept_id}) for kept_id in kept_ids])
    by_number = [REMOVALS_SCHEMA.empty_table()] * shards
    for name, rows in tables_by_shard(removals):
        by_number[number_of[name]] = rows
    path = numbered_file(Path(spill_dir) / "removed", part)
    write_slice_index(path, write_table_slices(Path(path), by_number))
    return {"removed": count, "different": sum(len(by_text) > 1 for by_text in by_group.values())}


def find_exact_duplicates(upstream: StageManifest, config: DedupExactConfig, work_dir: Path, workers: int = 1) -> RemovalContext:
    """Global pass: digests per shard, colliding digests per digest range, key texts compared per text range,
    removal files per shard; all runner tasks, the host passing only shard numbers, range counts and totals."""
    spill_dir = Path(work_dir) / SPILL_DIR
    data_files = sorted(upstream.files("data"), key=lambda f: Path(f.path).stem)
    paths, names = [str(upstream.path_of(f)) for f in data_files], [Path(f.path).stem for f in data_files]
    sizes, shards = [f.rows or 0 for f in data_files], len(data_files)
    digest_ranges = partition_count(workers, sum(sizes) * DIGEST_RECORD.itemsize)  # known before the map: the manifest's rows
    try:
        map_jobs = [(path, number, config, str(spill_dir), digest_ranges) for number, path in enumerate(paths)]
        documents = sum(map_shards(digest_shard, map_jobs, workers, "exact digests", sizes))
        reduce_jobs = [(part, shards, str(spill_dir)) for part in range(digest_ranges)]
        reduced = list(map_shards(colliding_of_digest_range, reduce_jobs, workers, "exact collisions", [1] * digest_ranges))
        # Text ranges follow the key texts the shuffle moves (those of colliding documents), and the workers.
        text_ranges = partition_count(workers, sum(r["key_bytes"] for r in reduced))
        read_jobs = [(path, name, number, digest_ranges, config, text_ranges, str(spill_dir))
                     for number, (path, name) in enumerate(zip(paths, names))]
        colliding_by_shard = dict(map_shards(key_text_shard, read_jobs, workers, "colliding texts", sizes))
        compare_jobs = [(part, shards, str(spill_dir)) for part in range(text_ranges)]
        compared = list(map_shards(keepers_of_text_range, compare_jobs, workers, "comparing texts", [1] * text_ranges))
        assembly_jobs = [(str(work_dir), names[number], number, text_ranges, str(spill_dir))
                         for number in range(shards) if colliding_by_shard[number]]
        removals = ShardFiles(REMOVALS_DIR)
        for written in map_shards(shard_removals, assembly_jobs, workers, "removals by shard", [colliding_by_shard[job[2]] for job in assembly_jobs]):
            if written is not None:
                shard, path, sha256, rows = written
                removals.files[shard] = (path, sha256, rows)
    finally:
        shutil.rmtree(spill_dir, ignore_errors=True)
    stats = {"documents": documents, "duplicate_groups": sum(r["groups"] for r in reduced), "partitions": text_ranges,
             "digest_collisions_with_different_text": sum(c["different"] for c in compared), "removed": sum(c["removed"] for c in compared)}
    return RemovalContext(removals, stats)


DEDUP_EXACT = StageDef(STAGE, VERSION, apply_removals, prepare=find_exact_duplicates)


def run_dedup_exact(config: DedupExactConfig, input_dir: Path, out_dir: Path, workers: int | None = None) -> StageManifest:
    return run_stage(DEDUP_EXACT, config, input_dir, out_dir, workers)
