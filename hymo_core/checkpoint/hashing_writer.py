"""A DCP file-system writer that computes every file's sha256 and size while it writes it.

Checkpoint metadata records a digest per file so a damaged shard is found
before anything is loaded. Hashing the bytes as they go to disk costs no
second read of a multi-gigabyte file: each stream DCP opens for writing is
wrapped, and its digest is kept under the file's final name (DCP writes
`.metadata` to a temporary name and renames it; the rename carries the digest).
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path

from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem


class HashingStream:
    """A binary file whose writes also feed a sha256 (DCP needs write, tell, flush, fileno, close)."""

    def __init__(self, handle) -> None:
        self.handle, self.digest, self.size = handle, hashlib.sha256(), 0

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        self.digest.update(view)
        self.size += len(view)
        return self.handle.write(view)

    def __getattr__(self, name: str):  # tell, flush, fileno, close, closed, writable ...
        return getattr(self.handle, name)


class HashingFileSystem(FileSystem):
    """FileSystem whose write streams are hashed; `digests[name] = {"sha256", "bytes"}` once a file is closed."""

    def __init__(self) -> None:
        super().__init__()
        self.digests: dict[str, dict[str, object]] = {}

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Generator:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with Path(path).open(mode) as handle:
            stream = HashingStream(handle)
            yield stream
        self.digests[Path(path).name] = {"sha256": stream.digest.hexdigest(), "bytes": stream.size}

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        super().rename(path, new_path)
        entry = self.digests.pop(Path(path).name, None)
        if entry is not None:
            self.digests[Path(new_path).name] = entry


def hashing_writer(path: str | Path) -> tuple[FileSystemWriter, HashingFileSystem]:
    """A FileSystemWriter (fsyncing each file) into `path`, and the file system that collects its digests."""
    writer = FileSystemWriter(path, sync_files=True)
    writer.fs = HashingFileSystem()
    return writer, writer.fs
