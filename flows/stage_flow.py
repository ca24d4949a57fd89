"""The `hymo-stage` flow: re-run one stage of an existing run, then whatever follows it.

Stages after it run too, but each is "Cached" unless its input changed, so only
the stage and what depends on a changed output are recomputed. `force` runs the
stage task with Prefect's `refresh_cache`: it recomputes although it is intact.
"""
from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Any

from prefect import flow

from manifests.run_lock import run_lock

from flows.config import default_run, with_overrides
from flows.pipeline import Runner, load_run_config, log_lines, run_stages
from flows.run_config import claim_run_dir, saved_runner
from flows.stages import STAGE_NAMES

StageName = Enum("StageName", {name: name for name in STAGE_NAMES}, type=str)  # built-in stages; a user filter is named as text


@flow(name="hymo-stage", log_prints=True)
def hymo_stage(
    run: str | None = None,
    stage: StageName | str = StageName(STAGE_NAMES[0]),
    force: bool = False,
    until: str | None = None,
    runner: Runner = Runner.process,
    dask_address: str | None = None,
    overrides: list[str] | None = None,
) -> dict[str, Any]:
    """Re-run `stage` of the run directory `run` (from its saved config) and what follows it; `run` empty: `hymo run`'s
    default run directory, $HYMO_HOME/runs/sample. `overrides`: `section.key=value` changes to the saved config
    (`hymo rerun --set`), written to the run's config.json before the stage runs."""
    run_dir = Path(run).resolve() if run else default_run()
    config = with_overrides(load_run_config(run_dir), overrides)
    name = stage.value if isinstance(stage, Enum) else str(stage)
    with run_lock(run_dir):  # one writer per run directory: a second run fails naming this one
        # stray directories of another stage list are refused here too; a changed config is recorded
        log_lines(claim_run_dir(run_dir, config, saved_runner(run_dir) if overrides else None))
        return run_stages(config, run_dir, name, until, runner, dask_address, refresh=name if force else None)
