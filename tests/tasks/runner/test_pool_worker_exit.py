"""A pool worker ends without the interpreter's teardown once its pool shuts it down (issue 57: the flow waited
~1 s at the end of every run for its workers to free the modules they had imported), with its logs flushed."""
from __future__ import annotations

import logging
import logging.handlers
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

from tasks.runner.stage_runner import start_worker
from tasks.runner.worker_threads import worker_choice, worker_environment


class WritesWhenFreed:
    """Held by a module: the interpreter's teardown frees it, and then it writes its file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __del__(self, open=open) -> None:
        with open(self.path, "w") as handle:
            handle.write("torn down")


def hold_and_log(marker: str, log: str) -> int:
    """In the worker: a module-held object that marks teardown, and a log record only a flush at exit writes."""
    sys.modules[__name__].HELD = WritesWhenFreed(marker)
    buffered = logging.handlers.MemoryHandler(capacity=1000, flushLevel=logging.CRITICAL, target=logging.FileHandler(log))
    logger = logging.getLogger("worker-exit-test")
    logger.addHandler(buffered)
    logger.warning("logged before exit")
    return os.getpid()


def test_a_worker_ends_without_teardown_and_with_its_logs_flushed(tmp_path: Path) -> None:
    pool = ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn"), initializer=start_worker, initargs=(os.getpid(), worker_environment(worker_choice(1))))
    try:
        pool.submit(hold_and_log, str(tmp_path / "torn-down"), str(tmp_path / "worker.log")).result(timeout=120)
    finally:
        pool.shutdown(wait=True)
    assert (tmp_path / "worker.log").read_text() == "logged before exit\n"  # logging.shutdown ran
    assert not (tmp_path / "torn-down").exists()  # the modules were never torn down
