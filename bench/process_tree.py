"""What the benches' samplers read of a process tree: its pids, and each process's RSS and CPU seconds."""
from __future__ import annotations


def tree_pids(pid: int) -> set[int]:
    """`pid` and every descendant of it; empty once it has gone."""
    import psutil

    try:
        root = psutil.Process(pid)
        return {root.pid, *(p.pid for p in root.children(recursive=True))}
    except psutil.Error:
        return set()


def usage(pid: int) -> tuple[float, float] | None:
    """(RSS in MB, user + system CPU seconds) of one process; None once it has gone."""
    import psutil

    try:
        process = psutil.Process(pid)
        with process.oneshot():
            times = process.cpu_times()
            return process.memory_info().rss / 2**20, times.user + times.system
    except psutil.Error:
        return None
