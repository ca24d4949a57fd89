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
