"""The `hymo-pipeline` flow: every stage in order over one run directory.

Between stages travel paths to stage directories, never documents. Each stage
is a no-op when its published manifest already carries the same cache key, so
a second identical run reuses everything and a re-run after a failure
recomputes only the failed stage and what follows.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from flows.config import PipelineConfig
from flows.stages import stage_path, stages_until


@flow(name="hymo-pipeline", log_prints=True)
def hymo_pipeline(config: PipelineConfig | None = None, out: str = "runs/sample", until: str | None = None) -> dict[str, Any]:
    config = config or PipelineConfig()
    run = Path(out)
    run.mkdir(parents=True, exist_ok=True)
    logger = get_run_logger()
    previous: Path | None = None
    summary: dict[str, Any] = {"run": str(run.resolve()), "stages": []}
    for entry in stages_until(until):
        out_dir = stage_path(run, entry.name)
        manifest = entry.run(config, run, previous, out_dir)
        counts = manifest.counts
        logger.info("%s: in=%s kept=%s removed=%s", entry.name, counts.get("in"), counts.get("kept"), sum(counts.get("removed", {}).values()))
        summary["stages"].append({"stage": entry.name, "dir": str(out_dir), "digest": manifest.digest, "counts": counts})
        previous = out_dir
    return summary
