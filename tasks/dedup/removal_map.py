"""Global stages (dedup, decontamination): a corpus-wide pass decides, a per-shard pass applies.

The decision is a removal map keyed by stable document id, so it does not
depend on how the corpus is cut into shards; applying it is a filter that
writes one audit row per removed document.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from manifests.atomic import atomic_write_parquet
from manifests.digest import sha256_file
from manifests.schema import dumps_json
from manifests.stage_manifest import StageManifest
from tasks.dedup.minhash import ChecksumMismatch
from tasks.runner.stage_runner import ShardOutcome, map_shards


REMOVALS_FILE = "removals.parquet"
REMOVALS_SCHEMA = pa.schema([("id", pa.string()), ("rule", pa.string()), ("value", pa.float64()),
                             ("threshold", pa.float64()), ("detail", pa.string())])


@dataclass(frozen=True)
class Removal:
    """Why one document goes: the audit row without id/action (the plumbing adds stage)."""

    rule: str
    value: float | None
    threshold: float | None
    detail: dict[str, Any]


@dataclass
class RemovalContext:
    """What a global pass hands the per-shard pass: the path of its removal file, a summary, artifact files.

    A path, not the map: the context is pickled into every shard job, and a
    corpus with thousands of shards would otherwise copy the map thousands of times.
    """

    removals_path: str
    removals_sha256: str  # also the cache key: long-lived workers may see the same path for a re-run
    stats: dict[str, Any] = field(default_factory=dict)
    artifact_files: list[tuple[str, int | None]] = field(default_factory=list)  # (path under the stage dir, rows)

    def summary(self) -> dict[str, Any]:
        return self.stats

    def artifacts(self) -> list[tuple[str, int | None]]:
        return self.artifact_files


def write_removals(work_dir: Path, removals: dict[str, Removal], stats: dict[str, Any],
                   artifact_files: list[tuple[str, int | None]] = ()) -> RemovalContext:
    """Publish the decision as `removals.parquet` in the stage directory (sorted by id) and build the context."""
    ids = list(removals)
    table = removal_table(ids, [removals[i].rule for i in ids], [removals[i].value for i in ids],
                          [removals[i].threshold for i in ids], [dumps_json(removals[i].detail) for i in ids])
    return write_removal_table(work_dir, table, stats, artifact_files)


def removal_table(ids: Any, rules: Any, values: Any, thresholds: Any, details_json: Any) -> pa.Table:
    """The removal map as Arrow columns (~100-150 bytes a removed document, no Python object per row), sorted by id."""
    table = pa.table({"id": ids, "rule": rules, "value": values, "threshold": thresholds, "detail": details_json}, schema=REMOVALS_SCHEMA)
    return table.sort_by("id").combine_chunks()


def write_removal_table(work_dir: Path, table: pa.Table, stats: dict[str, Any],
                        artifact_files: list[tuple[str, int | None]] = ()) -> RemovalContext:
    path = Path(work_dir) / REMOVALS_FILE
    atomic_write_parquet(path, table)
    return RemovalContext(str(path), sha256_file(path), stats, [(REMOVALS_FILE, table.num_rows), *artifact_files])


@lru_cache(maxsize=2)
def load_checked_table(path: str, expected_sha256: str) -> pa.Table:
    """A table a global pass wrote for every shard job (removals, the validation choice), read once per worker
    process and checked against its digest; kept as Arrow columns."""
    actual = sha256_file(Path(path))
    if actual != expected_sha256:
        raise ChecksumMismatch(f"{path}: sha256 {actual[:12]}… but the global pass wrote {expected_sha256[:12]}…")
    return pq.read_table(path).combine_chunks()


def apply_removals(docs: pa.Table, config: Any, context: RemovalContext) -> ShardOutcome:
    """Keep the documents the global pass did not remove; one audit row per removed document, in shard order."""
    removals = load_checked_table(context.removals_path, context.removals_sha256)
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
    data_files = upstream.files("data")
    jobs = [(str(upstream.path_of(f)), Path(f.path).stem, *extra_args) for f in data_files]
    sizes = [f.rows or 0 for f in data_files]
    results = list(map_shards(fn, jobs, workers, label, sizes))
    return sorted(results, key=lambda result: result["shard"])
