"""Run a function over items in a child process that is killed when one item overruns.

Python-level timeouts (signals) cannot interrupt a parser stuck inside C code;
killing the process can. The parent hands items one at a time over a pipe and
waits at most `timeout_s` for each answer; on a timeout it kills the child,
records the item as timed out and starts a fresh child for the rest.
"""
from __future__ import annotations

import multiprocessing as mp
import traceback
from typing import Any, Callable, Iterable

TIMEOUT = "timeout"
ERROR = "error"
OK = "ok"


READY = "ready"
STARTUP_TIMEOUT_S = 300.0  # imports in a fresh process on a loaded machine; not charged to any item


def _serve(fn: Callable[[Any], Any], conn, warmup: Any) -> None:
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
            conn.send((ERROR, f"{type(exc).__name__}: {exc}"[:500] or traceback.format_exc(limit=1)))


class _Child:
    def __init__(self, fn: Callable[[Any], Any], context: mp.context.BaseContext, warmup: Any = None):
        self.conn, child_conn = context.Pipe()
        self.process = context.Process(target=_serve, args=(fn, child_conn, warmup), daemon=True)
        self.process.start()
        child_conn.close()
        if not self.conn.poll(STARTUP_TIMEOUT_S) or self.conn.recv() != READY:
            self.stop(kill=True)
            raise RuntimeError(f"extraction worker did not start within {STARTUP_TIMEOUT_S:.0f} s")

    def stop(self, kill: bool = False) -> None:
        if kill:
            self.process.kill()
        else:
            try:
                self.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


def map_with_deadline(fn: Callable[[Any], Any], items: Iterable[Any], timeout_s: float, warmup: Any = None, start_method: str = "forkserver") -> list[tuple[str, Any]]:
    """[(OK, result) | (ERROR, message) | (TIMEOUT, None)] in item order; never hangs longer than timeout_s per item.

    `warmup` is an item each fresh child processes (untimed, result dropped) before the first real one.
    """
    context = mp.get_context(start_method)
    results: list[tuple[str, Any]] = []
    child: _Child | None = None
    try:
        for item in items:
            if child is None:
                child = _Child(fn, context, warmup)
            try:
                child.conn.send(item)
                if child.conn.poll(timeout_s):
                    results.append(child.conn.recv())
                    continue
                outcome: tuple[str, Any] = (TIMEOUT, None)
            except (EOFError, BrokenPipeError, ConnectionResetError, OSError) as exc:
                # The child died (e.g. a C-level crash or out of memory) on this item.
                outcome = (ERROR, f"worker process died: {type(exc).__name__}")
            child.stop(kill=True)
            child = None
            results.append(outcome)
    finally:
        if child is not None:
            child.stop()
    return results
