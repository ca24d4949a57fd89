"""MinHash signatures, LSH band keys, the S-curve, union-find, and checksummed spill files.

Seed 001, "推导 MinHash" / "推导 LSH 分带" / "成本、验证与聚类". A signature
is the minimum of k hash functions over a document's shingle hashes; k = b·r
values are cut into b bands of r rows, and two documents become a candidate
pair when all r rows of some band agree, with probability
P(s) = 1 − (1 − s^r)^b for Jaccard s.

The k hash functions are multiply-shift hashes h_i(x) = (a_i·x + c_i mod 2^64) >> 32
of the (already well mixed) 64-bit shingle hashes: one multiply, one add and
one shift per value, which numpy runs over a block of shingles × k at once.
"""
from __future__ import annotations

import hashlib
import json
from array import array
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tasks.dedup.shingles import COMBINE, mix64

SIGNATURE_SENTINEL = np.uint32(0xFFFFFFFF)  # signature of an empty shingle set; never bucketed
BLOCK_SHINGLES = 1 << 13  # shingles per vectorised block: block × k × 8 bytes of scratch (~7 MB at k=112: two workers' three passes stay in a 32 MB L3)


class ChecksumMismatch(RuntimeError):
    """An intermediate file does not hold the bytes its writer recorded."""


@dataclass(frozen=True)
class HashFamily:
    """The k multiply-shift hash functions shared by every document of a run."""

    multipliers: np.ndarray  # uint64, odd
    increments: np.ndarray  # uint64

    @classmethod
    def from_seed(cls, num_hashes: int, seed: int) -> "HashFamily":
        rng = np.random.default_rng(seed)
        multipliers = rng.integers(0, 2**63, size=num_hashes, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
        increments = rng.integers(0, 2**63, size=num_hashes, dtype=np.uint64)
        return cls(multipliers, increments)

    @property
    def num_hashes(self) -> int:
        return len(self.multipliers)


def signatures(shingle_hashes: np.ndarray, offsets: np.ndarray, family: HashFamily) -> np.ndarray:
    """MinHash signatures (documents × k, uint32) of documents given as concatenated shingle hashes + offsets.

    A document without shingles gets the sentinel row. Work proceeds in blocks
    of shingles so scratch memory stays fixed however long a document is.
    """
    num_docs = len(offsets) - 1
    result = np.full((num_docs, family.num_hashes), SIGNATURE_SENTINEL, dtype=np.uint32)
    total = int(offsets[-1])
    doc_starts = offsets[:-1]
    multipliers = family.multipliers[:, None]
    increments = family.increments[:, None]
    shift = np.uint64(32)
    # hashes × shingles layout: reducing along the contiguous axis is ~5x faster than along rows.
    scratch = np.empty((family.num_hashes, min(total, BLOCK_SHINGLES)), dtype=np.uint64)
    for block_start in range(0, total, BLOCK_SHINGLES):
        block_end = min(total, block_start + BLOCK_SHINGLES)
        values = scratch[:, : block_end - block_start]
        np.multiply(multipliers, shingle_hashes[None, block_start:block_end], out=values)
        values += increments  # the hash is the high 32 bits; shifted after the minimum (a shift keeps order)
        # Documents overlapping this block, and where each one's shingles begin inside it.
        first_doc = int(np.searchsorted(doc_starts, block_start, side="right")) - 1
        last_doc = int(np.searchsorted(doc_starts, block_end, side="left"))
        docs = np.arange(first_doc, last_doc)
        starts = np.clip(offsets[docs], block_start, block_end) - block_start
        ends = np.clip(offsets[docs + 1], block_start, block_end) - block_start
        present = ends > starts
        docs, starts = docs[present], starts[present]
        if not len(docs):
            continue
        block_minima = (np.minimum.reduceat(values, starts, axis=1) >> shift).T.astype(np.uint32)
        result[docs] = np.minimum(result[docs], block_minima)
    return result


def band_keys(signature_rows: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """One 64-bit key per (band, document): bands × documents, uint64. Equal band rows ⇒ equal key."""
    num_docs = signature_rows.shape[0]
    keys = np.empty((bands, num_docs), dtype=np.uint64)
    for band in range(bands):
        key = np.full(num_docs, band + 1, dtype=np.uint64)
        for column in range(band * rows, (band + 1) * rows):
            key *= COMBINE
            key += signature_rows[:, column].astype(np.uint64)
        keys[band] = mix64(key)
    return keys


def candidate_probability(similarity: float | np.ndarray, bands: int, rows: int) -> float | np.ndarray:
    """P(candidate) = 1 − (1 − s^r)^b: the chance that some band agrees entirely."""
    return 1.0 - (1.0 - np.asarray(similarity, dtype=float) ** rows) ** bands


def approximate_threshold(bands: int, rows: int) -> float:
    """(1/b)^(1/r): near the steepest point of the S-curve."""
    return (1.0 / bands) ** (1.0 / rows)


def feasible_band_layouts(max_hashes: int, catch: float, min_catch_probability: float, reject: float,
                          max_reject_probability: float) -> list[tuple[int, int, float, float]]:
    """Every (bands, rows) with bands·rows ≤ max_hashes that catches `catch` and rejects `reject` as asked.

    Returned as (bands, rows, P(catch), P(reject)), fewest hashes first.
    """
    layouts = []
    for rows in range(1, max_hashes + 1):
        for bands in range(1, max_hashes // rows + 1):
            p_catch = float(candidate_probability(catch, bands, rows))
            p_reject = float(candidate_probability(reject, bands, rows))
            if p_catch >= min_catch_probability and p_reject <= max_reject_probability:
                layouts.append((bands, rows, p_catch, p_reject))
    return sorted(layouts, key=lambda item: (item[0] * item[1], item[3], item[0]))


class UnionFind:
    """Disjoint sets over 0..n-1 whose root is always the smallest member (the keeper).

    Parents live in an `array` of machine integers (4 bytes a member below 2^31
    members) rather than a list of Python ints (~36 bytes), at list-like speed.
    """

    def __init__(self, size: int):
        self.parent = array("i" if size < 2**31 else "q", range(size))

    def find(self, item: int) -> int:
        parent = self.parent
        while parent[item] != item:
            parent[item] = parent[parent[item]]  # path halving keeps chains short
            item = parent[item]
        return item

    def union(self, a: int, b: int) -> bool:
        root_a, root_b = self.find(a), self.find(b)
        if root_a == root_b:
            return False
        if root_a < root_b:
            self.parent[root_b] = root_a
        else:
            self.parent[root_a] = root_b
        return True

    def roots(self) -> np.ndarray:
        return np.fromiter((self.find(i) for i in range(len(self.parent))), dtype=np.int64, count=len(self.parent))


# ---------------------------------------------------------------- checksummed spill files

def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def write_checked_array(path: Path, array: np.ndarray) -> str:
    """Write an .npy file and a sidecar with its sha256; returns the digest (also handed to the reader)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        np.save(handle, np.ascontiguousarray(array), allow_pickle=False)
    digest = sha256_of(tmp)
    tmp.replace(path)
    _sidecar(path).write_text(json.dumps({"sha256": digest, "shape": list(array.shape), "dtype": str(array.dtype)}))
    return digest


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def check_intermediate(path: Path | str, expected_sha256: str) -> Path:
    """Raise ChecksumMismatch unless the file a task wrote for another still has the sha256 its writer recorded."""
    path = Path(path)
    if not path.is_file():
        raise ChecksumMismatch(f"{path}: intermediate file is missing")
    actual = sha256_of(path)
    if actual != expected_sha256:
        raise ChecksumMismatch(f"{path}: sha256 {actual[:12]}… but its writer recorded {expected_sha256[:12]}…; "
                               "the intermediate file is corrupt, nothing was published")
    return path


def read_checked_array(path: Path, expected_sha256: str, mmap: bool = True) -> np.ndarray:
    """Read a spill file only after its bytes match the digest its writer recorded."""
    return np.load(check_intermediate(path, expected_sha256), mmap_mode="r" if mmap else None, allow_pickle=False)
