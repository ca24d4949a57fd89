"""Arrow tables a global pass's task hands to later tasks: one checked spill file per writer, one slice per partition.

A shuffle that writes a Parquet file per (writer, partition) makes writers ×
partitions files, millions at a billion documents. Here a task writes each
partition's rows as an Arrow IPC stream, all of them back to back in one
.npy of bytes (tasks/dedup/minhash.write_checked_array), and returns one
`Slice` (byte range and its sha256) per partition: a reader preads and
checks exactly its own bytes (tasks/dedup/spill_reader.SpillFiles), whatever
the number of readers. The same table gives the same bytes on a re-run.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa

from tasks.dedup.minhash import write_checked_array
from tasks.dedup.near_dup_files import Slice
from tasks.dedup.spill_reader import SpillFiles


def ipc_bytes(table: pa.Table) -> bytes:
    """The table as one Arrow IPC stream; an empty table as no bytes at all (its slice is empty)."""
    if not table.num_rows:
        return b""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def write_table_slices(path: Path, tables: list[pa.Table]) -> list[Slice]:
    """Write `tables` (one per partition) into one checked file; one slice per partition, empty where its table is."""
    blobs = [ipc_bytes(table) for table in tables]
    bounds = np.cumsum([0, *map(len, blobs)]).tolist()
    write_checked_array(Path(path), np.frombuffer(b"".join(blobs), dtype=np.uint8))
    return [Slice(str(path), start, stop, hashlib.sha256(blob).hexdigest()) for start, stop, blob in zip(bounds, bounds[1:], blobs)]


def read_table_slices(spill: SpillFiles, slices: list[Slice], schema: pa.Schema) -> pa.Table:
    """The rows of `slices`, concatenated in the order given, each checked against its writer's digest."""
    tables = [schema.empty_table()]
    for part in slices:
        payload = spill.read_checked_slice(part.path, part.start, part.stop, part.sha256)  # an empty slice is checked too
        if len(payload):
            tables.append(pa.ipc.open_stream(pa.py_buffer(payload)).read_all())
    return pa.concat_tables(tables)
