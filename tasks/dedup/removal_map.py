"""Global stages (dedup, decontamination): a corpus-wide pass decides, a per-shard pass applies.

The decision is a removal map keyed by stable document id, so it does not
depend on how the corpus is cut into shards; applying it is a filter that
writes one audit row per removed document.

The map is published partitioned by the input shard each removed document
sits in (`removals/part-XXXXX.parquet`, only for shards that lose documents),
and each shard job is handed its own file's path and digest: a shard job
reads its own removals and nothing else, so its cost does not grow with the
corpus (a whole-corpus lookup per shard made dedup quadratic in N).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from manifests.atomic import atomic_write_parquet
from manifests.digest import sha256_file
from manifests.schema import dumps_json
from manifests.stage_manifest import StageManifest
from tasks.dedup.minhash import ChecksumMismatch
from tasks.dedup.near_dup_files import Slice
from tasks.dedup.spill_reader import SpillFiles
from tasks.dedup.slice_index import indexed_slice, numbered_file
from tasks.dedup.table_slices import read_table_slices
from tasks.runner.stage_runner import ShardOutcome, map_shards


REMOVALS_DIR = "removals"
REMOVALS_SCHEMA = pa.schema([("id", pa.string()), ("rule", pa.string()), ("value", pa.float64()),
                             ("threshold", pa.float64()), ("detail", pa.string())])
SHARD_COLUMN = "shard"  # the input shard of each row, while a global result is being partitioned


@dataclass(frozen=True)
class Removal:
    """Why one document goes: the audit row without id/action (the plumbing adds stage)."""

    rule: str
    value: float | None
    threshold: float | None
    detail: dict[str, Any]


@dataclass(frozen=True)
class ShardSlice:
    """One shard's part of a global result: its file and that file's sha256, or (None, None) when the shard has none.

    This, not the whole result, is what a shard job receives: a few hundred bytes whatever the corpus size.
    """

    path: str | None
    sha256: str | None


NO_ROWS = ShardSlice(None, None)


@dataclass
class ShardFiles:
    """A global result written as one Parquet file per input shard: shard -> (path, sha256, rows)."""

    relative_dir: str  # under the stage directory, e.g. "removals"
    files: dict[str, tuple[str, str, int]] = field(default_factory=dict)

    def for_shard(self, shard: str) -> ShardSlice:
        path, sha256, _ = self.files.get(shard, (None, None, 0))
        return ShardSlice(path, sha256)

    def artifacts(self) -> list[tuple[str, int | None]]:
        return [(f"{self.relative_dir}/{shard}.parquet", rows) for shard, (_, _, rows) in sorted(self.files.items())]

    def rows(self) -> int:
        return sum(rows for _, _, rows in self.files.values())


def tables_by_shard(table: pa.Table) -> list[tuple[str, pa.Table]]:
    """(shard, its rows sorted by id, without the shard column) for every shard `table` (with a SHARD_COLUMN) has rows of."""
    table = table.sort_by([(SHARD_COLUMN, "ascending"), ("id", "ascending")]).combine_chunks()
    shards = table.column(SHARD_COLUMN).to_numpy(zero_copy_only=False)
    starts = np.flatnonzero(np.r_[True, shards[1:] != shards[:-1]]) if len(shards) else np.zeros(0, np.int64)
    bounds = np.append(starts, len(shards)).tolist()
    rows = table.drop_columns([SHARD_COLUMN])
    return [(str(shards[start]), rows.slice(start, stop - start)) for start, stop in zip(bounds, bounds[1:])]


def write_shard_file(work_dir: Path, relative_dir: str, shard: str, rows: pa.Table) -> tuple[str, str, str, int]:
    """One shard's file of a global result: (shard, path, sha256, rows)."""
    path = Path(work_dir) / relative_dir / f"{shard}.parquet"
    atomic_write_parquet(path, rows)
    return shard, str(path), sha256_file(path), rows.num_rows


def write_by_shard(work_dir: Path, relative_dir: str, table: pa.Table) -> ShardFiles:
    """Write `table` (with a SHARD_COLUMN) as one file per shard, each sorted by id, without the shard column."""
    written = ShardFiles(relative_dir)
    for shard, rows in tables_by_shard(table):
        _, path, sha256, count = write_shard_file(work_dir, relative_dir, shard, rows)
        written.files[shard] = (path, sha256, count)
    return written


def assemble_shard_file(work_dir: str, relative_dir: str, shard: str, pieces: list[Slice], schema: pa.Schema) -> tuple[str, str, str, int]:
    """Task: one shard's file from its pieces (`tables_by_shard` rows written by several tasks, tasks/dedup/table_slices.py;
    any order): the bytes `write_by_shard` writes for the same rows."""
    spill = SpillFiles()
    try:
        rows = read_table_slices(spill, pieces, schema)
    finally:
        spill.close()
    return write_shard_file(Path(work_dir), relative_dir, shard, rows.sort_by([("id", "ascending")]).combine_chunks())


def shard_removals(work_dir: str, shard_name: str, shard: int, text_ranges: int, spill_dir: str) -> tuple[str, str, str, int] | None:
    """Task: `removals/<shard>.parquet` from the shard's pieces (entry `shard` of each `removed/` writer's slice index, in
    `spill_dir`), the bytes `write_by_shard` gives; None when the shard loses nothing."""
    spill = SpillFiles()
    try:
        pieces = [indexed_slice(spill, numbered_file(Path(spill_dir) / "removed", part), shard) for part in range(text_ranges)]
        if not any(piece.stop > piece.start for piece in pieces):
            for piece in pieces:  # every entry is checked: one cut short to nothing would drop removals silently
                spill.read_checked_slice(piece.path, piece.start, piece.stop, piece.sha256)
            return None
    finally:
        spill.close()
    return assemble_shard_file(work_dir, REMOVALS_DIR, shard_name, pieces, REMOVALS_SCHEMA)


@dataclass
class RemovalContext:
    """What a global pass hands the per-shard pass: the removal files by shard, a summary, artifact files.

    The flow host keeps this; each shard job gets only `for_shard(shard)` (stage_runner.plan_stage).
    """

    removals: ShardFiles
    stats: dict[str, Any] = field(default_factory=dict)
    artifact_files: list[tuple[str, int | None]] = field(default_factory=list)  # (path under the stage dir, rows)

    def for_shard(self, shard: str) -> ShardSlice:
        return self.removals.for_shard(shard)

    def summary(self) -> dict[str, Any]:
        return self.stats

    def artifacts(self) -> list[tuple[str, int | None]]:
        return [*self.removals.artifacts(), *self.artifact_files]


def write_removals(work_dir: Path, removals: dict[str, Removal], shard_of: dict[str, str], stats: dict[str, Any],
                   artifact_files: list[tuple[str, int | None]] = ()) -> RemovalContext:
    """Publish the decision by shard in the stage directory and build the context; `shard_of`: removed id -> its input shard."""
    ids = list(removals)
    table = removal_table(ids, [shard_of[i] for i in ids], [removals[i].rule for i in ids], [removals[i].value for i in ids],
                          [removals[i].threshold for i in ids], [dumps_json(removals[i].detail) for i in ids])
    return write_removal_table(work_dir, table, stats, artifact_files)


def removal_table(ids: Any, shards: Any, rules: Any, values: Any, thresholds: Any, details_json: Any) -> pa.Table:
    """The removal map as Arrow columns (~100-150 bytes a removed document, no Python object per row), with each row's input shard."""
    return pa.table({"id": ids, "rule": rules, "value": values, "threshold": thresholds, "detail": details_json, SHARD_COLUMN: shards},
                    schema=REMOVALS_SCHEMA.append(pa.field(SHARD_COLUMN, pa.string())))


def write_removal_table(work_dir: Path, table: pa.Table, stats: dict[str, Any],
                        artifact_files: list[tuple[str, int | None]] = ()) -> RemovalContext:
    return RemovalContext(write_by_shard(Path(work_dir), REMOVALS_DIR, table), stats, list(artifact_files))


@lru_cache(maxsize=2)
def load_checked_table(path: str, expected_sha256: str) -> pa.Table:
    """A file a global pass wrote for a shard job (its removals, its validation choice), checked against its digest.
    Cached: a shard job feeds its shard to the stage in batches and each batch asks again."""
    actual = sha256_file(Path(path))
    if actual != expected_sha256:
        raise ChecksumMismatch(f"{path}: sha256 {actual[:12]}… but the global pass wrote {expected_sha256[:12]}…")
    return pq.read_table(path).combine_chunks()


def shard_rows(part: ShardSlice, schema: pa.Schema) -> pa.Table:
    """This shard's rows of a global result (an empty table when the shard has none)."""
    return schema.empty_table() if part.path is None else load_checked_table(part.path, part.sha256)


def apply_removals(docs: pa.Table, config: Any, part: ShardSlice) -> ShardOutcome:
    """Keep the documents the global pass did not remove; one audit row per removed document, in shard order."""
    removals = shard_rows(part, REMOVALS_SCHEMA)
    if not removals.num_rows:
        return ShardOutcome(docs, [])
    row_of_doc = pc.index_in(docs.column("id"), value_set=removals.column("id"))
    is_removed = pc.is_valid(row_of_doc)
    if not pc.any(is_removed).as_py():
        return ShardOutcome(docs, [])
    kept = docs.filter(pc.invert(is_removed))
    rows = removals.take(pc.filter(row_of_doc, is_removed)).to_pylist()
    audit = [{"id": row["id"], "action": "removed", "rule": row["rule"], "value": row["value"], "threshold": row["threshold"],
              "detail": row["detail"]} for row in rows]
    return ShardOutcome(kept, audit)


def map_upstream_shards(fn: Callable[..., Any], upstream: StageManifest, extra_args: tuple, workers: int, label: str) -> list[Any]:
    """Run `fn(shard_path, shard_name, *extra_args)` over every input shard (in worker processes); results in shard order."""
    return sorted(iter_upstream_shards(fn, upstream, extra_args, workers, label), key=lambda result: result["shard"])


def iter_upstream_shards(fn: Callable[..., Any], upstream: StageManifest, extra_args: tuple, workers: int, label: str) -> Iterable[Any]:
    """As map_upstream_shards, but each result as it finishes: a caller that folds them holds one at a time."""
    data_files = upstream.files("data")
    jobs = [(str(upstream.path_of(f)), Path(f.path).stem, *extra_args) for f in data_files]
    return map_shards(fn, jobs, workers, label, [f.rows or 0 for f in data_files])
