"""Faults injected on purpose into Dask workers (importable by the workers, which unpickle these by reference)."""
from __future__ import annotations

import os
import signal
from pathlib import Path

from tasks.dedup_fuzzy import signature_shard


def signature_shard_killing_its_worker_once(shard_path: str, shard: str, config, spill_dir: str):
    """The first attempt on shard part-00001 kills its own worker process (SIGKILL, as the OOM killer would)."""
    marker = Path(spill_dir).parent / "killed-a-worker"
    if shard == "part-00001" and not marker.exists():
        marker.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return signature_shard(shard_path, shard, config, spill_dir)
