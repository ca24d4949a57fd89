"""Partitioned Arrow spills: how a global pass's tasks hand rows to each other as files, never through the flow host.

A task writes one file holding one Arrow IPC stream per partition, back to
back, and returns a `TableSlice` (byte range and its sha256) per non-empty
partition; the task that reads partition p is handed the slices of p from
every writer, reads exactly those bytes and checks them. What the flow host
holds is those slices: O(writers × partitions) small records, no rows.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
import pyarrow as pa

from manifests.atomic import atomic_write_bytes
from tasks.dedup.minhash import ChecksumMismatch

HASH_BATCH = 65536  # strings hashed per Python batch: a task's per-row Python objects stay bounded


@dataclass(frozen=True, slots=True)
class TableSlice:
    """Bytes [start, stop) of a spill file (one partition's Arrow IPC stream) and their sha256."""

    path: str
    start: int
    stop: int
    sha256: str


def string_hashes(values: pa.Array | pa.ChunkedArray, salt: str) -> np.ndarray:
    """64-bit blake2b of f"{salt}\\x00{value}" for every string, as uint64 (big-endian digest: int(hexdigest, 16))."""
    out = np.empty(len(values), dtype=np.uint64)
    for start in range(0, len(values), HASH_BATCH):
        chunk = values.slice(start, HASH_BATCH).to_pylist()
        out[start:start + len(chunk)] = [int.from_bytes(hashlib.blake2b(f"{salt}\x00{value}".encode("utf-8"), digest_size=8).digest(), "big")
                                         for value in chunk]
    return out


def hash_range(hashes: np.ndarray, partitions: int) -> np.ndarray:
    """Partition of each uint64 by range (top 32 bits scaled onto [0, partitions)): monotone in the hash."""
    return ((hashes >> np.uint64(32)) * np.uint64(partitions) >> np.uint64(32)).astype(np.int64)


def write_partitioned_table(path: Path, table: pa.Table, partition_of: np.ndarray, partitions: int) -> dict[int, TableSlice]:
    """`table`'s rows by partition (stable within one) into one file, atomically: partition -> its slice, non-empty ones only."""
    order = np.argsort(partition_of, kind="stable")
    table = table.take(pa.array(order, pa.int64())).combine_chunks()
    bounds = np.searchsorted(np.asarray(partition_of)[order], np.arange(partitions + 1)).tolist()
    payload, slices = bytearray(), {}
    for part, (start, stop) in enumerate(zip(bounds, bounds[1:])):
        if stop == start:
            continue
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table.slice(start, stop - start))
        chunk = sink.getvalue().to_pybytes()
        slices[part] = TableSlice(str(path), len(payload), len(payload) + len(chunk), hashlib.sha256(chunk).hexdigest())
        payload += chunk
    if slices:
        atomic_write_bytes(Path(path), bytes(payload))
    return slices


def read_table_slices(slices: Iterable[TableSlice], schema: pa.Schema) -> pa.Table:
    """The rows of the given slices, each checked against its sha256, as one table (empty with `schema` when none)."""
    tables = [schema.empty_table()]
    for piece in slices:
        with open(piece.path, "rb") as handle:
            handle.seek(piece.start)
            chunk = handle.read(piece.stop - piece.start)
        if hashlib.sha256(chunk).hexdigest() != piece.sha256:
            raise ChecksumMismatch(f"{piece.path}: bytes {piece.start}-{piece.stop} differ from what their writer recorded; "
                                   "the intermediate file is corrupt, nothing was published")
        tables.append(pa.ipc.open_stream(pa.py_buffer(chunk)).read_all())
    return pa.concat_tables(tables).combine_chunks()
