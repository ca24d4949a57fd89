"""Atomic file writes: temp name in the same directory, fsync, rename, fsync the directory.

A reader either sees the old file, the complete new file, or nothing — never a
half-written one — whatever the moment a crash happens.
"""
from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path

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


def atomic_write_bytes(path: Path, payload: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
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
    fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def parquet_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, **PARQUET_OPTIONS)
    return sink.getvalue()


def atomic_write_parquet(path: Path, table: pa.Table) -> None:
    atomic_write_bytes(path, parquet_bytes(table))
