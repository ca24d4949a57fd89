"""One writer per run directory: an OS file lock on RUN/.lock, naming its holder.

Two runs on one directory (a CLI run and a UI run, say) would delete each
other's `.partial` work directories. `run_lock` takes an exclusive `flock` on
RUN/.lock and writes who holds it (pid, host, command, since); a second run
waits up to `wait_s` and then fails with a message naming that holder. The OS
drops the lock when the holder dies, even by SIGKILL, so a crash never leaves a
directory locked; the holder text left behind is only a hint, never the lock.
Re-entrant within one process (a flow that calls another on the same run). A lock that made its run
directory removes it again when the directory holds nothing else at release (a command refused after its
pre-flight, by an unreachable Prefect API say, leaves nothing); a waiting process checks that the file it
locked is still the lock file, so removing it is safe. The CLI takes it in its
pre-flight (`hold_run_lock`, before Prefect starts) and keeps it for the whole command, so of two commands
started at once on one directory the second is refused within a second, having written nothing.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

LOCK_NAME = ".lock"
WAIT_ENV = "HYMO_RUN_LOCK_WAIT_S"  # seconds a second run waits for the first (default: fail at once)
POLL_S = 0.5

_held: dict[Path, tuple[int, int]] = {}  # resolved run directory -> (fd, depth) held by this process
_kept: list[contextlib.AbstractContextManager] = []  # locks taken by `hold_run_lock`, released by `release_held_locks`
_guard = threading.Lock()


class RunLocked(RuntimeError):
    """Another process holds this run directory."""


def holder_of(lock_path: Path) -> str:
    """Who holds (or last held) the lock, in words."""
    try:
        info = json.loads(lock_path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        info = {}
    if not info:
        return "another process (no holder recorded)"
    return f"pid {info.get('pid')} on {info.get('host')} since {info.get('since')} ({info.get('command')})"


def current_holder(run: Path) -> str | None:
    """Who holds `run`'s lock now, or None when nobody does; creates nothing (a check before another process,
    the trainer say, takes the lock itself)."""
    lock_path = Path(run) / LOCK_NAME
    if Path(run).resolve() in _held:
        return None  # this process: re-entrant
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except OSError:
        return None
    try:
        if not _try_lock(fd):
            return holder_of(lock_path)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


@contextlib.contextmanager
def run_lock(run: Path, wait_s: float | None = None) -> Iterator[Path]:
    """Hold RUN/.lock for the block; raise RunLocked naming the holder if it stays taken for `wait_s`."""
    run = Path(run)
    created = not run.exists()
    run.mkdir(parents=True, exist_ok=True)
    key = run.resolve()
    with _guard:
        if key in _held:
            fd, depth = _held[key]
            _held[key] = (fd, depth + 1)
            reentered = True
        else:
            reentered = False
    if reentered:
        try:
            yield run / LOCK_NAME
        finally:
            with _guard:
                fd, depth = _held[key]
                _held[key] = (fd, depth - 1)
        return
    wait_s = float(os.environ.get(WAIT_ENV, "0")) if wait_s is None else wait_s
    lock_path = run / LOCK_NAME
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait_s
        while not (_try_lock(fd) and _still_the_lock_file(fd, lock_path)):
            if time.monotonic() >= deadline:
                raise RunLocked(f"{run}: in use by {holder_of(lock_path)}; wait for that run to finish, stop it, "
                                f"or use another --out directory (set {WAIT_ENV}=SECONDS to wait)")
            if not _still_the_lock_file(fd, lock_path):  # its holder removed it with the directory it had made: a new one
                os.close(fd)
                run.mkdir(parents=True, exist_ok=True)
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
                continue
            time.sleep(POLL_S)
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "command": " ".join(sys.orig_argv).replace("\n", " ")[:300],
                  "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        with _guard:
            _held[key] = (fd, 1)
        try:
            yield lock_path
        finally:
            with _guard:
                _held.pop(key, None)
            os.ftruncate(fd, 0)
            if created and [p.name for p in run.iterdir()] == [LOCK_NAME]:  # a command that wrote nothing leaves nothing
                os.unlink(lock_path)  # while still held: a process waiting on this file sees it go and takes a new one
                with contextlib.suppress(OSError):
                    run.rmdir()
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def _still_the_lock_file(fd: int, lock_path: Path) -> bool:
    """Whether `fd` is still the file at `lock_path` (a lock on a removed file would lock nothing)."""
    try:
        return os.fstat(fd).st_ino == os.stat(lock_path).st_ino
    except FileNotFoundError:
        return False


def hold_run_lock(run: Path, wait_s: float | None = None) -> None:
    """Take RUN's lock now and keep it until `release_held_locks` (the CLI's pre-flight: the command's flows
    re-enter it). RunLocked, having created nothing, when another process holds it."""
    manager = run_lock(run, wait_s)
    manager.__enter__()
    _kept.append(manager)


def release_held_locks() -> None:
    """Release every lock `hold_run_lock` took in this process (the command has ended)."""
    while _kept:
        _kept.pop().__exit__(None, None, None)
