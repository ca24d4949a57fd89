"""Token files are joined by tasks writing their own regions: the same bytes as a sequential copy, none through the host."""
from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

from tasks.corpus.token_join import join_token_files
from tasks.dedup.minhash import ChecksumMismatch


def token_files(tmp_path, sizes: list[int]) -> list[dict]:
    rng = np.random.default_rng(len(sizes))
    shards = []
    for index, size in enumerate(sizes):
        path = tmp_path / f"part-{index:05d}.tokens"
        path.write_bytes(rng.integers(0, 2**16, size, dtype="<u2").tobytes())
        shards.append({"path": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()})
    return shards


def host_write_bytes() -> int:
    """Bytes this process has passed to write(2) and friends so far (Linux /proc accounting)."""
    return int(dict(line.split(": ") for line in open("/proc/self/io").read().splitlines())["wchar"])


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="counts writes through /proc/self/io")
def test_the_joined_file_is_the_concatenation_and_the_host_writes_none_of_it(tmp_path):
    shards = token_files(tmp_path, [300_000, 0, 5, 1_200_000, 700_000])
    before = host_write_bytes()
    sha256 = join_token_files(shards, tmp_path / "joined.bin", workers=2)  # the copies run in the pool's worker processes
    written = host_write_bytes() - before
    expected = b"".join(open(s["path"], "rb").read() for s in shards)
    assert (tmp_path / "joined.bin").read_bytes() == expected and sha256 == hashlib.sha256(expected).hexdigest()
    assert written < len(expected) // 100, (written, len(expected))  # a sequential join on the host writes every byte itself
    assert not list(tmp_path.glob(".joined.bin.partial"))


def test_a_file_that_differs_from_its_digest_publishes_nothing(tmp_path):
    shards = token_files(tmp_path, [1000, 2000])
    with open(shards[1]["path"], "r+b") as handle:
        handle.write(b"\xff\xff")
    with pytest.raises(ChecksumMismatch, match=r"part-00001\.tokens: sha256 differs"):
        join_token_files(shards, tmp_path / "joined.bin", workers=1)
    assert not (tmp_path / "joined.bin").exists() and not list(tmp_path.glob(".joined*"))
