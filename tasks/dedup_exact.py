"""Exact deduplication: one document per normalised text, the one with the smallest id.

Seed 001, "精确重复": lower-case, collapse whitespace, hash; the key also holds
the normalised string, so a digest collision can never merge two different
texts. Workers compute SHA-1 digests per shard; the global pass sorts them,
and only documents whose digests collide are read again to compare their
normalised strings.

Memory of the global pass: 36 bytes per document (digest, key length, shard,
row; numpy arrays, no Python object per document) plus the key texts of one
batch of colliding documents (at most `COLLIDING_TEXT_BATCH_CHARS`) and the
Arrow removal map (~100 bytes per removed document).
Rule `exact_duplicate`, detail {"kept_id": ...}.
"""
from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from manifests.schema import dumps_json
from manifests.stage_manifest import StageManifest
from tasks.lazy_task import lazy_task
from tasks.removal_map import RemovalContext, apply_removals, map_upstream_shards, removal_table, write_removal_table
from tasks.shingles import normalise
from tasks.stage_runner import StageDef, run_stage

STAGE = "dedup_exact"
VERSION = "1"
RULE = "exact_duplicate"
DIGEST_DTYPE = np.dtype(f"S{hashlib.sha1().digest_size}")  # compared as raw bytes: every digest has all 20
COLLIDING_TEXT_BATCH_CHARS = 64 << 20  # key text held at once for string comparison; more means fewer shard re-reads
READ_BATCH_ROWS = 1024  # rows decoded at a time: worker and read-back memory follow this, not the shard size


@dataclass(frozen=True)
class DedupExactConfig:
    normalise_case_and_space: bool = True  # seed: lower-case + collapse whitespace before hashing


def exact_key_text(text: str, config: DedupExactConfig) -> str:
    return normalise(text) if config.normalise_case_and_space else text


def text_digest(text: str) -> bytes:
    return hashlib.sha1(text.encode("utf-8")).digest()


def keepers_by_text(members: list[tuple[str, str]]) -> dict[str, str]:
    """For (id, key text) pairs sharing a digest: removed id -> kept id, the smallest id per distinct text."""
    by_text: dict[str, list[str]] = defaultdict(list)
    for doc_id, key_text in members:
        by_text[key_text].append(doc_id)
    removed = {}
    for ids in by_text.values():
        kept_id = min(ids)
        removed.update({doc_id: kept_id for doc_id in ids if doc_id != kept_id})
    return removed


def digest_shard(shard_path: str, shard: str, config: DedupExactConfig) -> dict[str, Any]:
    """Worker: SHA-1 and length of every document's key text of one shard, in row order, as numpy arrays."""
    digests, key_chars = bytearray(), []
    for batch in pq.ParquetFile(shard_path, pre_buffer=False).iter_batches(READ_BATCH_ROWS, columns=["text"], use_threads=False):
        for text in batch.column("text").to_pylist():
            key_text = exact_key_text(text, config)
            digests += text_digest(key_text)
            key_chars.append(len(key_text))
    return {"shard": shard, "path": shard_path, "digests": np.frombuffer(bytes(digests), dtype=DIGEST_DTYPE),
            "key_chars": np.array(key_chars, dtype=np.int64)}


def colliding_groups(digests: np.ndarray) -> list[np.ndarray]:
    """Positions of the documents of every digest shared by two or more, in digest order."""
    order = np.argsort(digests, kind="stable")
    ordered = digests[order]
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    sizes = np.diff(np.append(starts, len(ordered)))
    return [order[start: start + size] for start, size in zip(starts[sizes > 1].tolist(), sizes[sizes > 1].tolist())]


def group_batches(groups: list[np.ndarray], key_chars: np.ndarray, budget_chars: int) -> Iterator[list[np.ndarray]]:
    """Consecutive groups whose key texts together stay within the budget (a larger group forms a batch alone)."""
    batch: list[np.ndarray] = []
    held = 0
    for group in groups:
        chars = int(key_chars[group].sum())
        if batch and held + chars > budget_chars:
            yield batch
            batch, held = [], 0
        batch.append(group)
        held += chars
    if batch:
        yield batch


def read_members(paths: list[str], shard_of: np.ndarray, row_of: np.ndarray, positions: np.ndarray,
                 config: DedupExactConfig) -> dict[int, tuple[str, str]]:
    """position -> (id, key text) of the given documents, streaming each shard they live in once.

    Record batches of READ_BATCH_ROWS rows, not whole shards: reading a shard at
    once costs several times its text in decode buffers, which the allocator keeps.
    """
    members: dict[int, tuple[str, str]] = {}
    for shard in np.unique(shard_of[positions]).tolist():
        wanted = positions[shard_of[positions] == shard]
        wanted = wanted[np.argsort(row_of[wanted], kind="stable")]
        wanted_rows = row_of[wanted]
        batch_start = 0
        for batch in pq.ParquetFile(paths[shard], pre_buffer=False).iter_batches(READ_BATCH_ROWS, columns=["id", "text"], use_threads=False):
            first, last = np.searchsorted(wanted_rows, [batch_start, batch_start + batch.num_rows])
            picked = batch.take(wanted_rows[first:last] - batch_start)
            for position, doc_id, text in zip(wanted[first:last].tolist(), picked.column("id").to_pylist(), picked.column("text").to_pylist()):
                members[position] = (doc_id, exact_key_text(text, config))
            batch_start += batch.num_rows
        pa.default_memory_pool().release_unused()  # hand the decode buffers back before the next shard
    return members


def find_exact_duplicates(upstream: StageManifest, config: DedupExactConfig, work_dir: Path, workers: int = 1) -> RemovalContext:
    """Global pass: digests per shard in parallel, then string comparison inside each digest group, batch by batch."""
    shards = map_upstream_shards(digest_shard, upstream, (config,), workers, "exact digests")
    sizes = [len(result["digests"]) for result in shards]
    digests = np.concatenate([result["digests"] for result in shards] or [np.empty(0, DIGEST_DTYPE)])
    key_chars = np.concatenate([result["key_chars"] for result in shards] or [np.empty(0, np.int64)])
    paths = [result["path"] for result in shards]
    del shards
    shard_of = np.repeat(np.arange(len(sizes), dtype=np.int32), sizes)
    row_of = np.concatenate([np.arange(size, dtype=np.int32) for size in sizes] or [np.empty(0, np.int32)])
    groups = colliding_groups(digests)
    removed_ids: list[str] = []
    kept_ids: list[str] = []
    different_texts = 0
    for batch in group_batches(groups, key_chars, COLLIDING_TEXT_BATCH_CHARS):
        members = read_members(paths, shard_of, row_of, np.concatenate(batch), config)
        for group in batch:
            group_members = [members[position] for position in group.tolist()]
            different_texts += len({key_text for _, key_text in group_members}) > 1
            for doc_id, kept_id in keepers_by_text(group_members).items():
                removed_ids.append(doc_id)
                kept_ids.append(kept_id)
    count = len(removed_ids)
    table = removal_table(removed_ids, [RULE] * count, [None] * count, [None] * count,
                          [dumps_json({"kept_id": kept_id}) for kept_id in kept_ids])
    stats = {"documents": int(sum(sizes)), "duplicate_groups": len(groups), "digest_collisions_with_different_text": different_texts,
             "removed": count}
    return write_removal_table(work_dir, table, stats)


DEDUP_EXACT = StageDef(STAGE, VERSION, apply_removals, prepare=find_exact_duplicates)


def run_dedup_exact(config: DedupExactConfig, input_dir: Path, out_dir: Path, workers: int | None = None) -> StageManifest:
    return run_stage(DEDUP_EXACT, config, input_dir, out_dir, workers)


dedup_exact_task = lazy_task(run_dedup_exact, name="dedup_exact", task_run_name="dedup_exact")
