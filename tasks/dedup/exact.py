"""Exact deduplication: one document per normalised text, the one with the smallest id.

Seed 001, "精确重复": lower-case, collapse whitespace, hash; the key also holds
the normalised string, so a digest collision can never merge two different
texts. Workers compute SHA-1 digests per shard; the planning process sorts
them (numpy, 40 bytes a document: digest 20, shard 4, row 8, key length 8)
to find the digests held by two or more documents. Only those documents are
read again, and that work is runner tasks too (process pool, or Dask tasks on
a cluster), exchanging files in the stage's work directory (shared storage
for a multi-machine run):
1. one task per shard that holds colliding documents reads them (streamed in
   record batches) and writes their (group, id, key text, shard) into one Parquet
   file per group range — the shuffle;
2. one task per group range compares the key texts of each of its digest
   groups and returns removed id -> kept id (the smallest id per distinct text).
Group ranges number PARTITIONS_PER_WORKER × the workers (on Dask: the
scheduler's), or one per PARTITION_BYTES of colliding key text when that is
more (tasks/stage_runner.partition_count); the removal map is the same for any count.
Rule `exact_duplicate`, detail {"kept_id": ...}.
"""
from __future__ import annotations

import hashlib
import shutil
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from manifests.atomic import atomic_write_parquet
from manifests.digest import sha256_file
from manifests.schema import dumps_json
from manifests.stage_manifest import StageManifest
from tasks.dedup.minhash import ChecksumMismatch
from tasks.dedup.removal_map import RemovalContext, apply_removals, map_upstream_shards, removal_table, write_removal_table
from tasks.dedup.shingles import normalise
from tasks.runner.stage_runner import StageDef, map_shards, partition_count, run_stage

STAGE = "dedup_exact"
VERSION = "1"
RULE = "exact_duplicate"
DIGEST_DTYPE = np.dtype(f"S{hashlib.sha1().digest_size}")  # compared as raw bytes: every digest has all 20
READ_BATCH_ROWS = 1024  # rows decoded at a time: worker and read-back memory follow this, not the shard size
SPILL_DIR = "_spill"


@dataclass(frozen=True)
class DedupExactConfig:
    normalise_case_and_space: bool = True  # seed: lower-case + collapse whitespace before hashing


def exact_key_text(text: str, config: DedupExactConfig) -> str:
    return normalise(text) if config.normalise_case_and_space else text


def text_digest(key_utf8: bytes) -> bytes:
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


def digest_shard(shard_path: str, shard: str, config: DedupExactConfig) -> dict[str, Any]:
    """Task: SHA-1 of every document's key text of one shard, in row order, as a numpy array."""
    digests, key_bytes = bytearray(), []
    for batch in pq.ParquetFile(shard_path, pre_buffer=False).iter_batches(READ_BATCH_ROWS, columns=["text"], use_threads=False):
        for text in batch.column("text").to_pylist():
            key = exact_key_text(text, config).encode("utf-8")
            digests += text_digest(key)
            key_bytes.append(len(key))
    return {"shard": shard, "path": shard_path, "digests": np.frombuffer(bytes(digests), dtype=DIGEST_DTYPE),
            "key_bytes": np.asarray(key_bytes, dtype=np.int64)}


def colliding_groups(digests: np.ndarray) -> list[np.ndarray]:
    """Positions of the documents of every digest shared by two or more, in digest order."""
    order = np.argsort(digests, kind="stable")
    ordered = digests[order]
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    sizes = np.diff(np.append(starts, len(ordered)))
    return [order[start: start + size] for start, size in zip(starts[sizes > 1].tolist(), sizes[sizes > 1].tolist())]


def key_text_shard(shard_path: str, shard: str, rows: np.ndarray, groups: np.ndarray, config: DedupExactConfig,
                   partitions: int, group_count: int, spill_dir: str) -> list[tuple[int, str, str]]:
    """Task: (group, id, key text) of the given rows of one shard, one Parquet file per group range: [(range, path, sha256)].

    The shard is read in record batches of READ_BATCH_ROWS rows, not whole:
    reading a shard at once costs several times its text in decode buffers.
    """
    order = np.argsort(rows, kind="stable")
    rows, groups = rows[order], groups[order]
    picked_ids, picked_texts, batch_start = [], [], 0
    for records in pq.ParquetFile(shard_path, pre_buffer=False).iter_batches(READ_BATCH_ROWS, columns=["id", "text"], use_threads=False):
        first, last = np.searchsorted(rows, [batch_start, batch_start + records.num_rows])
        picked = records.take(rows[first:last] - batch_start)
        picked_ids.extend(picked.column("id").to_pylist())
        picked_texts.extend(exact_key_text(text, config) for text in picked.column("text").to_pylist())
        batch_start += records.num_rows
    group_range = groups * partitions // max(group_count, 1)
    table = pa.table({"group": groups, "id": picked_ids, "key_text": picked_texts, "shard": [shard] * len(picked_ids)})
    written = []
    for part in np.unique(group_range).tolist():
        path = Path(spill_dir) / f"{shard}.texts-{part:05d}.parquet"
        atomic_write_parquet(path, table.filter(pa.array(group_range == part)))
        written.append((part, str(path), sha256_file(path)))
    return written


def keepers_of_group_range(files: list[tuple[str, str]]) -> tuple[list[str], list[str], list[str], int]:
    """Task: (removed ids, their shards, their kept ids, groups whose digest hides different texts) for one group range."""
    tables = []
    for path, expected in files:
        if sha256_file(Path(path)) != expected:
            raise ChecksumMismatch(f"{path}: sha256 differs from what its writer recorded; the intermediate file is corrupt, "
                                   "nothing was published")
        tables.append(pq.read_table(path))
    if not tables:
        return [], [], [], 0
    table = pa.concat_tables(tables)
    shard_of = dict(zip(table.column("id").to_pylist(), table.column("shard").to_pylist()))
    by_group: dict[int, dict[str, list[str]]] = defaultdict(dict)
    for group, doc_id, key_text in zip(table.column("group").to_pylist(), table.column("id").to_pylist(), table.column("key_text").to_pylist()):
        by_group[group].setdefault(key_text, []).append(doc_id)
    removed_ids, kept_ids = [], []
    for by_text in by_group.values():
        for doc_id, kept_id in keepers_of_texts(by_text).items():
            removed_ids.append(doc_id)
            kept_ids.append(kept_id)
    return removed_ids, [shard_of[doc_id] for doc_id in removed_ids], kept_ids, sum(len(by_text) > 1 for by_text in by_group.values())


def find_exact_duplicates(upstream: StageManifest, config: DedupExactConfig, work_dir: Path, workers: int = 1) -> RemovalContext:
    """Global pass: digests per shard, colliding digests found in numpy, key texts compared per group range; all runner tasks."""
    shards = map_upstream_shards(digest_shard, upstream, (config,), workers, "exact digests")
    sizes = [len(result["digests"]) for result in shards]
    digests = np.concatenate([result["digests"] for result in shards] or [np.empty(0, DIGEST_DTYPE)])
    key_bytes = np.concatenate([result["key_bytes"] for result in shards] or [np.empty(0, np.int64)])
    paths, names = [result["path"] for result in shards], [result["shard"] for result in shards]
    del shards
    shard_of = np.repeat(np.arange(len(sizes), dtype=np.int32), sizes)
    row_of = np.concatenate([np.arange(size, dtype=np.int64) for size in sizes] or [np.empty(0, np.int64)])
    groups = colliding_groups(digests)
    del digests
    positions = np.concatenate(groups) if groups else np.zeros(0, np.int64)
    group_of = np.repeat(np.arange(len(groups), dtype=np.int64), [len(group) for group in groups])
    # Ranges follow the key texts the shuffle moves (those of colliding documents), and the workers.
    partitions = partition_count(workers, int(key_bytes[positions].sum()))
    del key_bytes
    spill_dir = Path(work_dir) / SPILL_DIR
    try:
        read_jobs, read_sizes = [], []
        for shard in np.unique(shard_of[positions]).tolist():
            mine = shard_of[positions] == shard
            read_jobs.append((paths[shard], names[shard], row_of[positions[mine]], group_of[mine], config, partitions, len(groups), str(spill_dir)))
            read_sizes.append(int(mine.sum()))
        by_range: dict[int, list[tuple[str, str]]] = defaultdict(list)
        for written in map_shards(key_text_shard, read_jobs, workers, "colliding texts", read_sizes):
            for part, path, sha256 in written:
                by_range[part].append((path, sha256))
        compare_jobs = [(sorted(by_range[part]),) for part in sorted(by_range)]
        decided = list(map_shards(keepers_of_group_range, compare_jobs, workers, "comparing texts", [len(job[0]) for job in compare_jobs]))
    finally:
        shutil.rmtree(spill_dir, ignore_errors=True)
    removed_ids = [doc_id for removed, _, _, _ in decided for doc_id in removed]
    removed_shards = [shard for _, shards, _, _ in decided for shard in shards]
    kept_ids = [kept_id for _, _, kept, _ in decided for kept_id in kept]
    count = len(removed_ids)
    table = removal_table(removed_ids, removed_shards, [RULE] * count, [None] * count, [None] * count,
                          [dumps_json({"kept_id": kept_id}) for kept_id in kept_ids])
    stats = {"documents": int(sum(sizes)), "duplicate_groups": len(groups), "partitions": partitions,
             "digest_collisions_with_different_text": sum(different for _, _, _, different in decided), "removed": count}
    return write_removal_table(work_dir, table, stats)


DEDUP_EXACT = StageDef(STAGE, VERSION, apply_removals, prepare=find_exact_duplicates)


def run_dedup_exact(config: DedupExactConfig, input_dir: Path, out_dir: Path, workers: int | None = None) -> StageManifest:
    return run_stage(DEDUP_EXACT, config, input_dir, out_dir, workers)
