"""Run a function over items in child processes that are killed when one item overruns.

Python-level timeouts (signals) cannot interrupt a parser stuck inside C code;
killing the process can. The parent hands one item at a time to each child
over a socket and waits at most `timeout_s` for each answer; on a timeout it
kills that child, records the item as timed out and starts a fresh child for
the rest. Several children run at once, so one slow page does not idle the
other cores.

Children are fresh interpreters (`python -c`), not multiprocessing
spawn/forkserver processes: those re-import the parent's `__main__` on top of
the function's module, while a fresh interpreter imports only this module and
the one that defines the function (for extraction, tasks/ingest/extract_page.py:
no Prefect, no stage plumbing), so two children are ready in ~2 s, not ~4 s.
"""
from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import time
from collections import deque
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Iterable

TIMEOUT = "timeout"
ERROR = "error"
OK = "ok"
READY = "ready"
STARTUP_TIMEOUT_S = 300.0  # imports in a fresh process on a loaded machine; not charged to any item
CHILD_BOOT = "import sys; from tasks.ingest.watchdog import child_main; child_main(int(sys.argv[1]))"


def child_main(fd: int) -> None:
    """Entry point of a child: receive the function and warm-up item, then serve items until told to stop."""
    conn = Connection(fd)
    fn, warmup = conn.recv()
    if warmup is not None:  # first calls pay lazy imports; keep that off every item's clock
        try:
            fn(warmup)
        except Exception:
            pass
    conn.send(READY)
    while True:
        try:
            item = conn.recv()
        except EOFError:
            return
        if item is None:
            return
        try:
            conn.send((OK, fn(item)))
        except Exception as exc:  # reported to the parent as this item's failure
            conn.send((ERROR, f"{type(exc).__name__}: {exc}"[:500]))


def child_environment() -> dict[str, str]:
    """The parent's import path, so the child finds `fn` wherever the parent found it."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([p for p in sys.path if p] + [os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}


class _Child:
    """One worker process; `item` is the index it is working on, `since` when it got it."""

    def __init__(self, fn: Callable[[Any], Any], warmup: Any):
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen([sys.executable, "-c", CHILD_BOOT, str(theirs.fileno())],
                                        pass_fds=(theirs.fileno(),), env=child_environment(), stdin=subprocess.DEVNULL)
        theirs.close()
        self.conn = Connection(ours.detach())
        self.conn.send((fn, warmup))
        self.ready = False
        self.item: int | None = None
        self.since = time.monotonic()

    def stop(self, kill: bool = False) -> None:
        if kill:
            self.process.kill()
        else:
            try:
                self.conn.send(None)
            except OSError:
                pass
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.conn.close()


class SupervisedPool:
    """Children that outlive one `map`: a stage pays their start and warm-up once, not once per shard.

    `warmup` is an item each fresh child processes (untimed, result dropped)
    before its first real one. Children start on the first `map` that needs
    them, so a stage that turns out to be cached starts none.
    """

    def __init__(self, fn: Callable[[Any], Any], timeout_s: float, warmup: Any = None, workers: int = 1):
        pickle.dumps(fn)  # a function children cannot import fails here, in the parent, with a clear error
        self.fn, self.timeout_s, self.warmup = fn, timeout_s, warmup
        self.workers = max(1, workers)
        self.children: list[_Child] = []

    def __enter__(self) -> "SupervisedPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        for child in self.children:
            child.stop(kill=child.item is not None)
        self.children = []

    def _spawn(self) -> None:
        self.children.append(_Child(self.fn, self.warmup))

    def map(self, items: Iterable[Any], costs: list[float] | None = None,
            on_answer: Callable[[int], None] | None = None) -> list[tuple[str, Any]]:
        """[(OK, result) | (ERROR, message) | (TIMEOUT, None)] in item order; no item runs longer than timeout_s.

        With `costs` (e.g. page sizes) the costliest items are handed out first, so the
        map does not end with one child finishing a big item while the others idle.
        `on_answer(n)` after each item's outcome is known, n the outcomes so far (progress).
        """
        items = list(items)
        results: list[tuple[str, Any] | None] = [None] * len(items)
        answered = 0
        settle = on_answer or (lambda n: None)
        order = range(len(items)) if costs is None else sorted(range(len(items)), key=lambda i: -costs[i])
        pending = deque(order)
        while len(self.children) < min(self.workers, len(items)):
            self._spawn()
        children = self.children

        def replace(child: _Child) -> None:
            child.stop(kill=True)
            children.remove(child)
            if pending:
                self._spawn()

        try:
            while pending or any(c.item is not None for c in children):
                for child in children:
                    if child.ready and child.item is None and pending:
                        index = pending.popleft()
                        try:
                            child.conn.send(items[index])
                            child.item, child.since = index, time.monotonic()
                        except OSError:
                            results[index] = (ERROR, "worker process died before taking the item")
                            answered += 1
                            settle(answered)
                deadlines = [c.since + (self.timeout_s if c.ready else STARTUP_TIMEOUT_S) for c in children]
                wait_s = max(0.0, min(deadlines) - time.monotonic()) if deadlines else 0.0
                ready = wait([c.conn for c in children], timeout=wait_s)
                now = time.monotonic()
                for child in list(children):
                    if child.conn in ready:
                        try:
                            message = child.conn.recv()
                        except (EOFError, OSError):
                            # The child died (a C-level crash, out of memory) on this item.
                            if child.item is not None:
                                results[child.item] = (ERROR, "worker process died")
                                answered += 1
                                settle(answered)
                            elif not child.ready:
                                raise RuntimeError("extraction worker died while starting")
                            replace(child)
                            continue
                        if message == READY:
                            child.ready = True
                        else:
                            results[child.item] = message
                            child.item = None
                            answered += 1
                            settle(answered)
                    elif not child.ready and now - child.since > STARTUP_TIMEOUT_S:
                        raise RuntimeError(f"worker did not start within {STARTUP_TIMEOUT_S:.0f} s")
                    elif child.item is not None and now - child.since > self.timeout_s:
                        results[child.item] = (TIMEOUT, None)
                        answered += 1
                        settle(answered)
                        replace(child)
        except BaseException:
            self.close()
            raise
        return [r if r is not None else (ERROR, "not processed") for r in results]


def map_with_deadline(
    fn: Callable[[Any], Any],
    items: Iterable[Any],
    timeout_s: float,
    warmup: Any = None,
    workers: int = 1,
) -> list[tuple[str, Any]]:
    """One `SupervisedPool.map` with children that stop afterwards."""
    with SupervisedPool(fn, timeout_s, warmup, workers) as pool:
        return pool.map(items)
