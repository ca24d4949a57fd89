"""Per-shard token files joined into one stream by runner tasks, each writing its own region: no token passes the host.

The tokenising tasks write one file per split shard; the stream the shards
stage cuts is their concatenation in shard order. Copying them on the flow
host made every training token pass through one process (15 CPU-minutes of
reading and writing per 100 GB). Here the host only adds the sizes up into
each file's byte offset and sizes a partial file; one task per shard checks
its file against the digest its writer recorded while copying it into its
region with positioned writes, and the host renames the partial file once
every region is written. A task re-run after a dead worker writes the same
bytes at the same place; on a cluster the output sits on the shared mount.
The joined file's sha256 (a whole-file digest cannot be put together from the
regions' digests) is taken by one more runner task, so the manifest gets it
without the flow host reading the stream.
"""
from __future__ import annotations

import hashlib
import os
from itertools import accumulate
from pathlib import Path
from typing import Any

from manifests.digest import sha256_file
from tasks.dedup.minhash import ChecksumMismatch
from tasks.runner.stage_runner import map_shards

COPY_BYTES = 8 << 20  # memory per copy, whatever the corpus


def place_token_file(part_path: str, sha256: str, joined_path: str, offset: int, sync: bool = True) -> int:
    """Task: copy one shard's token file into the joined file at `offset`, checked against its task's sha256; bytes copied
    (forced to disk unless `sync` is False: a joined file that is an intermediate of its stage)."""
    digest, written = hashlib.sha256(), 0
    out = os.open(joined_path, os.O_WRONLY)
    try:
        with open(part_path, "rb") as part:
            while chunk := part.read(COPY_BYTES):
                digest.update(chunk)
                os.pwrite(out, chunk, offset + written)
                written += len(chunk)
        if sync:
            os.fsync(out)
    finally:
        os.close(out)
    if digest.hexdigest() != sha256:
        raise ChecksumMismatch(f"{part_path}: sha256 differs from what its task recorded; nothing was published")
    return written


def hash_joined_file(path: str) -> str:
    """Task: the joined stream's sha256, read on a runner worker (on one machine, in place)."""
    return sha256_file(Path(path))


def join_token_files(shards: list[dict[str, Any]], joined_path: Path, workers: int, digest: bool = True, sync: bool = True) -> str | None:
    """The shards' token files (each {"path", "sha256"}), in the order given, as one file at `joined_path`; its sha256
    (None with `digest=False`, for a joined file no manifest lists; `sync=False` for one its stage removes before publishing)."""
    sizes = [Path(shard["path"]).stat().st_size for shard in shards]
    offsets = [0, *accumulate(sizes)][:-1]
    partial = Path(joined_path).with_name(f".{Path(joined_path).name}.partial")
    with open(partial, "wb") as handle:
        handle.truncate(sum(sizes))
    jobs = [(shard["path"], shard["sha256"], str(partial), offset, sync) for shard, offset in zip(shards, offsets)]
    try:
        copied = sum(map_shards(place_token_file, jobs, workers, "joining token files", sizes))
        if copied != sum(sizes):
            raise OSError(f"{partial}: {copied} token bytes copied, {sum(sizes)} expected; nothing was published")
        os.replace(partial, joined_path)
    finally:
        partial.unlink(missing_ok=True)
    if not digest:
        return None
    return next(iter(map_shards(hash_joined_file, [(str(joined_path),)], workers, "hashing the token stream", [sum(sizes)])))
