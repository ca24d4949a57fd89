"""Global stages (dedup, decontamination): a corpus-wide pass decides, a per-shard pass applies.

The decision is a removal map keyed by stable document id, so it does not
depend on how the corpus is cut into shards; applying it is a filter that
writes one audit row per removed document.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.compute as pc

from manifests.stage_manifest import StageManifest
from tasks.stage_runner import ShardOutcome, map_shards


@dataclass(frozen=True)
class Removal:
    """Why one document goes: the audit row without id/action (the plumbing adds stage)."""

    rule: str
    value: float | None
    threshold: float | None
    detail: dict[str, Any]


@dataclass
class RemovalContext:
    """What a global pass hands the per-shard pass: removals by id, a summary, and artifact files."""

    removals: dict[str, Removal]
    stats: dict[str, Any] = field(default_factory=dict)
    artifact_files: list[tuple[str, int | None]] = field(default_factory=list)  # (path under the stage dir, rows)

    def summary(self) -> dict[str, Any]:
        return self.stats

    def artifacts(self) -> list[tuple[str, int | None]]:
        return self.artifact_files


def apply_removals(docs: pa.Table, config: Any, context: RemovalContext) -> ShardOutcome:
    """Keep the documents the global pass did not remove; one audit row per removed document."""
    ids = docs.column("id").to_pylist()
    removed_ids = [doc_id for doc_id in ids if doc_id in context.removals]
    if not removed_ids:
        return ShardOutcome(docs, [])
    kept = docs.filter(pc.invert(pc.is_in(docs.column("id"), value_set=pa.array(removed_ids, pa.string()))))
    audit = []
    for doc_id in removed_ids:
        removal = context.removals[doc_id]
        audit.append({"id": doc_id, "action": "removed", "rule": removal.rule, "value": removal.value,
                      "threshold": removal.threshold, "detail": removal.detail})
    return ShardOutcome(kept, audit)


def map_upstream_shards(fn: Callable[..., Any], upstream: StageManifest, extra_args: tuple, workers: int, label: str) -> list[Any]:
    """Run `fn(shard_path, shard_name, *extra_args)` over every input shard (in worker processes); results in shard order."""
    data_files = upstream.files("data")
    jobs = [(str(upstream.path_of(f)), Path(f.path).stem, *extra_args) for f in data_files]
    sizes = [f.rows or 0 for f in data_files]
    results = list(map_shards(fn, jobs, workers, label, sizes))
    return sorted(results, key=lambda result: result["shard"])
