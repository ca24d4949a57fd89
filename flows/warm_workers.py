"""Start the process runner's workers while the flow host still works on the stages before the first shard batch.

A spawned worker pays its interpreter start and the imports of the stage plumbing and of the stage modules
(pyarrow, numpy, fastText, ...) before it runs anything: seconds, paid by the first document stage (langid)
in full while ingest and extraction leave a core free. Submitting one warm-up call per worker as soon as the
task runner is entered spreads that cost over those stages instead. The call goes to the runner's own process
pool, so the workers it starts are the ones that run the shard jobs.

The calls start the processes; they need not land on different workers: a booted worker's imports take a
fraction of a second, and the first worker to boot took both calls in every try on this machine, the other
meeting the stage imports in its first job. Importing them in every worker's initializer instead kept both
workers from ingest's and extraction's jobs meanwhile: in the one 50k bench run with it, ingest + extract took
4.2 s against 3.4 s, langid 4.3 s against 4.0 s.
"""
from __future__ import annotations

import importlib
import os
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Iterable

# What every shard job needs before its own stage module: the stage plumbing. Not Prefect's task engine: a shard batch
# is a task run in a thread of the flow, which sends the batch's shards to these workers as plain calls.
ENGINE_MODULES = ("tasks.runner.stage_runner",)


def import_modules(modules: tuple[str, ...]) -> int:
    """Runs in a fresh worker: import what its first shard job would (the pid tells which worker ran it)."""
    for name in modules:
        importlib.import_module(name)
    return os.getpid()


def stage_modules(entries: Iterable[Any], config: Any) -> tuple[str, ...]:
    """The modules of these entries' shard functions and global passes (a partial's function's module), in stage
    order: a global pass's first round runs its tasks' module (dedup's, decontamination's) in every worker too."""
    names: list[str] = []
    for entry in entries:
        if entry.doc_stage is None:
            continue
        stage, _ = entry.doc_stage(config)
        for fn in (stage.process_shard, stage.prepare):
            fn = getattr(fn, "func", fn)
            if fn is not None and fn.__module__ not in names:
                names.append(fn.__module__)
    return tuple(names)


def warm_process_pool(task_runner: Any, workers: int, modules: tuple[str, ...]) -> list:
    """One warm-up call per worker on the runner's process pool, not waited for; [] if the runner has none.

    Python's ProcessPoolExecutor starts a new process for a call while no worker is idle, up to its maximum,
    so `workers` calls submitted at once start `workers` processes."""
    executor = getattr(task_runner, "_executor", None)
    if not isinstance(executor, ProcessPoolExecutor):  # threads share the flow's imports; Dask starts its own workers
        return []
    return [executor.submit(import_modules, ENGINE_MODULES + modules) for _ in range(min(workers, executor._max_workers))]
