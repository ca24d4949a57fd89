"""Held-out split: choose validation documents before the tokenizer ever sees the corpus.

Seed 001 (evaluation section): group near-duplicates *before* splitting, or a
nominally held-out document is almost a training document. A duplicate family
is the connected component of the exact (dedup_exact: removed -> kept_id) and
fuzzy (dedup_fuzzy: clusters.parquet) relations, removed members included; a
whole family falls on one side. When the dedup stages are absent from the run,
every document is its own family.

Nothing is removed here: a validation document keeps flowing, marked
`meta.split = "validation"` with a `routed` audit row (rule `held_out`).

Planning (`plan_split`) is runner tasks over partitioned spill files
(tasks/corpus/split_tasks.py); the flow host sends paths and receives slices
and per-range totals. Only documents in a duplicate relation have a family
other than themselves, and those families come from the relations alone,
keyed by keeper (an exact removal names its keeper, a near-duplicate cluster
names its keeper), so a family never spans two partitions. The per-source
choice in seeded order is found without a global sort: tasks total each rank
range per source, the host finds the range where each source's choice stops,
and only that range is decided family by family.

Memory bound. With N documents in S input shards and P partitions (P =
partition_count(workers, 64 B × N): 2 × workers, or one per PARTITION_BYTES =
256 MB of spilled rows when that is more), the shard-reading steps take runs of
consecutive shards, at most P runs, so:
* the flow host holds O(P²) slice records (~300 B each) per step, one
  validation file entry per shard and (families, documents, bytes) per source
  and rank range, and no row: at 1B documents (P ≈ 250), about 20 MB of slices
  plus ~300 B a shard, whatever N is for a given shard size;
* every task holds one run's (id, source, size) rows or one partition of one
  step (≈ 64 B × N / P, so ≈ PARTITION_BYTES once P follows the data), a few
  times over while it sorts, and one 2,048-row read batch of texts.
A map of a single job runs in the flow host under the local process pool
(stage_runner.map_shards; never on Dask): then the host also holds that one
task's partition, which is bounded the same way.
"""
from __future__ import annotations

import json
import shutil
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from manifests.run_dir import find_stage
from manifests.schema import DOC_SCHEMA, dumps_json
from manifests.stage_manifest import StageManifest
from tasks.corpus.split_rule import SplitConfig, seeded_rank, taken_before_stop
from tasks.corpus.split_tasks import (VALIDATION_SCHEMA, choose_in_range, doc_sizes, exact_relations, family_members, fuzzy_relations,
                                      rank_documents, rank_range_totals, resolve_keys, write_validation_files)
from tasks.dedup.near_dup_files import Slice
from tasks.dedup.removal_map import ShardFiles, ShardSlice, shard_rows
from tasks.runner.stage_runner import ShardOutcome, StageDef, map_shards, partition_count, run_stage

STAGE = "split"
VERSION = "1"
VALIDATION = "validation"
HELD_OUT_RULE = "held_out"
CLUSTERS_ARTIFACT = "clusters.parquet"
VALIDATION_DIR = "validation"  # the held-out choice, one file per input shard: each shard job reads only its own
SPLIT_DOCS_SCHEMA = pa.schema([("id", pa.string()), ("source", pa.string()), ("n_bytes", pa.int64())])
SPILL_DIR = "_split_spill"  # the planning tasks' shuffle files, under the stage's work directory, removed after planning
SPILL_BYTES_PER_DOC = 64  # a document's row in the shuffle, for the partition count


class UnionFind:
    """Families of document ids linked by duplicate relations (the in-memory reference, for small inputs)."""

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
    """(member, kept) pairs found by dedup_exact and dedup_fuzzy in this run, read here (the in-memory reference)."""
    exact, clusters = relation_files(run)
    for audit_path in exact:
        table = pq.read_table(audit_path, columns=["id", "action", "detail"])
        for doc_id, action, detail in zip(*(table.column(c).to_pylist() for c in ("id", "action", "detail"))):
            kept_id = json.loads(detail).get("kept_id") if action == "removed" else None
            if kept_id:
                yield doc_id, kept_id
    for path in clusters:
        table = pq.read_table(path, columns=["id", "kept_id"])
        yield from zip(table.column("id").to_pylist(), table.column("kept_id").to_pylist())


def relation_files(run: Path) -> tuple[list[str], list[str]]:
    """The dedup_exact audit files and dedup_fuzzy clusters files of this run (none for a stage that is absent)."""
    exact, clusters = [], []
    try:
        _, manifest = find_stage(run, "dedup_exact")
        exact = [str(manifest.path_of(f)) for f in manifest.files("audit")]
    except KeyError:
        pass
    try:
        _, manifest = find_stage(run, "dedup_fuzzy")
        clusters = [str(manifest.path_of(f)) for f in manifest.files("artifact") if Path(f.path).name == CLUSTERS_ARTIFACT]
    except KeyError:
        pass
    return exact, clusters


def families_of(doc_ids: list[str], relations: Iterable[tuple[str, str]]) -> tuple[list[str], list[int]]:
    """Family id and family size (removed members counted) of each surviving document, in `doc_ids` order.

    The in-memory definition (any relation graph) that `plan_split`'s tasks reproduce at scale.
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


def choose_validation(docs: pa.Table, family: list[str], config: SplitConfig) -> set[str]:
    """Per source, whole families in seeded order until the fraction (or token budget) is reached (the in-memory reference).

    `docs` has columns id, source and n_bytes. A family is assigned to the source
    of its smallest surviving id, so a family never splits across sources either.
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
        stop = taken_before_stop(np.cumsum(doc_counts[ordered]) - doc_counts[ordered],
                                 np.cumsum(family_bytes[ordered]) - family_bytes[ordered], doc_counts[members].sum(), config)
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


def cutoff_decisions(totals: list[dict[str, tuple[int, int, int]]], config: SplitConfig) -> list[dict[str, tuple]]:
    """Per rank range, what `choose_in_range` does for each source, from (families, documents, bytes) per range and source.

    Ranges before the one where a source's choice stops are taken whole; that
    range is decided family by family from the running totals where it starts;
    later ranges give nothing. A source's last range is always decided family by
    family (its last family stays in training); a source of one family gives nothing.
    """
    decisions: list[dict[str, tuple]] = [{} for _ in totals]
    for source in sorted({source for by_source in totals for source in by_source}):
        ranges = [(index, by_source[source]) for index, by_source in enumerate(totals) if source in by_source]
        if sum(families for _, (families, _, _) in ranges) < 2:
            continue  # one family cannot be on both sides; it trains
        source_docs = sum(docs for _, (_, docs, _) in ranges)
        docs_before = bytes_before = 0
        for position, (index, (_, docs, size)) in enumerate(ranges):
            last_range = position == len(ranges) - 1
            if last_range or taken_before_stop([docs_before + docs], [bytes_before + size], source_docs, config) == 0:
                decisions[index][source] = ("cut", docs_before, bytes_before, source_docs, last_range)
                break
            decisions[index][source] = ("all",)
            docs_before, bytes_before = docs_before + docs, bytes_before + size
    return decisions


def mapped(fn: Any, jobs: list[tuple], workers: int, label: str) -> list[dict[str, Any]]:
    """Every job's result, in job order (each result names its index)."""
    return sorted(map_shards(fn, jobs, workers, label, [1] * len(jobs)), key=lambda result: result["index"])


def by_partition(results: list[dict[str, Any]], partitions: int) -> list[list[Slice]]:
    """Partition p's slices from every writer, in writer order."""
    return [[result["slices"][part] for result in results if part in result["slices"]] for part in range(partitions)]


def plan_split(upstream: StageManifest, config: SplitConfig, work_dir: Path, workers: int = 1) -> SplitPlan:
    """Families and the validation choice, planned by runner tasks over spill files (module docstring: steps and bounds)."""
    data_files = upstream.files("data")
    names = [Path(f.path).stem for f in data_files]
    partitions = partition_count(workers, sum(f.rows or 0 for f in data_files) * SPILL_BYTES_PER_DOC)
    spill = Path(work_dir) / SPILL_DIR
    try:
        return plan_with_spill(upstream, config, Path(work_dir), spill, names, partitions, workers)
    finally:
        shutil.rmtree(spill, ignore_errors=True)


def runs_of(items: list[Any], runs: int) -> list[list[Any]]:
    """`items` cut into at most `runs` runs of consecutive items, as equal in length as can be (no empty run)."""
    count = min(len(items), runs)
    bounds = [len(items) * run // count for run in range(count + 1)] if count else [0]
    return [items[start:stop] for start, stop in zip(bounds, bounds[1:])]


def plan_with_spill(upstream: StageManifest, config: SplitConfig, work_dir: Path, spill: Path, names: list[str], partitions: int,
                    workers: int) -> SplitPlan:
    shard_runs = runs_of(list(enumerate(str(upstream.path_of(f)) for f in upstream.files("data"))), partitions)
    sizes = mapped(doc_sizes, [([(path, index) for index, path in run], group, partitions, str(spill)) for group, run in enumerate(shard_runs)],
                   workers, "split sizes")
    exact_files, cluster_files = relation_files(Path(upstream.directory).parent)
    exact = mapped(exact_relations, [(run, group, partitions, str(spill)) for group, run in enumerate(runs_of(exact_files, partitions))],
                   workers, "split exact")
    row_groups = [(path, group) for path in cluster_files for group in range(pq.ParquetFile(path).metadata.num_row_groups)]
    fuzzy = mapped(fuzzy_relations, [(run, group, partitions, str(spill)) for group, run in enumerate(runs_of(row_groups, partitions))],
                   workers, "split clusters")
    relations = by_partition([*exact, *fuzzy], partitions)
    del exact, fuzzy
    keys = mapped(resolve_keys, [(relations[part], part, partitions, str(spill)) for part in range(partitions) if relations[part]],
                  workers, "split keys")
    families = by_partition(mapped(family_members, [(slices, part, partitions, str(spill)) for part, slices in
                                                    enumerate(by_partition(keys, partitions)) if slices], workers, "split families"),
                            partitions)
    docs = by_partition(sizes, partitions)
    ranked = by_partition(mapped(rank_documents, [(docs[part], families[part], part, partitions, config.seed, str(spill))
                                                  for part in range(partitions) if docs[part]], workers, "split ranks"), partitions)
    del docs, families
    totals = mapped(rank_range_totals, [(ranked[part], part) for part in range(partitions)], workers, "split totals")
    decisions = cutoff_decisions([result["sources"] for result in totals], config)
    group_starts = [run[0][0] for run in shard_runs]
    chosen = by_partition(mapped(choose_in_range, [(ranked[part], part, decisions[part], config, group_starts, str(spill))
                                                   for part in range(partitions) if decisions[part]], workers, "split choice"), len(shard_runs))
    written = mapped(write_validation_files, [(chosen[group], group, [(index, names[index]) for index, _ in run], str(work_dir), VALIDATION_DIR)
                                              for group, run in enumerate(shard_runs) if chosen[group]], workers, "split validation")
    validation = ShardFiles(VALIDATION_DIR, {shard: entry for result in written for shard, entry in result["files"].items()})
    return SplitPlan(validation, validation.rows(), sum(result["families"] for result in totals), sum(result["documents"] for result in sizes))


def split_shard(docs: pa.Table, config: SplitConfig, part: ShardSlice) -> ShardOutcome:
    validation = shard_rows(part, VALIDATION_SCHEMA)
    if not validation.num_rows:
        return ShardOutcome(docs, [])
    row_of_doc = pc.index_in(docs.column("id"), value_set=validation.column("id"))
    chosen = pc.is_valid(row_of_doc)
    if not pc.any(chosen).as_py():
        return ShardOutcome(docs, [])
    held = validation.take(pc.filter(row_of_doc, chosen)).to_pylist()  # in document order
    positions = np.flatnonzero(chosen.to_numpy(zero_copy_only=False)).tolist()
    # Only the held-out documents' meta changes: the other columns, texts included, stay Arrow (no Python row per document).
    meta = docs.column("meta").to_pylist()
    audit = []
    for position, row in zip(positions, held):
        routed = json.loads(meta[position])
        routed["split"] = VALIDATION
        meta[position] = dumps_json(routed)
        detail = {"family_id": row["family_id"], "family_size": row["family_size"], "seed": config.seed}
        audit.append({"id": row["id"], "action": "routed", "rule": HELD_OUT_RULE, "value": row["family_size"], "threshold": None, "detail": detail})
    return ShardOutcome(routed_docs(docs, meta), audit)


def routed_docs(docs: pa.Table, meta: list[str]) -> pa.Table:
    """`docs` with its meta column replaced, as docs_table lays a document table out (DOC_SCHEMA, empty url/text for null)."""
    columns = {name: docs.column(name) for name in DOC_SCHEMA.names}
    columns["meta"] = pa.array(meta, pa.string())
    for name in ("url", "text"):
        columns[name] = pc.fill_null(columns[name], "")
    return pa.table([columns[name] for name in DOC_SCHEMA.names], schema=DOC_SCHEMA).combine_chunks()


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
    validation = validation_mask(table.column("meta"))
    return table.filter(pa.array(validation if which == VALIDATION else ~validation, type=pa.bool_()))


def validation_mask(meta: pa.ChunkedArray) -> np.ndarray:
    """is_validation of every row, parsing only the meta texts that can hold a "split" key: JSON spells one either
    literally or with a \\u escape, so a text with neither is a training row (no json.loads per document)."""
    maybe = pc.or_(pc.match_substring(meta, '"split"'), pc.match_substring(meta, "\\u"))
    rows = np.flatnonzero(maybe.fill_null(False).to_numpy(zero_copy_only=False))
    mask = np.zeros(len(meta), dtype=bool)
    mask[rows] = [is_validation(m) for m in meta.take(pa.array(rows, pa.int64())).to_pylist()]
    return mask
