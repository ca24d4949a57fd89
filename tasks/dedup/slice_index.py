"""A partitioned spill file's slices kept on disk beside it, so the planning process holds one record per writer.

A shuffle of W writers into P partitions has W × P slices; handed back to the
planning process as objects they cost ~300 B each, and P is at least twice
the workers: 10k shards on 64 workers already make a million. Here each
writer stores its slices (start, stop, sha256 of the bytes) as `<file>.index.npy`,
and the reader of partition p preads entry p of each writer's index. An
entry is checked through the bytes it points to: a corrupt entry names a
range whose sha256 is not the one it records (empty ranges are checked too).
Writers name their files by a number (shard or partition index), so a
reader needs only the directory and the writer count.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from tasks.dedup.minhash import write_checked_array
from tasks.dedup.near_dup_files import Slice
from tasks.dedup.spill_reader import SpillFiles

INDEX_ENTRY = np.dtype([("start", "<i8"), ("stop", "<i8"), ("sha256", "u1", (32,))])


def numbered_file(directory: str | Path, number: int) -> str:
    """The spill file of writer `number` in `directory`."""
    return str(Path(directory) / f"{number:06d}.npy")


def index_path(path: str) -> str:
    return f"{path}.index.npy"


def write_slice_index(path: str, slices: list[Slice]) -> int:
    """Store `slices` (one per partition, all of file `path`) beside it; returns how many hold any element."""
    entries = np.zeros(len(slices), INDEX_ENTRY)
    entries["start"] = [s.start for s in slices]
    entries["stop"] = [s.stop for s in slices]
    entries["sha256"] = np.frombuffer(b"".join(bytes.fromhex(s.sha256) for s in slices), np.uint8).reshape(len(slices), 32)
    write_checked_array(Path(index_path(path)), entries)
    return sum(s.stop > s.start for s in slices)


def indexed_slice(spill: SpillFiles, path: str, part: int) -> Slice:
    """Partition `part`'s slice of file `path`, read from its index (one entry, one pread)."""
    [entry] = spill.read_unverified(index_path(path), part, part + 1)
    return Slice(path, int(entry["start"]), int(entry["stop"]), entry["sha256"].tobytes().hex())


def writer_slices(spill: SpillFiles, path: str) -> list[Slice]:
    """Every partition's slice of file `path`, read from its index (the writer's own view, e.g. to re-key its records)."""
    index = index_path(path)
    spill.read_unverified(index, 0, 0)  # raises ChecksumMismatch when it is missing; learns its length
    entries = spill.read(index, 0, spill.shape(index)[0])
    return [Slice(path, int(e["start"]), int(e["stop"]), e["sha256"].tobytes().hex()) for e in entries]


def partition_slices(spill: SpillFiles, directory: str | Path, writers: int, part: int) -> list[Slice]:
    """Partition `part`'s slice of every writer's file in `directory`, in writer order (empty ones included)."""
    return [indexed_slice(spill, numbered_file(directory, writer), part) for writer in range(writers)]
