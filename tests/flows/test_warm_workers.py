"""The process runner's workers are started, with the stage modules imported, before the first shard batch."""
from __future__ import annotations

from flows.config import load_config
from flows.stages import pipeline_stages
from flows.warm_workers import ENGINE_MODULES, stage_modules, warm_process_pool


def test_the_document_stages_shard_modules_are_what_a_warm_worker_imports():
    config = load_config()
    modules = stage_modules(pipeline_stages(config), config)
    assert {"tasks.filters.langid", "tasks.filters.quality", "tasks.dedup.removal_map", "tasks.corpus.split"} <= set(modules)
    assert {"tasks.dedup.exact", "tasks.dedup.fuzzy", "tasks.dedup.decontam"} <= set(modules)  # their global passes' rounds
    assert not any(name.startswith(("hymo_core", "tasks.pretrain")) for name in modules)  # no training core (torch) in a worker


def test_one_warm_up_call_per_worker_starts_every_worker_of_the_runners_own_pool():
    from prefect.task_runners import ProcessPoolTaskRunner

    runner = ProcessPoolTaskRunner(max_workers=2)
    with runner:
        futures = warm_process_pool(runner, 2, ("tasks.filters.langid",))
        pids = {future.result(timeout=120) for future in futures}
        assert len(pids) == 2 and pids == set(runner._executor._processes)  # the pool's two processes, both already started
    assert "tasks.runner.stage_runner" in ENGINE_MODULES and not any(name.startswith("prefect") for name in ENGINE_MODULES)


def test_a_runner_without_a_process_pool_is_left_alone():
    from prefect.task_runners import ThreadPoolTaskRunner

    with ThreadPoolTaskRunner(max_workers=2) as runner:
        assert warm_process_pool(runner, 2, ()) == []
