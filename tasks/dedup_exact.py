"""Exact deduplication: one document per normalised text, the one with the smallest id.

Seed 001, "精确重复": lower-case, collapse whitespace, hash; the key also holds
the normalised string, so a digest collision can never merge two different
texts. Workers compute SHA-1 digests per shard; the global pass sorts them,
and only documents whose digests collide are read again to compare their
normalised strings.

Memory of the global pass: 36 bytes per document (digest 20, key length 8,
shard 4, row 4; numpy arrays, no Python object per document) and 28 more
while the digests are sorted, plus one copy of each distinct key text of one
batch of digest groups (at most COLLIDING_TEXT_BATCH_CHARS characters; more
duplicates mean more batches, not more memory) and the Arrow removal map
(~100 bytes per removed document).
Rule `exact_duplicate`, detail {"kept_id": ...}.
"""
from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from manifests.schema import dumps_json
from manifests.stage_manifest import StageManifest
from tasks.lazy_task import lazy_task
from tasks.removal_map import RemovalContext, apply_removals, map_upstream_shards, removal_table, write_removal_table
from tasks.shingles import normalise
from tasks.stage_runner import StageDef, counted, run_stage

STAGE = "dedup_exact"
VERSION = "1"
RULE = "exact_duplicate"
DIGEST_DTYPE = np.dtype(f"S{hashlib.sha1().digest_size}")  # compared as raw bytes: every digest has all 20
COLLIDING_TEXT_BATCH_CHARS = 16 << 20  # key text held at once for string comparison; more means fewer shard re-reads
READ_BATCH_ROWS = 1024  # rows decoded at a time: worker and read-back memory follow this, not the shard size


@dataclass(frozen=True)
class DedupExactConfig:
    normalise_case_and_space: bool = True  # seed: lower-case + collapse whitespace before hashing


def exact_key_text(text: str, config: DedupExactConfig) -> str:
    return normalise(text) if config.normalise_case_and_space else text


def text_digest(text: str) -> bytes:
    return hashlib.sha1(text.encode("utf-8")).digest()


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
    """Consecutive groups whose held key texts stay within the budget together (a larger group forms a batch alone).

    A group holds one copy of each distinct key text, so it is counted at its longest member.
    """
    batch: list[np.ndarray] = []
    held = 0
    for group in groups:
        chars = int(key_chars[group].max())
        if batch and held + chars > budget_chars:
            yield batch
            batch, held = [], 0
        batch.append(group)
        held += chars
    if batch:
        yield batch


def read_group_texts(paths: list[str], shard_of: np.ndarray, row_of: np.ndarray, batch: list[np.ndarray],
                     config: DedupExactConfig) -> list[dict[str, list[str]]]:
    """For each digest group of the batch, {key text: ids}, streaming each shard its members live in once.

    Equal texts are kept once (a later copy is compared, then dropped). Shards
    are read in record batches of READ_BATCH_ROWS rows, not whole: reading a
    shard at once costs several times its text in decode buffers.
    """
    positions = np.concatenate(batch)
    group_of = np.repeat(np.arange(len(batch)), [len(group) for group in batch])
    by_text: list[dict[str, list[str]]] = [{} for _ in batch]
    for shard in np.unique(shard_of[positions]).tolist():
        in_shard = np.flatnonzero(shard_of[positions] == shard)
        in_shard = in_shard[np.argsort(row_of[positions[in_shard]], kind="stable")]
        rows = row_of[positions[in_shard]]
        batch_start = 0
        for records in pq.ParquetFile(paths[shard], pre_buffer=False).iter_batches(READ_BATCH_ROWS, columns=["id", "text"], use_threads=False):
            first, last = np.searchsorted(rows, [batch_start, batch_start + records.num_rows])
            picked = records.take(rows[first:last] - batch_start)
            for group, doc_id, text in zip(group_of[in_shard[first:last]].tolist(), picked.column("id").to_pylist(),
                                           picked.column("text").to_pylist()):
                by_text[group].setdefault(exact_key_text(text, config), []).append(doc_id)
            batch_start += records.num_rows
        pa.default_memory_pool().release_unused()  # hand the decode buffers back before the next shard
    return by_text


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
    for batch in counted("colliding groups", group_batches(groups, key_chars, COLLIDING_TEXT_BATCH_CHARS), len(groups), size=len):
        for by_text in read_group_texts(paths, shard_of, row_of, batch, config):
            different_texts += len(by_text) > 1
            for doc_id, kept_id in keepers_of_texts(by_text).items():
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
