"""Faults injected on purpose into Dask workers (importable by the workers, which unpickle these by reference)."""
from __future__ import annotations

import os
import signal
from pathlib import Path

from tasks.dedup.fuzzy import signature_shard
from tasks.dedup.lsh_buckets import link_key_partition


def signature_shard_killing_its_worker_once(shard_path: str, shard: str, config, spill_dir: str, partitions: int, *rest):
    """The first attempt on shard part-00001 kills its own worker process (SIGKILL, as the OOM killer would)."""
    kill_once(Path(spill_dir).parent / "killed-a-worker-in-signatures", shard == "part-00001")
    return signature_shard(shard_path, shard, config, spill_dir, partitions, *rest)


def link_key_partition_killing_its_worker_once(corpus, config, partition: int, partitions: int, out_dir: str):
    """The first attempt on key partition 1 kills its worker after writing part of its output (as the OOM killer would)."""
    marker = Path(out_dir).parent / "killed-a-worker-in-buckets"
    if partition == 1 and not marker.exists():
        (Path(out_dir) / "candidates-00001.npy").write_bytes(b"half a file")  # what a dying writer may leave
    kill_once(marker, partition == 1)
    return link_key_partition(corpus, config, partition, partitions, out_dir)


def kill_once(marker: Path, here: bool) -> None:
    if here and not marker.exists():
        marker.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
