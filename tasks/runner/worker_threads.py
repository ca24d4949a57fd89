"""How many threads native code may use inside a runner slot: one worker's share of the cores, not the machine.

A process-pool worker or a Dask worker is one slot of a runner that already
keeps every core busy with a slot per core. Native pools sized to all cores in
each slot oversubscribe the machine W-fold and spin-wait under load: on 2
cores, 2 mixture workers spent about a fifth of their CPU in HF tokenizers'
rayon pool, and the data half's CPU doubled (110 -> 250 CPU s) on a loaded
machine. So the flow host chooses each worker's threads once, with the
project's one policy (hymo_core/threads.py: HYMO_THREADS > OMP_NUM_THREADS >
usable CPUs / workers), hands the choice to its pool workers when they start,
and records it in every stage manifest it publishes ("parallelism").
"""
from __future__ import annotations

import contextvars
import multiprocessing
import os
import sys
from typing import Any, Mapping

from hymo_core.threads import ThreadChoice, child_environment, choose_threads

# Native pools a worker's choice also sizes (hymo_core.threads' CHILD_ENV_VARS cover OpenMP, MKL and the policy).
NATIVE_POOL_VARS = ("OPENBLAS_NUM_THREADS", "RAYON_NUM_THREADS")

# What the stages of this run are running with: {"runner", "workers", "threads_per_worker", "source"}; set by the
# flow host for the run's stages and written into each manifest's `extra`.
PARALLELISM: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("hymo_parallelism", default=None)


def worker_choice(workers: int, environ: Mapping[str, str] | None = None) -> ThreadChoice:
    """Threads for each of `workers` pool workers sharing this machine (the flow host's environment decides)."""
    return choose_threads(ranks=max(1, workers), environ=environ)


def worker_environment(choice: ThreadChoice, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Variables a worker starts with: the policy's, plus the native pools', a user's own RAYON/OPENBLAS setting kept."""
    environ = os.environ if environ is None else environ
    env = child_environment(choice)
    for name in NATIVE_POOL_VARS:
        env[name] = environ.get(name) or str(choice.threads)
    return env


def apply_worker_environment(env: Mapping[str, str]) -> None:
    """In a starting worker: take the variables, and resize the native pools already loaded (a spawned worker has
    imported its parent's main module, and with it numpy or pyarrow, before its initializer runs)."""
    os.environ.update(env)
    threads = int(env["OMP_NUM_THREADS"])
    if "numpy" in sys.modules:
        from threadpoolctl import threadpool_limits

        threadpool_limits(threads)
    if "pyarrow" in sys.modules:
        sys.modules["pyarrow"].set_cpu_count(threads)
    if "torch" in sys.modules and sys.modules["torch"].get_num_threads() != threads:
        sys.modules["torch"].set_num_threads(threads)


def parallelism_record(runner: str, workers: int, choice: ThreadChoice | None) -> dict[str, Any]:
    """The manifest's record of how the stage ran; a Dask worker's threads are its own (the nanny sets them)."""
    record: dict[str, Any] = {"runner": runner, "workers": workers}
    if choice is not None:
        record.update(threads_per_worker=choice.threads, source=choice.source, usable_cpus=choice.cpus)
    return record


def slot_threads() -> int | None:
    """Threads of the runner slot this process is: the Dask worker's thread count, the pool's choice (1 if none was
    passed) in a pool worker, None in the flow host."""
    distributed = sys.modules.get("distributed")
    if distributed is not None:
        try:
            return max(1, int(distributed.get_worker().state.nthreads))
        except ValueError:  # not inside a Dask worker
            pass
    if multiprocessing.parent_process() is None:
        return None
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "1")))
    except ValueError:
        return 1


def cap_native_threads() -> None:
    """Size rayon's pool to this slot (unless the user chose RAYON_NUM_THREADS); a no-op in the flow host.

    Rayon reads RAYON_NUM_THREADS once, when its pool is first used, so the cap is set before the first
    parallel call of the process."""
    if "RAYON_NUM_THREADS" in os.environ:
        return
    threads = slot_threads()
    if threads is not None:
        os.environ["RAYON_NUM_THREADS"] = str(threads)
