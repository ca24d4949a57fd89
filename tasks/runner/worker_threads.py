"""How many threads native code may use inside a runner task: one worker slot's share, not the machine.

A process-pool worker or a Dask worker thread is one slot of a runner that
already keeps every core busy with one slot per core. A Rust thread pool
(HF tokenizers' rayon) sized to all cores in each of them oversubscribes the
machine W-fold: on 2 cores, 2 mixture workers spent about a fifth of their CPU
on it. Rayon reads RAYON_NUM_THREADS once, when its pool is first used, so the
cap is set before the first parallel call of the process.
"""
from __future__ import annotations

import multiprocessing
import os
import sys


def slot_threads() -> int | None:
    """Threads of the runner slot this process is: the Dask worker's thread count, 1 in a pool worker, None in the flow host."""
    distributed = sys.modules.get("distributed")
    if distributed is not None:
        try:
            return max(1, int(distributed.get_worker().state.nthreads))
        except ValueError:  # not inside a Dask worker
            pass
    return 1 if multiprocessing.parent_process() is not None else None


def cap_native_threads() -> None:
    """Size rayon's pool to this slot (unless the user chose RAYON_NUM_THREADS); a no-op in the flow host."""
    if "RAYON_NUM_THREADS" in os.environ:
        return
    threads = slot_threads()
    if threads is not None:
        os.environ["RAYON_NUM_THREADS"] = str(threads)
