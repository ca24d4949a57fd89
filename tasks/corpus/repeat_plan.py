"""Each training document's mixture repeats, decided by runner tasks: no process holds a group's documents.

A (source, language) group used e times gives every document ⌊e⌋ repeats and
one more to a seeded prefix of the group: documents in (seeded rank, position)
order, each taking one more while the tokens already given one stay below
(e − ⌊e⌋) × U (tasks/corpus/mixture.py). Finding where that prefix ends is a
selection over the whole group, done in four runner maps:
1. per shard (the tokenising task): each document's rank; its counts sorted by
   (group, rank, row) into blocks of COUNT_BLOCK_ROWS; a histogram of tokens
   per group and rank bin (RANK_BINS bins of the rank's top bits);
2. per group: the shards' histograms added up: the bin where the prefix ends
   and the tokens of the bins before it;
3. per group: the rows of that one bin, read from the blocks that hold them,
   sorted: the last (rank, shard, row) of the prefix;
4. per shard: repeats from the cut-offs, its plan part (in row order, offsets
   into the joined token file) and its contributed tokens per group.

Memory bound: the planning process holds O(shards × groups) aggregates and
O(documents / COUNT_BLOCK_ROWS) block records (~150 bytes each: ~10 MB at a
billion documents); a shard task one shard's counts; a group task RANK_BINS
counters per shard of the group, or one bin's rows (a group's rows / RANK_BINS).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from manifests.atomic import atomic_write_parquet
from manifests.digest import sha256_file
from tasks.corpus.split import seeded_rank
from tasks.dedup.minhash import write_checked_array
from tasks.dedup.near_dup_files import Slice
from tasks.dedup.spill_reader import SpillFiles
from tasks.dedup.table_slices import read_table_slices, write_table_slices

RANK_BINS = 1 << 12
BIN_SHIFT = np.uint64(64 - 12)
COUNT_BLOCK_ROWS = 1 << 14
COUNT_SCHEMA = pa.schema([("id", pa.string()), ("source", pa.string()), ("lang", pa.string()), ("tokens", pa.int64())])
RANKED_SCHEMA = COUNT_SCHEMA.append(pa.field("rank", pa.uint64())).append(pa.field("row", pa.int64()))
Group = tuple[str, str]  # (source, lang)


@dataclass(frozen=True)
class CountBlock:
    """Consecutive counts of one shard in (group, rank, row) order: its slice and the keys it spans."""

    slice: Slice
    shard_index: int
    first: tuple[str, str, int]  # (source, lang, rank) of its first row
    last: tuple[str, str, int]


@dataclass(frozen=True)
class RankedShard:
    """What step 1 returns for one shard: per-group documents and tokens, its histogram file and its blocks."""

    shard: str
    rows: int
    tokens: int
    groups: dict[Group, tuple[int, int]]  # group -> (documents, tokens)
    first_seen: tuple[tuple[str, ...], tuple[str, ...]]  # sources, languages in order of first appearance (row order)
    histogram: tuple[str, str]  # (.npy path, sha256): tokens per (group in `groups` order, rank bin)
    blocks: tuple[CountBlock, ...]


@dataclass(frozen=True)
class GroupCut:
    """Where one group's documents stand: ⌊e⌋ repeats each, one more up to (bin, key) in (rank, shard, row) order."""

    full: int
    bin: int = -1  # -1: no document gets one more
    last: tuple[int, int, int] = (0, 0, 0)  # the prefix's last (rank, shard index, row)


def document_ranks(ids: list[str], seed: int) -> np.ndarray:
    """Each id's `seeded_rank` as an unsigned 64-bit integer: the same order as its fixed-width hex string."""
    return np.fromiter((int(seeded_rank(seed, doc_id), 16) for doc_id in ids), dtype=np.uint64, count=len(ids))


def rank_counts(counts: pa.Table, shard: str, shard_index: int, seed: int, spill_dir: str) -> RankedShard:
    """Step 1 for one shard's counts (id, source, lang, tokens, in row order): blocks, histogram, aggregates."""
    rows = counts.num_rows
    first_seen = (tuple(pc.unique(counts.column("source")).to_pylist()), tuple(pc.unique(counts.column("lang")).to_pylist()))
    ranked = counts.append_column("rank", pa.array(document_ranks(counts.column("id").to_pylist(), seed), pa.uint64()))
    ranked = ranked.append_column("row", pa.array(np.arange(rows, dtype=np.int64)))
    ranked = ranked.sort_by([("source", "ascending"), ("lang", "ascending"), ("rank", "ascending"), ("row", "ascending")])
    sources, langs = ranked.column("source"), ranked.column("lang")
    ranks, tokens = ranked.column("rank").to_numpy(), ranked.column("tokens").to_numpy()
    bounds = group_bounds(ranked)
    histogram = np.zeros((len(bounds) - 1, RANK_BINS), dtype=np.int64)
    groups: dict[Group, tuple[int, int]] = {}
    for index, (start, stop) in enumerate(zip(bounds, bounds[1:])):
        histogram[index] = np.bincount((ranks[start:stop] >> BIN_SHIFT).astype(np.int64), weights=tokens[start:stop], minlength=RANK_BINS)
        groups[(sources[start].as_py(), langs[start].as_py())] = (stop - start, int(tokens[start:stop].sum()))
    spill = Path(spill_dir)
    hist_path = spill / f"{shard}.histogram.npy"
    hist_sha = write_checked_array(hist_path, histogram)
    tables = [ranked.slice(start, COUNT_BLOCK_ROWS) for start in range(0, rows, COUNT_BLOCK_ROWS)]
    slices = write_table_slices(spill / f"{shard}.counts.npy", tables)
    blocks = tuple(CountBlock(part, shard_index, key_of(table, 0), key_of(table, table.num_rows - 1)) for part, table in zip(slices, tables))
    return RankedShard(shard, rows, int(tokens.sum()), groups, first_seen, (str(hist_path), hist_sha), blocks)


def group_bounds(ranked: pa.Table) -> list[int]:
    """Row bounds of each (source, lang) run of a table sorted by group: [0, ..., rows]."""
    rows = ranked.num_rows
    if not rows:
        return [0]
    source, lang = (pc.dictionary_encode(ranked.column(name)).combine_chunks().indices.to_numpy() for name in ("source", "lang"))
    changed = (source[1:] != source[:-1]) | (lang[1:] != lang[:-1])
    return [0, *(np.flatnonzero(changed) + 1).tolist(), rows]


def key_of(table: pa.Table, row: int) -> tuple[str, str, int]:
    return table.column("source")[row].as_py(), table.column("lang")[row].as_py(), int(table.column("rank")[row].as_py())


def prefix_budget(unique: int, target: float, max_epochs: float) -> tuple[float, int, float]:
    """(epochs, ⌊epochs⌋, tokens the one-more prefix may start below) of a group with `unique` tokens."""
    epochs = min(target / unique, max_epochs) if unique else 0.0
    full = math.floor(epochs)
    return epochs, full, (epochs - full) * unique


def cut_bin(histograms: list[tuple[str, str, int]], budget: float) -> tuple[int, int]:
    """Step 2, one group: (the last bin holding a document of the prefix, tokens of the bins before it)."""
    spill = SpillFiles()
    total = np.zeros(RANK_BINS, dtype=np.int64)
    try:
        for path, sha256, row in histograms:
            spill.verify(path, sha256)
            total += np.load(path, mmap_mode="r", allow_pickle=False)[row]
    finally:
        spill.close()
    before = np.cumsum(total) - total
    qualifying = np.flatnonzero((total > 0) & (before < budget))
    last = int(qualifying[-1])
    return last, int(before[last])


def blocks_in_bin(blocks_by_shard: list[tuple[CountBlock, ...]], group: Group, bin_index: int) -> list[CountBlock]:
    """The blocks whose (source, lang, rank) span reaches into one group's rank bin."""
    shift = int(BIN_SHIFT)
    low, high = (*group, bin_index << shift), (*group, ((bin_index + 1) << shift) - 1)
    return [block for blocks in blocks_by_shard for block in blocks if block.first <= high and block.last >= low]


def cut_in_bin(group: Group, bin_index: int, tokens_before: int, budget: float, blocks: list[CountBlock]) -> tuple[int, int, int]:
    """Step 3, one group: the last (rank, shard index, row) of the prefix, from the rows of its cut bin."""
    spill = SpillFiles()
    parts = []
    try:
        for block in blocks:
            table = read_table_slices(spill, [block.slice], RANKED_SCHEMA)
            in_group = pc.and_(pc.equal(table.column("source"), group[0]), pc.equal(table.column("lang"), group[1])).to_numpy(zero_copy_only=False)
            table = table.filter(pa.array(in_group & ((table.column("rank").to_numpy() >> BIN_SHIFT) == bin_index)))
            parts.append((table.column("rank").to_numpy(), np.full(table.num_rows, block.shard_index, np.int64),
                          table.column("row").to_numpy(), table.column("tokens").to_numpy()))
    finally:
        spill.close()
    rank, shard, row, tokens = (np.concatenate(column) for column in zip(*parts))
    order = np.lexsort((row, shard, rank))
    taken_before = tokens_before + np.cumsum(tokens[order]) - tokens[order]
    last = order[int(np.flatnonzero(taken_before < budget)[-1])]
    return int(rank[last]), int(shard[last]), int(row[last])


def shard_plan(shard: RankedShard, shard_index: int, cuts: dict[Group, GroupCut], offset: int, path: str) -> tuple[str, int, dict[Group, int], str]:
    """Step 4, one shard: its plan part (counts + repeats + offset, in row order), contributed tokens per group, and the
    part's sha256 (hashed here, so the stage's manifest need not read it again on the flow host)."""
    spill = SpillFiles()
    try:
        ranked = read_table_slices(spill, [block.slice for block in shard.blocks], RANKED_SCHEMA)
    finally:
        spill.close()
    ranks, rows, tokens = ranked.column("rank").to_numpy(), ranked.column("row").to_numpy(), ranked.column("tokens").to_numpy()
    repeats = np.zeros(ranked.num_rows, dtype=np.int32)  # in the blocks' (group, rank, row) order
    contributed: dict[Group, int] = {}
    bounds = group_bounds(ranked)
    for start, stop in zip(bounds, bounds[1:]):
        group = (ranked.column("source")[start].as_py(), ranked.column("lang")[start].as_py())
        cut = cuts[group]
        extra = np.zeros(stop - start, dtype=bool)
        if cut.bin >= 0:  # (rank, shard, row) <= the prefix's last, this shard's index fixed
            last_rank, last_shard, last_row = cut.last
            rank, row = ranks[start:stop], rows[start:stop]
            ties = (row <= last_row) if shard_index == last_shard else np.full(stop - start, shard_index < last_shard)
            extra = (rank < np.uint64(last_rank)) | ((rank == np.uint64(last_rank)) & ties)
        repeats[start:stop] = cut.full + extra.astype(np.int32)
        contributed[group] = int(repeats[start:stop].astype(np.int64) @ tokens[start:stop])
    order = np.argsort(rows, kind="stable")
    ranked, repeats, tokens = ranked.take(pa.array(order)), repeats[order], tokens[order]
    plan = ranked.select(COUNT_SCHEMA.names).append_column("repeats", pa.array(repeats, pa.int32()))
    plan = plan.append_column("offset", pa.array(offset + np.cumsum(tokens) - tokens, pa.int64()))
    atomic_write_parquet(Path(path), plan)
    return path, plan.num_rows, contributed, sha256_file(Path(path))
