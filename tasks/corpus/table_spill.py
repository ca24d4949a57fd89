"""Split's shuffle: rows cut into partitions by a hash of a string column, written and read as checked table slices.

Each planning task writes its rows as one file of per-partition Arrow slices
(tasks/dedup/table_slices.py) and returns the non-empty partitions' slices;
the task that reads partition p is handed the slices of p from every writer.
What the flow host holds is those slices, never rows.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa

from tasks.dedup.near_dup_files import Slice
from tasks.dedup.spill_reader import SpillFiles
from tasks.dedup.table_slices import read_table_slices, write_table_slices

HASH_BATCH = 65536  # strings hashed per Python batch: a task's per-row Python objects stay bounded


def string_hashes(values: pa.Array | pa.ChunkedArray, salt: str) -> np.ndarray:
    """64-bit blake2b of f"{salt}\\x00{value}" for every string, as uint64 (the big-endian digest: int(hexdigest, 16))."""
    out = np.empty(len(values), dtype=np.uint64)
    for start in range(0, len(values), HASH_BATCH):
        chunk = values.slice(start, HASH_BATCH).to_pylist()
        out[start:start + len(chunk)] = [int.from_bytes(hashlib.blake2b(f"{salt}\x00{value}".encode("utf-8"), digest_size=8).digest(), "big")
                                         for value in chunk]
    return out


def hash_range(hashes: np.ndarray, partitions: int) -> np.ndarray:
    """Partition of each uint64 by range (top 32 bits scaled onto [0, partitions)): monotone in the hash."""
    return ((hashes >> np.uint64(32)) * np.uint64(partitions) >> np.uint64(32)).astype(np.int64)


def write_partitioned_table(path: Path, table: pa.Table, partition_of: np.ndarray, partitions: int) -> dict[int, Slice]:
    """`table`'s rows by partition (in row order within one) into one checked file: partition -> slice, non-empty ones only."""
    order = np.argsort(partition_of, kind="stable")
    table = table.take(pa.array(order, pa.int64())).combine_chunks()
    bounds = np.searchsorted(np.asarray(partition_of)[order], np.arange(partitions + 1)).tolist()
    slices = write_table_slices(Path(path), [table.slice(start, stop - start) for start, stop in zip(bounds, bounds[1:])])
    return {part: piece for part, piece in enumerate(slices) if piece.stop > piece.start}


def read_slices(slices: list[Slice], schema: pa.Schema) -> pa.Table:
    """The rows of the given slices, each checked against its writer's digest, as one table (empty with `schema` when none)."""
    spill = SpillFiles()
    try:
        return read_table_slices(spill, slices, schema).combine_chunks()
    finally:
        spill.close()
