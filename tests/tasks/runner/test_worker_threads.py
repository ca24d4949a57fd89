"""Native thread pools get one runner slot's threads: a pool worker 1, a Dask worker its own count, the flow host no cap."""
from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

from tasks.runner.worker_threads import cap_native_threads, slot_threads


def capped_in_child() -> tuple[int | None, str | None]:
    os.environ.pop("RAYON_NUM_THREADS", None)
    cap_native_threads()
    return slot_threads(), os.environ.get("RAYON_NUM_THREADS")


def test_flow_host_is_not_capped(monkeypatch):
    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    cap_native_threads()
    assert slot_threads() is None and "RAYON_NUM_THREADS" not in os.environ


def test_pool_worker_gets_one_thread_and_a_user_choice_wins(monkeypatch):
    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        assert pool.submit(capped_in_child).result() == (1, "1")
    monkeypatch.setenv("RAYON_NUM_THREADS", "3")
    cap_native_threads()
    assert os.environ["RAYON_NUM_THREADS"] == "3"


def test_dask_worker_gets_its_thread_count():
    from distributed import Client, LocalCluster

    before = os.environ.get("RAYON_NUM_THREADS")
    try:
        with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster, Client(cluster) as client:
            threads, _ = client.submit(capped_in_child, pure=False).result()  # an in-process worker: this process's environment
    finally:
        os.environ.pop("RAYON_NUM_THREADS", None)
        if before is not None:
            os.environ["RAYON_NUM_THREADS"] = before
    assert threads == 2


def native_pools_in_worker() -> dict:
    import numpy  # noqa: F401  (threadpoolctl reports the BLAS numpy loaded)
    import pyarrow
    from threadpoolctl import threadpool_info

    return {"omp": os.environ.get("OMP_NUM_THREADS"), "hymo": os.environ.get("HYMO_THREADS"),
            "rayon": os.environ.get("RAYON_NUM_THREADS"), "arrow": pyarrow.cpu_count(),
            "blas": sorted({pool["num_threads"] for pool in threadpool_info()})}


def test_stage_pool_workers_take_the_policys_share(monkeypatch):
    """A stage pool's workers start with the flow host's thread choice (here HYMO_THREADS=3, more than this
    machine's cores, so a worker left alone would show otherwise), in the variables and in the pools numpy
    and pyarrow had already sized when the worker's initializer ran."""
    from tasks.runner.stage_runner import shutdown_worker_pools, worker_pool

    monkeypatch.setenv("HYMO_THREADS", "3")
    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    shutdown_worker_pools()
    try:
        seen = worker_pool(2).submit(native_pools_in_worker).result()
    finally:
        shutdown_worker_pools()
    assert seen["omp"] == seen["hymo"] == seen["rayon"] == "3"
    assert seen["arrow"] == 3
    assert seen["blas"] in ([], [3])


def test_worker_choice_divides_the_cpus_and_keeps_a_users_native_setting():
    from hymo_core.threads import usable_cpus
    from tasks.runner.worker_threads import worker_choice, worker_environment

    choice = worker_choice(2, environ={})
    assert choice.threads == max(1, usable_cpus() // 2) and choice.source == "cpus/ranks"
    assert worker_choice(4, environ={"OMP_NUM_THREADS": "2"}).threads == 2
    env = worker_environment(worker_choice(1, environ={"HYMO_THREADS": "5"}), environ={"RAYON_NUM_THREADS": "7"})
    assert env["OMP_NUM_THREADS"] == env["OPENBLAS_NUM_THREADS"] == "5" and env["RAYON_NUM_THREADS"] == "7"
