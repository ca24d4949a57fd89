"""A run on the process runner starts one set of workers (issue 57: pool start is a per-stage fixed cost): the
stages' own maps (ingest's file reads, the global passes' per-shard work) run on the task runner's pool, whose
workers the flow warms at its start, not on a second pool the flow host starts and imports again."""
from __future__ import annotations

from pathlib import Path

import pytest

from flows.config import load_config
from flows.pipeline import hymo_pipeline
from tasks.runner import stage_runner

pytestmark = pytest.mark.usefixtures("prefect_harness")


def test_the_stages_maps_run_on_the_task_runners_pool(tmp_path: Path, tiny_config: Path) -> None:
    stage_runner.shutdown_worker_pools()
    state = hymo_pipeline(config=load_config(tiny_config), out=str(tmp_path / "run"), until="langid", return_state=True)
    assert state.is_completed()
    # ingest read its two source files with two workers: the runner's, lent for the run and handed back
    assert stage_runner._POOLS == {} and stage_runner._LENT == {}
