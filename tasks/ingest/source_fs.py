"""Sources behind an fsspec URL (s3://, gs://, hf://, memory://, file://...): listing, streaming opens, digests.

A source spec's `path` that contains "://" is read through fsspec, with
credentials and endpoints from the environment the way fsspec and the
filesystem's own client find them (AWS_* variables, ~/.aws, FSSPEC_S3_*
config, ...). Files are opened as streams: a multi-GB WARC is read record
by record, never fetched whole. Everything the ingest stage records about a
remote file (its path inside the source, hence document ids) is relative to
the source's root, so the same files give the same ids from any scheme.

Every failure to reach the store (no credentials, no bucket, no network)
becomes one RemoteSourceError (an InputFileError) line naming the source
and the URL, raised while planning, before the stage writes anything.

A remote file is read once per run. Its cheap identity is what the listing
already says (size plus the store's version token: S3 ETag / VersionId, GCS
generation, ...), so a re-run of unchanged objects reads none of their bytes;
a new or changed object is hashed by the task that ingests it, from the same
stream (`RemoteFile.digesting`), instead of a separate digest pass.
"""
from __future__ import annotations

import gzip
import hashlib
import io
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath
from typing import IO, Any

import fsspec

REMOTE_READ_BLOCK = 8 << 20  # read-ahead of one remote stream
# What a store's listing says changes when an object is rewritten (S3, GCS, Azure, the Hub): with the size, the cheap check.
VERSION_KEYS = ("VersionId", "version_id", "generation", "ETag", "etag", "md5Hash", "content_md5", "blob_id")


class InputFileError(RuntimeError):
    """An input file cannot be read as a whole; the stage fails and publishes nothing."""


class TruncatedInput(OSError):
    """A compressed stream ended before its end mark: the file was cut (a download that stopped, a full disk)."""


class RemoteSourceError(InputFileError):
    """A remote source cannot be listed or read; the message names the source and the URL."""


def is_url(path: str) -> bool:
    return "://" in str(path)


@dataclass(frozen=True)
class RemoteFile:
    """One file of a remote source: its filesystem, its path there, its URL, and its path inside the source."""

    fs: Any
    path: str
    url: str
    relative: str
    stat: tuple | None = None  # (size, version tokens) from the listing; None when the store reports no version
    tap: "StreamDigest | None" = field(default=None, compare=False)  # set: open() hashes what it streams

    def digesting(self) -> "RemoteFile":
        """This file, with open() hashing every byte the reader takes (and the rest, at close)."""
        return replace(self, tap=StreamDigest())

    @property
    def name(self) -> str:
        return PurePosixPath(self.path).name

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.path).suffix

    def open(self) -> IO[bytes]:
        handle = self.fs.open(self.path, "rb", block_size=REMOTE_READ_BLOCK)
        return handle if self.tap is None else io.BufferedReader(DigestingReader(handle, self.tap), REMOTE_READ_BLOCK)

    def __str__(self) -> str:
        return self.url


class StreamDigest:
    """sha256 and size of one remote file, accumulated while a reader streams it."""

    def __init__(self) -> None:
        self.sha = hashlib.sha256()
        self.size = 0
        self.complete = False

    def hexdigest(self) -> str | None:
        return self.sha.hexdigest() if self.complete else None


class DigestingReader(io.RawIOBase):
    """A raw stream that hashes what passes through it; closing reads (and hashes) what the reader left, so the
    digest is the whole file's even when a decoder stops before EOF (a zstd frame's end, a WARC's padding)."""

    def __init__(self, handle: IO[bytes], digest: StreamDigest):
        self.handle, self.digest = handle, digest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.handle.read(len(buffer))
        buffer[:len(data)] = data
        self.digest.sha.update(data)
        self.digest.size += len(data)
        return len(data)

    def close(self) -> None:
        if not self.closed:
            try:
                while data := self.handle.read(1 << 20):
                    self.digest.sha.update(data)
                    self.digest.size += len(data)
                self.digest.complete = True
            finally:
                self.handle.close()
        super().close()


def remote_stat(info: dict[str, Any]) -> tuple | None:
    """A file's (size, version tokens) from its listing entry; None when the store gives no version (only the bytes tell)."""
    size = info.get("size", info.get("Size"))
    tokens = tuple(f"{key}={info[key]}" for key in VERSION_KEYS if info.get(key))
    return (int(size), *tokens) if tokens and size is not None else None


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}" or type(exc).__name__


def list_remote(source: str, url: str, pattern: str, single_entry: bool) -> list[RemoteFile]:
    """The files of a remote source matching `pattern` under `url` (or `url` itself when it is a file), sorted.

    `single_entry`: the source is one entry (a dataset directory) rather than files to glob.
    """
    try:
        fs, root = fsspec.core.url_to_fs(url)
        protocol = url.split("://", 1)[0]
        root = root.rstrip("/")
        if single_entry or fs.isfile(root):
            if not fs.exists(root):
                raise FileNotFoundError(root)
            info = fs.info(root)
            return [RemoteFile(fs, root, url, PurePosixPath(root).name, remote_stat(info) if info.get("type") == "file" else None)]
        matches = fs.glob(f"{root}/{pattern}", detail=True)
    except Exception as exc:  # each client raises its own types (botocore, aiohttp, OSError ...): all mean "cannot reach"
        raise RemoteSourceError(f"source {source}: cannot list {url} ({describe(exc)})") from exc
    files = sorted(path for path, info in matches.items() if info.get("type") == "file")
    if not files:
        raise RemoteSourceError(f"source {source}: {url} has no file matching {pattern!r}")
    return [RemoteFile(fs, path, f"{protocol}://{path}", path[len(root) + 1:], remote_stat(matches[path])) for path in files]


def open_stream(file: RemoteFile, source: str, name_must_agree: bool = True) -> IO[bytes]:
    """A streaming binary handle on the file's content, decompressed as its first bytes say (see `open_content`)."""
    try:
        handle = file.open()
    except Exception as exc:
        raise RemoteSourceError(f"source {source}: cannot open {file.url} ({describe(exc)})") from exc
    return open_content(handle, file, name_must_agree)


# A file is what its first bytes say, whatever its name says; a reader trusts it only when it says it ended.
CONTAINER_MAGIC = {"gzip": b"\x1f\x8b", "zstd": b"\x28\xb5\x2f\xfd"}
CONTAINER_SUFFIX = {".gz": "gzip", ".zst": "zstd"}


def sniff_container(head: bytes) -> str | None:
    """"gzip" or "zstd" when `head` (a file's first bytes) opens such a stream, else None (plain bytes)."""
    return next((name for name, magic in CONTAINER_MAGIC.items() if head.startswith(magic)), None)


def open_content(handle: IO[bytes], file: Any, name_must_agree: bool = True) -> IO[bytes]:
    """`handle`'s content: gunzipped or un-zstd-ed when its first bytes say so. Either decoder raises EOFError
    when the input ends before the stream's end mark (gzip's trailer, each zstd frame's last block), so a cut
    file fails the read instead of ending early: TruncatedInput, an OSError (warcio reads an EOFError as the
    archive's end). `name_must_agree`: a gzip or zstd stream under a plain name
    (an `export.jsonl` that is gzip), or a `.gz`/`.zst` name over plain bytes, is an InputFileError."""
    buffered = handle if hasattr(handle, "peek") else io.BufferedReader(handle, REMOTE_READ_BLOCK)
    try:
        head = buffered.peek(4)[:4]
    except Exception:
        buffered.close()
        raise
    if not head:
        return buffered  # an empty file: no records, audited as `ingest_empty_file` whatever its name
    found, named = sniff_container(head), CONTAINER_SUFFIX.get(PurePosixPath(str(file)).suffix)
    if name_must_agree and found != named:
        buffered.close()
        what = f"{found} data" if found else "plain (uncompressed) data"
        fix = f"rename it to end in {next(s for s, n in CONTAINER_SUFFIX.items() if n == found)}" if found else "rename it without the compression suffix"
        raise InputFileError(f"{file}: {what} in a file named {PurePosixPath(str(file)).name} ({fix})")
    if found == "gzip":
        return io.BufferedReader(GzipEnd(ClosingGzipFile(buffered)), REMOTE_READ_BLOCK)
    if found == "zstd":
        return io.BufferedReader(ZstdFrames(buffered), REMOTE_READ_BLOCK)
    return buffered


ZSTD_READ = 128 << 10  # compressed bytes decoded at a time (zstd's own stream input size): bounds the decoded burst


class ZstdFrames(io.RawIOBase):
    """The decompressed bytes of a stream of zstd frames; EOFError when the input ends inside a frame.

    python-zstandard's `stream_reader` returns a short read at a cut frame, with no error: a truncated
    `.zst` would read as a complete, shorter file. Here each frame is decoded by its own decompressobj,
    whose `eof` says whether the frame's last block arrived."""

    def __init__(self, handle: IO[bytes]):
        import zstandard

        self.handle, self.decompressor, self.errors = handle, zstandard.ZstdDecompressor(), zstandard.ZstdError
        self.frame: Any = None  # the decompressobj of the frame being read; None between frames
        self.pending, self.at = b"", 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while self.at >= len(self.pending):
            chunk = self.handle.read(ZSTD_READ)
            if not chunk:
                if self.frame is not None:
                    raise TruncatedInput("zstd stream ended inside a frame: the file is truncated")
                return 0
            decoded = []
            try:
                while chunk:
                    self.frame = self.frame or self.decompressor.decompressobj()
                    decoded.append(self.frame.decompress(chunk))
                    chunk, self.frame = (self.frame.unused_data, None) if self.frame.eof else (b"", self.frame)
            except self.errors as exc:
                raise OSError(f"not valid zstd data ({exc})") from exc
            self.pending, self.at = b"".join(decoded), 0
        size = min(len(buffer), len(self.pending) - self.at)
        buffer[:size] = self.pending[self.at:self.at + size]
        self.at += size
        return size

    def close(self) -> None:
        if not self.closed:
            self.handle.close()
        super().close()


class GzipEnd(io.RawIOBase):
    """A GzipFile's bytes; its EOFError at a cut member becomes TruncatedInput."""

    def __init__(self, gzip_file: gzip.GzipFile):
        self.gzip_file = gzip_file

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            return self.gzip_file.readinto(buffer)
        except EOFError as exc:
            raise TruncatedInput("gzip stream ended before its end-of-stream marker: the file is truncated") from exc

    def close(self) -> None:
        if not self.closed:
            self.gzip_file.close()
        super().close()


class ClosingGzipFile(gzip.GzipFile):
    """A GzipFile that closes the stream it decompresses (GzipFile leaves a passed fileobj open)."""

    def __init__(self, handle: IO[bytes]):
        super().__init__(fileobj=handle, mode="rb")
        self.owned = handle

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.owned.close()


def remote_digest(file: RemoteFile, source: str) -> str:
    """sha256 of the file's bytes, streamed (a directory entry: of its files' names and digests, like a local one)."""
    try:
        if file.fs.isdir(file.path):
            digest = hashlib.sha256()
            for path in sorted(file.fs.find(file.path)):
                relative = path[len(file.path.rstrip("/")) + 1:]
                digest.update(relative.encode() + b"\0" + stream_sha256(file.fs, path).encode())
            return digest.hexdigest()
        return stream_sha256(file.fs, file.path)
    except Exception as exc:
        raise RemoteSourceError(f"source {source}: cannot read {file.url} ({describe(exc)})") from exc


def stream_sha256(fs: Any, path: str) -> str:
    digest = hashlib.sha256()
    with fs.open(path, "rb", block_size=REMOTE_READ_BLOCK) as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
