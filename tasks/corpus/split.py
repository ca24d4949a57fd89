"""Held-out split: choose validation documents before the tokenizer ever sees the corpus.

Seed 001 (evaluation section): group near-duplicates *before* splitting, or a
nominally held-out document is almost a training document. A duplicate family
is the connected component of the exact (dedup_exact: removed -> kept_id) and
fuzzy (dedup_fuzzy: clusters.parquet) relations, removed members included; a
whole family falls on one side. When the dedup stages are absent from the run,
every document is its own family.

Nothing is removed here: a validation document keeps flowing, marked
`meta.split = "validation"` with a `routed` audit row (rule `held_out`).
"""
from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from manifests.run_dir import find_stage
from manifests.schema import DOC_SCHEMA, docs_table
from manifests.stage_manifest import StageManifest
from tasks.dedup.removal_map import SHARD_COLUMN, ShardFiles, ShardSlice, map_upstream_shards, shard_rows, write_by_shard
from tasks.runner.stage_runner import ShardOutcome, StageDef, run_stage

STAGE = "split"
VERSION = "1"
VALIDATION = "validation"
HELD_OUT_RULE = "held_out"
CLUSTERS_ARTIFACT = "clusters.parquet"
VALIDATION_DIR = "validation"  # the held-out choice, one file per input shard: each shard job reads only its own
VALIDATION_SCHEMA = pa.schema([("id", pa.string()), ("family_id", pa.string()), ("family_size", pa.int64())])
SPLIT_DOCS_SCHEMA = pa.schema([("id", pa.string()), ("source", pa.string()), ("n_bytes", pa.int64())])


@dataclass(frozen=True)
class SplitConfig:
    # Seed 001 Lab 2 holds out ~5% (1,000 of 21,990 stories) before fitting BPE.
    validation_fraction: float = 0.05  # of each source's documents
    # Alternative budget per source, in estimated tokens (UTF-8 bytes / bytes_per_token_estimate):
    # the tokenizer does not exist yet, so the budget can only be an estimate.
    validation_tokens_per_source: int | None = None
    bytes_per_token_estimate: float = 4.0
    min_validation_docs_per_source: int = 1  # a source with >= 2 families always gets held-out loss
    seed: int = 0


class UnionFind:
    """Families of document ids linked by duplicate relations."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, item: str) -> str:
        self.parent.setdefault(item, item)
        root = item
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[item] != root:
            self.parent[item], item = root, self.parent[item]
        return root

    def union(self, a: str, b: str) -> None:
        root_a, root_b = self.find(a), self.find(b)
        if root_a != root_b:
            # the smaller id becomes the root, so family ids do not depend on edge order
            low, high = sorted((root_a, root_b))
            self.parent[high] = low


def duplicate_relations(run: Path) -> Iterable[tuple[str, str]]:
    """(member, kept) pairs found by dedup_exact and dedup_fuzzy in this run; none when they are absent."""
    try:
        _, exact = find_stage(run, "dedup_exact")
    except KeyError:
        exact = None
    if exact is not None:
        for audit_file in exact.files("audit"):
            table = pq.read_table(exact.path_of(audit_file), columns=["id", "action", "detail"])
            for doc_id, action, detail in zip(*(table.column(c).to_pylist() for c in ("id", "action", "detail"))):
                kept_id = json.loads(detail).get("kept_id") if action == "removed" else None
                if kept_id:
                    yield doc_id, kept_id
    try:
        _, fuzzy = find_stage(run, "dedup_fuzzy")
    except KeyError:
        return
    for artifact in fuzzy.files("artifact"):
        if Path(artifact.path).name == CLUSTERS_ARTIFACT:
            table = pq.read_table(fuzzy.path_of(artifact), columns=["id", "kept_id"])
            yield from zip(table.column("id").to_pylist(), table.column("kept_id").to_pylist())


def families_of(doc_ids: list[str], relations: Iterable[tuple[str, str]]) -> tuple[list[str], list[int]]:
    """Family id and family size (removed members counted) of each surviving document, in `doc_ids` order.

    Only documents that take part in a duplicate relation enter the union-find;
    every other document is a family of one, named after itself.
    """
    links = UnionFind()
    for member, kept in relations:
        links.union(member, kept)
    sizes: dict[str, int] = defaultdict(int)
    for item in list(links.parent):
        sizes[links.find(item)] += 1
    family = [links.find(doc_id) if doc_id in links.parent else doc_id for doc_id in doc_ids]
    return family, [sizes.get(root, 1) for root in family]


def seeded_rank(seed: int, key: str) -> str:
    """A stable pseudo-random order: independent of shard layout and input order."""
    return hashlib.blake2b(f"{seed}\x00{key}".encode("utf-8"), digest_size=8).hexdigest()


def choose_validation(docs: pa.Table, family: list[str], config: SplitConfig) -> set[str]:
    """Per source, whole families in seeded order until the fraction (or token budget) is reached.

    `docs` has columns id, source and n_bytes. A family is assigned to the source
    of its smallest surviving id, so a family never splits across sources either.
    Columnar: one row per document, one array entry per family, no object per document.
    """
    table = docs.append_column("family", pa.array(family, pa.string())).sort_by([("family", "ascending"), ("id", "ascending")])
    roots_by_doc = table.column("family").to_numpy(zero_copy_only=False)
    if not len(roots_by_doc):
        return set()
    starts = np.flatnonzero(np.r_[True, roots_by_doc[1:] != roots_by_doc[:-1]])
    roots = roots_by_doc[starts]
    doc_counts = np.diff(np.r_[starts, len(roots_by_doc)])
    family_bytes = np.add.reduceat(table.column("n_bytes").to_numpy().astype(np.int64), starts)
    family_source = table.column("source").to_numpy(zero_copy_only=False)[starts]  # the source of each family's smallest id
    chosen_roots: list[str] = []
    for source in sorted(set(family_source.tolist())):
        members = np.flatnonzero(family_source == source)
        if len(members) < 2:
            continue  # one family cannot be on both sides; it trains
        ranks = np.array([int(seeded_rank(config.seed, root), 16) for root in roots[members].tolist()], dtype=np.uint64)
        ordered = members[np.argsort(ranks, kind="stable")][:-1]  # at least one family stays in training
        docs_before = np.cumsum(doc_counts[ordered]) - doc_counts[ordered]
        if config.validation_tokens_per_source is not None:
            tokens_before = (np.cumsum(family_bytes[ordered]) - family_bytes[ordered]) / config.bytes_per_token_estimate
            reached = tokens_before >= config.validation_tokens_per_source
        else:
            reached = docs_before >= config.validation_fraction * doc_counts[members].sum()
        done = reached & (docs_before >= config.min_validation_docs_per_source)
        stop = int(np.argmax(done)) if done.any() else len(ordered)
        chosen_roots += roots[ordered[:stop]].tolist()
    chosen = table.filter(pc.is_in(table.column("family"), value_set=pa.array(chosen_roots, pa.string())))
    return set(chosen.column("id").to_pylist())


@dataclass
class SplitPlan:
    """The prepare pass's decision, written by input shard; a shard job is handed only its own file's path
    and digest (`for_shard`), never the whole choice: its size and reads do not grow with the corpus."""

    validation: ShardFiles  # VALIDATION_DIR/part-XXXXX.parquet: id, family_id, family_size of that shard's validation documents
    validation_documents: int
    families: int
    documents: int

    def for_shard(self, shard: str) -> ShardSlice:
        return self.validation.for_shard(shard)

    def summary(self) -> dict[str, Any]:
        return {"validation_documents": self.validation_documents, "documents": self.documents, "families": self.families}

    def artifacts(self) -> list[tuple[str, int | None]]:
        return self.validation.artifacts()


def shard_split_sizes(shard_path: str, shard: str) -> dict[str, Any]:
    """Task: id, source and UTF-8 size of every document of one shard, the columns the split plans from;
    the texts are read here, on a worker, and go no further."""
    table = pq.read_table(shard_path, columns=["id", "source", "text"])
    n_bytes = pc.binary_length(table.column("text").cast(pa.binary())).cast(pa.int64())
    return {"shard": shard, "docs": pa.table([table.column("id"), table.column("source"), n_bytes], schema=SPLIT_DOCS_SCHEMA)}


def plan_split(upstream: StageManifest, config: SplitConfig, work_dir: Path, workers: int = 1) -> SplitPlan:
    """Families and the validation choice from ids, sources and byte sizes (one runner task per shard reads the texts).

    The flow host holds those columns (~40 bytes a document plus the id) and
    the duplicate relations; no text and no object per document besides the id strings.
    """
    shards = map_upstream_shards(shard_split_sizes, upstream, (), workers, "split sizes")
    docs = pa.concat_tables([SPLIT_DOCS_SCHEMA.empty_table(), *(shard["docs"] for shard in shards)]).combine_chunks()
    shard_of = np.repeat(np.arange(len(shards), dtype=np.int32), [shard["docs"].num_rows for shard in shards])
    names = [shard["shard"] for shard in shards]
    del shards
    doc_ids = docs.column("id").to_pylist()
    family, sizes = families_of(doc_ids, duplicate_relations(Path(upstream.directory).parent))
    chosen = choose_validation(docs, family, config)
    picked = [i for i, doc_id in enumerate(doc_ids) if doc_id in chosen]
    table = pa.table([pa.array([doc_ids[i] for i in picked], pa.string()), pa.array([family[i] for i in picked], pa.string()),
                      pa.array([sizes[i] for i in picked], pa.int64()), pa.array([names[shard_of[i]] for i in picked], pa.string())],
                     names=[*VALIDATION_SCHEMA.names, SHARD_COLUMN])
    return SplitPlan(write_by_shard(Path(work_dir), VALIDATION_DIR, table), table.num_rows, len(set(family)), len(doc_ids))


def split_shard(docs: pa.Table, config: SplitConfig, part: ShardSlice) -> ShardOutcome:
    validation = shard_rows(part, VALIDATION_SCHEMA)
    if not validation.num_rows:
        return ShardOutcome(docs, [])
    row_of_doc = pc.index_in(docs.column("id"), value_set=validation.column("id"))
    chosen = pc.is_valid(row_of_doc)
    if not pc.any(chosen).as_py():
        return ShardOutcome(docs, [])
    details = {row["id"]: row for row in validation.take(pc.filter(row_of_doc, chosen)).to_pylist()}
    rows = docs.to_pylist()
    audit = []
    for row in rows:
        held = details.get(row["id"])
        if held is None:
            continue
        meta = json.loads(row["meta"])
        meta["split"] = VALIDATION
        row["meta"] = meta
        detail = {"family_id": held["family_id"], "family_size": held["family_size"], "seed": config.seed}
        audit.append({"id": row["id"], "action": "routed", "rule": HELD_OUT_RULE, "value": held["family_size"], "threshold": None, "detail": detail})
    return ShardOutcome(docs_table(rows), audit)


def is_validation(meta_json: str) -> bool:
    return json.loads(meta_json).get("split") == VALIDATION


SPLIT = StageDef(STAGE, VERSION, split_shard, prepare=plan_split)


def run_split(config: SplitConfig, input_dir: Path, out_dir: Path, workers: int | None = None) -> StageManifest:
    return run_stage(SPLIT, config, input_dir, out_dir, workers)



def iter_split_docs(split_dir: Path, which: str, columns: list[str] | None = None) -> Iterable[pa.Table]:
    """Documents of one side of the split ("train" or "validation"), one table per shard, in shard order."""
    from manifests.stage_manifest import read_manifest

    if which not in ("train", VALIDATION):
        raise ValueError(f"split side must be 'train' or '{VALIDATION}', got {which!r}")
    manifest = read_manifest(Path(split_dir), verify=False)
    for data_file in manifest.files("data"):
        yield split_side_of_shard(manifest.path_of(data_file), which, columns)


def split_side_of_shard(shard_path: Path | str, which: str, columns: list[str] | None = None) -> pa.Table:
    """One split shard's documents of one side ("train" or "validation"), in row order."""
    wanted = list(dict.fromkeys([*(columns or DOC_SCHEMA.names), "meta"]))
    table = pq.read_table(shard_path, columns=wanted)
    mask = [is_validation(m) == (which == VALIDATION) for m in table.column("meta").to_pylist()]
    return table.filter(pa.array(mask, type=pa.bool_()))
