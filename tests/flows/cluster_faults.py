"""`dask worker --preload` of the cluster test: the worker that first gets dedup_fuzzy's signature task of
part-00001 kills itself (SIGKILL, as the OOM killer would); its nanny starts a fresh one. An injected fault."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import tasks.dedup.fuzzy as fuzzy

# Dask may execute a preload file more than once in a process: keep the stage's own function, not an earlier patch.
signature_shard = getattr(fuzzy.signature_shard, "unpatched", fuzzy.signature_shard)


def signature_shard_killing_its_worker_once(shard_path: str, shard: str, config, spill_dir: str, partitions: int, *rest):
    marker = Path(spill_dir).parent / "killed-a-worker-in-signatures"
    if shard == "part-00001" and not marker.exists():
        marker.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return signature_shard(shard_path, shard, config, spill_dir, partitions, *rest)


signature_shard_killing_its_worker_once.unpatched = signature_shard
fuzzy.signature_shard = signature_shard_killing_its_worker_once  # the flow host pickles the task by name: this is what it finds here
