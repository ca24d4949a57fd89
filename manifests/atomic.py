"""Atomic file writes: temp name in the same directory, fsync, rename, fsync the directory.

A reader either sees the old file, the complete new file, or nothing — never a
half-written one — whatever the moment a crash happens.
"""
from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path
from typing import Iterable

import pyarrow as pa
import pyarrow.parquet as pq

# Fixed writer options so that the same table always gives the same bytes.
PARQUET_OPTIONS = dict(compression="zstd", use_dictionary=True, write_statistics=True, row_group_size=16384)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, payload: bytes, sync: bool = True) -> None:
    """`sync=False` for a stage's intermediate file, removed before the stage publishes: still never seen half-written,
    but not forced to disk (a crash reruns the whole stage, so two fsyncs, ~10 ms, would buy nothing)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            if sync:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except OSError as exc:
        Path(tmp_name).unlink(missing_ok=True)
        if exc.filename:
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from exc  # a full disk says which file it could not write
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    if sync:
        fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def parquet_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, **PARQUET_OPTIONS)
    return sink.getvalue()


def atomic_write_parquet(path: Path, table: pa.Table, sync: bool = True) -> None:
    if sync:
        atomic_write_bytes(path, parquet_bytes(table))
    else:
        atomic_write_bytes(path, parquet_bytes(table), sync=False)


def atomic_write_parquet_stream(path: Path, schema: pa.Schema, tables: Iterable[pa.Table]) -> int:
    """A Parquet file of `tables` in order, holding one row group at a time; returns the rows written.

    Rows are regrouped into row groups of PARQUET_OPTIONS' size, as pq.write_table
    cuts one table, so the bytes are those of `atomic_write_parquet` on their
    concatenation: a file assembled from per-shard pieces does not depend on
    how the pieces were cut.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    group = PARQUET_OPTIONS["row_group_size"]
    options = {k: v for k, v in PARQUET_OPTIONS.items() if k != "row_group_size"}
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    rows, pending = 0, schema.empty_table()
    try:
        with pq.ParquetWriter(tmp_name, schema, **options) as writer:
            for table in tables:
                pending = pa.concat_tables([pending, table.select(schema.names).cast(schema)])
                while pending.num_rows >= group:
                    writer.write_table(pending.slice(0, group), row_group_size=group)
                    pending, rows = pending.slice(group), rows + group
            if pending.num_rows or not rows:
                writer.write_table(pending, row_group_size=group)
                rows += pending.num_rows
        with open(tmp_name, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return rows
