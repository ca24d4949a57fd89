"""Which pairs of an LSH bucket deserve an exact-Jaccard check: all pairs, filtered by signature agreement.

Seed 001, "推导 MinHash": each of the k MinHash values of two documents agrees
with probability J (their Jaccard), independently across hash functions, so
the number of agreeing values is Binomial(k, J) and agreement / k estimates J
with standard deviation sqrt(J(1 − J) / k) (0.038 at J = 0.8, k = 112).

Every pair of a bucket is looked at (a bucket is where the boilerplate of a
templated site puts thousands of pages, and a true near-copy may sit anywhere
in it); only pairs whose agreement reaches `minimum_agreement` go on to exact
verification. The margin below the threshold is not a guess: it is the
binomial quantile at the threshold itself, so a pair with J ≥ threshold falls
below it with probability ≤ `miss_probability` (1e-6 by default: 68 of 112
hashes at J = 0.8, an estimate of 0.607, i.e. a margin of 0.193 ≈ 5 σ). A
pair with higher J is missed even less often.

Agreement is counted on 8-bit fingerprints of the signature values (112
bytes a document): two different values share a fingerprint with probability
1/256, which can only raise a count, so the filter stays on the safe side
(a few more exact checks, never a missed pair).
"""
from __future__ import annotations

import math

import numpy as np

PAIR_BLOCK_BYTES = 16 << 20  # scratch of one block of the all-pairs comparison (rows × members × k booleans)


def minimum_agreement(num_hashes: int, threshold: float, miss_probability: float) -> int:
    """Largest count a with P[Binomial(num_hashes, threshold) < a] ≤ miss_probability."""
    below = 0.0
    for agreeing in range(num_hashes + 1):
        below_next = below + math.comb(num_hashes, agreeing) * threshold**agreeing * (1 - threshold) ** (num_hashes - agreeing)
        if below_next > miss_probability:
            return agreeing
        below = below_next
    return num_hashes


def fingerprints(signature_rows: np.ndarray) -> np.ndarray:
    """The low byte of every signature value: documents × k, uint8."""
    return (signature_rows & 0xFF).astype(np.uint8)


def agreeing_pairs(fingerprints_MK: np.ndarray, minimum: int, limit: int | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """All pairs (i < j) of M members whose fingerprints agree in at least `minimum` of K positions.

    Returned as two index arrays ordered by (i, j). Rows are compared in blocks
    so scratch memory stays near PAIR_BLOCK_BYTES whatever the bucket size;
    the work is M²/2 · K byte comparisons (0.5 s for 2,000 members on this 2-core machine under load).
    `limit`: None as soon as more pairs than that agree, so what a dense bucket yields stays bounded.
    """
    members, width = fingerprints_MK.shape
    if members == 2:  # most buckets: no block machinery
        if np.count_nonzero(fingerprints_MK[0] == fingerprints_MK[1]) >= minimum:
            return np.zeros(1, np.int64), np.ones(1, np.int64)
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    firsts, seconds, found = [], [], 0
    block = max(1, PAIR_BLOCK_BYTES // max(1, members * width))
    for start in range(0, members - 1, block):
        stop = min(members - 1, start + block)
        agree_BM = np.count_nonzero(fingerprints_MK[start:stop, None, :] == fingerprints_MK[None, start:, :], axis=2)
        # column c is member start + c; keep only c > row (i < j)
        rows, columns = np.nonzero(agree_BM >= minimum)
        later = columns > rows
        firsts.append(rows[later] + start)
        seconds.append(columns[later] + start)
        found += len(firsts[-1])
        if limit is not None and found > limit:
            return None
    if not firsts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(firsts).astype(np.int64), np.concatenate(seconds).astype(np.int64)
