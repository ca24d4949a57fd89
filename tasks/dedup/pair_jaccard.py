"""Exact Jaccard of every pair in a group of shingle sets, by counting shared shingles in bulk.

A templated site's pages share a boilerplate block, so a large LSH bucket is
thousands of documents whose pairwise Jaccards cluster around 0.6–0.75:
checking them one pair at a time is millions of set intersections. Instead:
|A ∩ B| = shared common shingles + shared rare shingles, where a shingle is
common if at least `dense_from` members hold it. Common shingles (the
boilerplate) become a members × common 0/1 matrix whose product with its
transpose counts them for all pairs at once; each rare shingle adds one to
each pair of its (fewer than `dense_from`) holders, counted with np.unique.
The result is exact: the same numbers as jaccard_of_sets, pair by pair.

Cost: members² × common columns multiply-adds (blocked to `block_rows` rows)
plus Σ holders² over rare shingles; `dense_columns_limit` refuses groups whose
common part would not fit in memory, and the caller checks pairs otherwise.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

DENSE_FROM = 16  # a shingle held by this many members is counted by matrix product
DENSE_BYTES_LIMIT = 256 << 20  # members × common columns × 4 bytes above this: refuse (None)
BLOCK_CELLS = 4 << 20  # pairs examined per block (rows × members): bounds scratch and each block's result


def pairs_at_least(sets: list[np.ndarray], threshold: float, dense_from: int = DENSE_FROM,
                   dense_bytes_limit: int = DENSE_BYTES_LIMIT, block_rows: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(i, j, Jaccard) of every pair i < j with exact Jaccard ≥ threshold, ordered by (i, j); None if too dense.

    `sets` are sorted unique uint64 arrays, none empty.
    """
    blocks = pair_blocks(sets, threshold, dense_from, dense_bytes_limit, block_rows)
    if blocks is None:
        return None
    firsts, seconds, similarities = zip(*blocks) if sets else ((), (), ())
    if not firsts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64)
    return np.concatenate(firsts), np.concatenate(seconds), np.concatenate(similarities)


def pair_blocks(sets: list[np.ndarray], threshold: float, dense_from: int = DENSE_FROM, dense_bytes_limit: int = DENSE_BYTES_LIMIT,
                block_rows: int | None = None) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]] | None:
    """pairs_at_least a block of first members at a time (a dense bucket can hold millions of pairs); None if too dense."""
    count = len(sets)
    sizes = np.fromiter((len(s) for s in sets), dtype=np.int64, count=count)
    values = np.concatenate(sets)
    holder = np.repeat(np.arange(count, dtype=np.int64), sizes)
    # Only shingles held by two or more members can be shared; a sort (not np.unique's argsort) finds them.
    ordered = np.sort(values)
    run_starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1]))) if len(ordered) else np.zeros(0, np.int64)
    run_lengths = np.diff(np.append(run_starts, len(ordered)))
    shared_values, holders = ordered[run_starts[run_lengths >= 2]], run_lengths[run_lengths >= 2]
    position = np.minimum(np.searchsorted(shared_values, values), max(len(shared_values) - 1, 0))
    is_shared = shared_values[position] == values if len(shared_values) else np.zeros(len(values), dtype=bool)
    column, holder = position[is_shared], holder[is_shared]
    held_by = holders[column]
    dense = held_by >= dense_from
    dense_index = np.cumsum(holders >= dense_from) - 1  # column -> its position among the dense columns
    dense_count = int(np.count_nonzero(holders >= dense_from))
    if count * dense_count * 4 > dense_bytes_limit:
        return None
    # float32 sums of 0/1 are exact below 2^24 terms (always, at the default limits); wider rows sum in float64
    matrix_MC = np.zeros((count, dense_count), dtype=np.float32 if dense_count < 1 << 24 else np.float64)
    matrix_MC[holder[dense], dense_index[column[dense]]] = 1.0
    codes, rare_shared = rare_pair_counts(holder, column, ~dense, count)
    block_rows = block_rows or max(1, BLOCK_CELLS // max(count, 1))
    return _blocks(matrix_MC, codes, rare_shared, sizes, threshold, block_rows)


def _blocks(matrix_MC: np.ndarray, codes: np.ndarray, rare_shared: np.ndarray, sizes: np.ndarray, threshold: float,
            block_rows: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    count = len(sizes)
    sizes_M = sizes.astype(np.float64)
    for start in range(0, count, block_rows):
        stop = min(count, start + block_rows)
        # Counts of shared common shingles are exact (see matrix_MC); in float64 the rare counts add exactly too.
        shared_BM = (matrix_MC[start:stop] @ matrix_MC.T).astype(np.float64)
        lo, hi = np.searchsorted(codes, [start * count, stop * count])
        shared_BM[codes[lo:hi] // count - start, codes[lo:hi] % count] += rare_shared[lo:hi]
        # The test is the exact quotient itself, computed as the float64 division of two exact whole numbers that
        # jaccard_of_sets performs: no slack, so no pair at or above the threshold can be dropped here.
        with np.errstate(invalid="ignore", divide="ignore"):
            similarity_BM = shared_BM / (sizes_M[start:stop, None] + sizes_M[None, :] - shared_BM)
        rows, columns = np.nonzero(np.triu((similarity_BM >= threshold) & (shared_BM > 0), k=start + 1))
        yield (rows + start).astype(np.int64), columns.astype(np.int64), similarity_BM[rows, columns]


def rare_pair_counts(holder: np.ndarray, column: np.ndarray, rare: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(i · count + j, shared rare shingles) for every pair i < j holding a rare shingle together; codes ascending."""
    order = np.lexsort((holder[rare], column[rare]))
    holders, columns = holder[rare][order], column[rare][order]
    starts = np.flatnonzero(np.concatenate(([True], columns[1:] != columns[:-1]))) if len(columns) else np.zeros(0, np.int64)
    group_sizes = np.diff(np.append(starts, len(columns)))
    codes = [np.zeros(0, np.int64)]
    for size in np.unique(group_sizes).tolist():
        members = holders[starts[group_sizes == size][:, None] + np.arange(size)]  # holders ascending within a column
        first, second = np.triu_indices(size, k=1)
        codes.append((members[:, first] * count + members[:, second]).ravel())
    return np.unique(np.concatenate(codes), return_counts=True)
