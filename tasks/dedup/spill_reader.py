"""Piecewise reads of checksummed .npy spill files, so the global dedup pass never maps a whole file.

A memory-mapped spill file keeps every page it ever touched in the process's
resident set until it is unmapped: verification touching documents all over
800 MB of shingle hashes looked like 800 MB of memory. Reading exactly the
bytes needed with `os.pread` into a fresh array keeps resident memory at what
the pass holds on purpose. Each file's sha256 is still checked once per
process, before its first read (the pass's tasks run in long-lived workers:
a file every task reads is hashed once per worker, not once per task). A
file written in partition slices is checked slice by slice instead, each
reader hashing exactly the bytes it reads.
"""
from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from functools import lru_cache
from pathlib import Path

import numpy as np
from numpy.lib import format as npy_format

from tasks.dedup.minhash import ChecksumMismatch, read_checked_array

OPEN_FILES = 64  # spill files kept open at once (a corpus may have thousands of shards)
VERIFIED: set[tuple[str, str]] = set()  # (path, sha256) this process has checked; a rewritten file has a new digest


def npy_layout(path: Path) -> tuple[int, np.dtype, tuple[int, ...]]:
    """(byte offset of the data, dtype, shape) of a C-ordered .npy file.

    Parsed once per process for a file of the same size and mtime: a worker's tasks read one entry of the same
    slice-index files again and again (shards × ranges of them), and a header parse costs ~0.15 ms."""
    stat = os.stat(path)
    return _npy_layout(str(path), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=1 << 14)
def _npy_layout(path: str, size: int, mtime_ns: int) -> tuple[int, np.dtype, tuple[int, ...]]:
    with open(path, "rb") as handle:
        version = npy_format.read_magic(handle)
        read_header = npy_format.read_array_header_1_0 if version == (1, 0) else npy_format.read_array_header_2_0
        shape, fortran_order, dtype = read_header(handle)
        if fortran_order:
            raise ValueError(f"{path}: spill file is Fortran-ordered; its rows cannot be read piecewise")
        return handle.tell(), dtype, shape


class SpillFiles:
    """Checksum-verified spill files, read a slice at a time through a small pool of open descriptors."""

    def __init__(self) -> None:
        self.layouts: dict[str, tuple[int, np.dtype, tuple[int, ...]]] = {}
        self.handles: OrderedDict[str, int] = OrderedDict()

    def verify(self, path: str, expected_sha256: str) -> None:
        """Check the file's digest (raises ChecksumMismatch) and remember its layout; nothing stays mapped."""
        if path not in self.layouts:
            if (path, expected_sha256) not in VERIFIED:
                read_checked_array(Path(path), expected_sha256)  # raises ChecksumMismatch; the map it returns is dropped
                VERIFIED.add((path, expected_sha256))
            self.layouts[path] = npy_layout(Path(path))

    def shape(self, path: str) -> tuple[int, ...]:
        return self.layouts[path][2]

    def read(self, path: str, start: int, stop: int) -> np.ndarray:
        """Elements [start, stop) of the file's data in C order (a verified file only)."""
        offset, dtype, _ = self.layouts[path]
        count = stop - start
        if count <= 0:
            return np.empty(0, dtype=dtype)
        payload = os.pread(self._handle(path), count * dtype.itemsize, offset + start * dtype.itemsize)
        if len(payload) != count * dtype.itemsize:
            raise OSError(f"{path}: spill file ended early (wanted {count} values from element {start})")
        return np.frombuffer(payload, dtype=dtype)

    def read_unverified(self, path: str, start: int, stop: int) -> np.ndarray:
        """Elements [start, stop) of a file not checked as a whole: its parts check themselves (a slice against the
        digest its writer recorded, an index entry against the bytes it points to)."""
        if path not in self.layouts:
            if not Path(path).is_file():
                raise ChecksumMismatch(f"{path}: intermediate file is missing")
            self.layouts[path] = npy_layout(Path(path))
        return self.read(path, start, stop)

    def read_checked_slice(self, path: str, start: int, stop: int, expected_sha256: str) -> np.ndarray:
        """Elements [start, stop) of a file written in slices, checked against the digest recorded for that slice."""
        values = self.read_unverified(path, start, stop)
        actual = hashlib.sha256(values.tobytes()).hexdigest()
        if actual != expected_sha256:
            raise ChecksumMismatch(f"{path}: sha256 of elements [{start}, {stop}) is {actual[:12]}… but its writer recorded "
                                   f"{expected_sha256[:12]}…; the intermediate file is corrupt, nothing was published")
        return values

    def row(self, path: str, row: int) -> np.ndarray:
        """Row `row` of a 2-D spill file."""
        width = self.shape(path)[1]
        return self.read(path, row * width, (row + 1) * width)

    def _handle(self, path: str) -> int:
        if path in self.handles:
            self.handles.move_to_end(path)
            return self.handles[path]
        if len(self.handles) >= OPEN_FILES:
            os.close(self.handles.popitem(last=False)[1])
        self.handles[path] = os.open(path, os.O_RDONLY)
        return self.handles[path]

    def close(self) -> None:
        while self.handles:
            os.close(self.handles.popitem()[1])
