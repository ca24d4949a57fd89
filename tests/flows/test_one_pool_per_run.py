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


def test_hymo_run_starts_the_workers_before_the_flow_run_and_the_flow_takes_them(tmp_path: Path, tiny_config: Path, monkeypatch) -> None:
    """`hymo run` enters the process runner while Prefect creates the flow run; the flow's stages use that runner
    (no second one is made) and shut it down."""
    import flows.pipeline as pipeline

    made = []
    real = pipeline.make_task_runner
    monkeypatch.setattr(pipeline, "make_task_runner", lambda *a, **k: made.append(a) or real(*a, **k))
    config = load_config(tiny_config)
    with pipeline.process_runner_started_early(config, "langid"):
        (early,) = [runner for _, runner in pipeline.EARLY_RUNNERS]
        processes = list(early._executor._processes.values())
        state = hymo_pipeline(config=config, out=str(tmp_path / "run"), until="langid", return_state=True)
    assert state.is_completed()
    assert len(made) == 1 and pipeline.EARLY_RUNNERS == []
    assert processes and all(not p.is_alive() for p in processes)


def test_workers_started_for_a_flow_that_never_took_them_are_shut_down(tiny_config: Path) -> None:
    import flows.pipeline as pipeline

    with pytest.raises(RuntimeError, match="before its first stage"):
        with pipeline.process_runner_started_early(load_config(tiny_config), "langid"):
            (early,) = [runner for _, runner in pipeline.EARLY_RUNNERS]
            processes = list(early._executor._processes.values())
            raise RuntimeError("the flow failed before its first stage")
    assert pipeline.EARLY_RUNNERS == []
    for process in processes:
        process.join(timeout=30)
    assert processes and all(not p.is_alive() for p in processes)
