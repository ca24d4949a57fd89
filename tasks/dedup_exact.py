"""Exact deduplication: one document per normalised text, the one with the smallest id.

Seed 001, "精确重复": lower-case, collapse whitespace, hash; the key also holds
the normalised string, so a digest collision can never merge two different
texts. Workers compute SHA-1 digests per shard; the global pass sorts them,
and only documents whose digests collide are read again to compare their
normalised strings. Memory is ~40 bytes per document, not the corpus text.
Rule `exact_duplicate`, detail {"kept_id": ...}.
"""
from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from manifests.stage_manifest import StageManifest
from tasks.lazy_task import lazy_task
from tasks.removal_map import Removal, RemovalContext, apply_removals, map_upstream_shards, write_removals
from tasks.shingles import normalise
from tasks.stage_runner import StageDef, run_stage

STAGE = "dedup_exact"
VERSION = "1"
RULE = "exact_duplicate"


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
    """Worker: (id, SHA-1 of the key text) for every document of one shard."""
    table = pq.read_table(shard_path, columns=["id", "text"])
    digests = [text_digest(exact_key_text(text, config)) for text in table.column("text").to_pylist()]
    return {"shard": shard, "path": shard_path, "ids": table.column("id").to_pylist(), "digests": digests}


def colliding_texts(shard_path: str, ids: list[str], config: DedupExactConfig) -> dict[str, str]:
    table = pq.read_table(shard_path, columns=["id", "text"])
    table = table.filter(pc.is_in(table.column("id"), value_set=pa.array(ids, pa.string())))
    return {doc_id: exact_key_text(text, config) for doc_id, text in zip(table.column("id").to_pylist(), table.column("text").to_pylist())}


def find_exact_duplicates(upstream: StageManifest, config: DedupExactConfig, work_dir: Path, workers: int = 1) -> RemovalContext:
    """Global pass: digests per shard in parallel, then string comparison inside each digest group."""
    shards = map_upstream_shards(digest_shard, upstream, (config,), workers, "exact digests")
    members: dict[bytes, list[tuple[str, str]]] = defaultdict(list)  # digest -> [(id, shard path)]
    for result in shards:
        for doc_id, digest in zip(result["ids"], result["digests"]):
            members[digest].append((doc_id, result["path"]))
    groups = [group for group in members.values() if len(group) > 1]
    wanted: dict[str, list[str]] = defaultdict(list)
    for group in groups:
        for doc_id, path in group:
            wanted[path].append(doc_id)
    key_texts: dict[str, str] = {}
    for path, ids in sorted(wanted.items()):
        key_texts.update(colliding_texts(path, ids, config))
    removals: dict[str, Removal] = {}
    for group in groups:
        kept_of = keepers_by_text([(doc_id, key_texts[doc_id]) for doc_id, _ in group])
        for doc_id, kept_id in kept_of.items():
            removals[doc_id] = Removal(RULE, None, None, {"kept_id": kept_id})
    stats = {"documents": sum(len(r["ids"]) for r in shards), "duplicate_groups": len(groups),
             "digest_collisions_with_different_text": sum(len({key_texts[d] for d, _ in g}) > 1 for g in groups),
             "removed": len(removals)}
    return write_removals(work_dir, removals, stats)


DEDUP_EXACT = StageDef(STAGE, VERSION, apply_removals, prepare=find_exact_duplicates)


def run_dedup_exact(config: DedupExactConfig, input_dir: Path, out_dir: Path, workers: int | None = None) -> StageManifest:
    return run_stage(DEDUP_EXACT, config, input_dir, out_dir, workers)


dedup_exact_task = lazy_task(run_dedup_exact, name="dedup_exact", task_run_name="dedup_exact")
