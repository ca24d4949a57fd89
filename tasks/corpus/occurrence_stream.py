"""The token stream's occurrence order and its cut into shards, as an external sort run by runner tasks.

The stream is every document occurrence (a document and its k-th mixture
repeat) in epoch-major seeded order: all first occurrences ordered by
`seeded_rank(seed, id + NUL + k)`, then all second ones, and so on (ties,
which a 64-bit hash makes all but impossible, by plan row). Shards are cut
every `tokens_per_shard` tokens, a document crossing a bound getting a piece
in each.

How it runs, so that no process holds a per-document array:
1. one task per plan part (the mixture writes one per split shard) ranks its
   occurrences and spills them by (epoch, rank range) — the map side;
2. one task per (epoch, rank range) sorts its occurrences and writes them in
   blocks of BLOCK_ROWS rows, returning each block's tokens — the reduce side;
3. the planning process only adds up block tokens (a few dozen bytes a block)
   and hands each shard task the blocks its token range overlaps;
4. one task per output shard reads those blocks, finds its rows, and writes
   its .bin (its pieces sliced out of the memory-mapped token file) and .idx.parquet.

Memory bound: the planning process holds O(parts × ranges + blocks) small
records (about 60 bytes per block of BLOCK_ROWS occurrences, so ~3 MB at a
billion occurrences); a rank task one part, a sort task one range (about
PARTITION_BYTES of records), a shard task a few blocks and its own shard.
The files are the bytes one in-memory sort and one sequential cut give.
"""
from __future__ import annotations

import bisect
import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from manifests.atomic import atomic_write_bytes, atomic_write_parquet
from manifests.digest import sha256_file
from tasks.corpus.split import seeded_rank
from tasks.dedup.near_dup_files import Slice, key_partition
from tasks.dedup.spill_reader import SpillFiles
from tasks.dedup.table_slices import read_table_slices, write_table_slices
from tasks.runner.stage_runner import map_shards, partition_count

BLOCK_ROWS = 1 << 14  # sorted occurrences per block: what a shard task reads to find its rows
RECORD_BYTES = 64  # an occurrence record (id, start, length, repeat, rank, row), for sizing the ranges
OCCURRENCE_SCHEMA = pa.schema([("id", pa.string()), ("start", pa.int64()), ("length", pa.int64()), ("repeat", pa.int32()),
                               ("rank", pa.uint64()), ("row", pa.int64())])
INDEX_SCHEMA = pa.schema([
    ("doc_id", pa.string()),
    ("offset", pa.int64()),  # first token of this piece inside the shard
    ("length", pa.int64()),  # tokens of this piece, the closing EOS included when it ends the document
    ("doc_start", pa.int64()),  # position of the piece's first token inside the document's token sequence
    ("repeat", pa.int32()),  # 0 for a document's first occurrence, k for its k-th mixture repeat
])


@dataclass(frozen=True)
class Block:
    """BLOCK_ROWS (or fewer) consecutive occurrences of the stream: its spill slice, tokens and rows."""

    slice: Slice
    tokens: int
    rows: int


@dataclass(frozen=True)
class ShardLayout:
    """One output shard: tokens [low, high) of the stream, and the blocks (with the stream position each begins at) holding them."""

    name: str
    blocks: tuple[tuple[Block, int], ...]
    low: int
    high: int

    @property
    def tokens(self) -> int:
        return self.high - self.low


def occurrence_ranks(ids: list[str], repeats: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(document index, repeat k, seeded rank) of every occurrence of these documents, document-major."""
    doc = np.repeat(np.arange(len(ids), dtype=np.int64), repeats)
    k = np.arange(len(doc), dtype=np.int64) - np.repeat(np.cumsum(repeats) - repeats, repeats)
    rank = np.fromiter((int(seeded_rank(seed, f"{ids[d]}\x00{r}"), 16) for d, r in zip(doc.tolist(), k.tolist())), dtype=np.uint64, count=len(doc))
    return doc, k, rank


def rank_part(plan_path: str, first: int, seed: int, ranges: int, spill_path: str) -> tuple[int, dict[int, Slice]]:
    """Task: the occurrences of one plan part (its rows numbered from `first`), spilled by key = epoch × ranges + rank
    range: (first, key -> slice)."""
    plan = pq.read_table(plan_path, columns=["id", "offset", "tokens", "repeats"])
    ids = plan.column("id").to_pylist()
    doc, k, rank = occurrence_ranks(ids, plan.column("repeats").to_numpy().astype(np.int64), seed)
    key = k * ranges + key_partition(rank, ranges)  # a 64-bit hash's top bits: range order is rank order
    order = np.lexsort((doc, key))
    doc, k, rank, key = doc[order], k[order], rank[order], key[order]
    records = pa.table({"id": pa.array(ids, pa.string()).take(pa.array(doc, pa.int64())),
                        "start": plan.column("offset").to_numpy()[doc].astype(np.int64), "length": plan.column("tokens").to_numpy()[doc].astype(np.int64),
                        "repeat": k.astype(np.int32), "rank": rank, "row": doc + first}, schema=OCCURRENCE_SCHEMA)
    keys, starts = np.unique(key, return_index=True)
    bounds = [*starts.tolist(), len(key)]
    slices = write_table_slices(Path(spill_path), [records.slice(a, b - a) for a, b in zip(bounds, bounds[1:])])
    return first, dict(zip(keys.tolist(), slices))


def write_blocks(path: Path, occurrences: pa.Table) -> list[Block]:
    """Occurrences already in stream order, written as blocks of BLOCK_ROWS rows into one checked file."""
    tables = [occurrences.slice(start, BLOCK_ROWS) for start in range(0, occurrences.num_rows, BLOCK_ROWS)]
    slices = write_table_slices(path, tables)
    return [Block(part, int(pc.sum(table.column("length")).as_py() or 0), table.num_rows) for part, table in zip(slices, tables)]


def sort_range(key: int, slices: list[Slice], spill_path: str) -> tuple[int, list[Block]]:
    """Task: one (epoch, rank range)'s occurrences in stream order (rank, then plan row), as blocks."""
    spill = SpillFiles()
    try:
        occurrences = read_table_slices(spill, slices, OCCURRENCE_SCHEMA)
    finally:
        spill.close()
    order = np.lexsort((occurrences.column("row").to_numpy(), occurrences.column("rank").to_numpy()))
    return key, write_blocks(Path(spill_path), occurrences.take(pa.array(order)))


def cut_shards(blocks: list[Block], tokens_per_shard: int, prefix: str) -> list[ShardLayout]:
    """Cut the stream every `tokens_per_shard` tokens (the last shard shorter); each shard names the blocks it overlaps."""
    ends = np.cumsum([block.tokens for block in blocks]).tolist()
    begins = [end - block.tokens for end, block in zip(ends, blocks)]
    total = ends[-1] if ends else 0
    layouts = []
    for index, low in enumerate(range(0, total, tokens_per_shard)):
        high = min(low + tokens_per_shard, total)
        first, last = bisect.bisect_right(ends, low), bisect.bisect_left(begins, high)
        layouts.append(ShardLayout(f"{prefix}-{index:05d}", tuple((blocks[b], begins[b]) for b in range(first, last)), low, high))
    return layouts


def shard_pieces(rows: pa.Table, first_begin: int, low: int, high: int) -> tuple[pa.Table, np.ndarray]:
    """The index rows of the stream's tokens [low, high) over `rows` (occurrences in stream order, the first beginning at
    stream position `first_begin`), and each piece's start in the token file.

    Only the first piece can start inside its document and only the last can stop short of its end: every
    occurrence between them lies whole inside the range, so no per-piece loop is needed."""
    lengths = rows.column("length").to_numpy()
    ends = first_begin + np.cumsum(lengths)
    begins = ends - lengths
    first, last = int(np.searchsorted(ends, low, side="right")), int(np.searchsorted(begins, high, side="left"))
    done = np.zeros(last - first, dtype=np.int64)
    if last > first:
        done[0] = low - int(begins[first])
    offsets = np.maximum(begins[first:last] - low, 0)
    pieces = np.minimum(lengths[first:last] - done, (high - low) - offsets)
    starts = rows.column("start").to_numpy()[first:last] + done
    index = pa.table([rows.column("id").slice(first, last - first), pa.array(offsets, pa.int64()), pa.array(pieces, pa.int64()),
                      pa.array(done, pa.int64()), rows.column("repeat").slice(first, last - first)], schema=INDEX_SCHEMA)
    return index.combine_chunks(), starts


def write_shard(layout: ShardLayout, tokens_path: str, dtype_name: str, out_dir: str) -> dict[str, Any]:
    """Task: one shard's .bin (its pieces copied out of the memory-mapped token file) and .idx.parquet (one row per piece)."""
    dtype = np.dtype(dtype_name)
    spill = SpillFiles()
    try:
        rows = read_table_slices(spill, [block.slice for block, _ in layout.blocks], OCCURRENCE_SCHEMA)
    finally:
        spill.close()
    index, starts = shard_pieces(rows, layout.blocks[0][1] if layout.blocks else 0, layout.low, layout.high)
    offsets, pieces = index.column("offset").to_numpy(), index.column("length").to_numpy()
    fill = int(pieces.sum())
    if fill != layout.tokens:
        raise ValueError(f"{tokens_path}: shard {layout.name} got {fill} tokens where {layout.tokens} were planned; nothing was published")
    buffer = np.empty(layout.tokens, dtype=dtype)
    if fill:
        tokens = np.memmap(tokens_path, dtype=dtype, mode="r").view(np.ndarray)  # plain slices: a memmap slice costs ~5 us
        if int((starts + pieces).max()) > len(tokens):
            raise ValueError(f"{tokens_path}: {len(tokens)} tokens, shard {layout.name} reads up to {int((starts + pieces).max())}; "
                             "nothing was published")
        for at, start, piece in zip(offsets.tolist(), starts.tolist(), pieces.tolist()):
            buffer[at:at + piece] = tokens[start:start + piece]
        del tokens
    bin_path, idx_path = Path(out_dir) / f"{layout.name}.bin", Path(out_dir) / f"{layout.name}.idx.parquet"
    data = buffer.tobytes()
    atomic_write_bytes(bin_path, data)
    atomic_write_parquet(idx_path, index)
    # hashed here, once, from the bytes just written: the stage's manifest takes these digests as they are
    return {"name": layout.name, "tokens": fill, "documents": index.num_rows, "sha256": hashlib.sha256(data).hexdigest(),
            "index_sha256": sha256_file(idx_path)}


def stream_blocks(plan_parts: list[Path], seed: int, spill_dir: Path, workers: int) -> list[Block]:
    """Steps 1-2: the plan's occurrences sorted into stream order, as blocks (only their slices and counts come back)."""
    sizes = [pq.ParquetFile(part).metadata.num_rows for part in plan_parts]
    firsts = np.cumsum([0, *sizes]).tolist()
    ranges = partition_count(workers, firsts[-1] * RECORD_BYTES)  # an epoch holds at most one occurrence of each plan row
    jobs = [(str(part), first, seed, ranges, str(spill_dir / f"ranked-{index:06d}.npy")) for index, (part, first) in enumerate(zip(plan_parts, firsts))]
    by_key: dict[int, list[tuple[int, Slice]]] = {}
    for first, slices in map_shards(rank_part, jobs, workers, "shards: ranking", sizes):
        for key, part in slices.items():
            by_key.setdefault(key, []).append((first, part))
    jobs = [(key, [part for _, part in sorted(by_key[key], key=lambda item: item[0])], str(spill_dir / f"sorted-{key:08d}.npy"))
            for key in sorted(by_key)]
    sorted_ranges = dict(map_shards(sort_range, jobs, workers, "shards: sorting", [sum(p.stop - p.start for p in job[1]) for job in jobs]))
    return [block for key in sorted(sorted_ranges) for block in sorted_ranges[key]]


def lay_out_stream(plan_parts: list[Path], tokens_path: Path, dtype: np.dtype, tokens_per_shard: int, seed: int, out_dir: Path, prefix: str,
                   spill_dir: Path, workers: int = 1) -> list[dict[str, Any]]:
    """One side's shards from its plan parts (id, offset, tokens, repeats; offsets into one token file); their listing, in order."""
    spill_dir.mkdir(parents=True, exist_ok=True)
    try:
        layouts = cut_shards(stream_blocks(plan_parts, seed, spill_dir, workers), tokens_per_shard, prefix)
        jobs = [(layout, str(tokens_path), dtype.str, str(out_dir)) for layout in layouts]
        return sorted(map_shards(write_shard, jobs, workers, f"shards: {prefix}", [layout.tokens for layout in layouts]), key=lambda s: s["name"])
    finally:
        shutil.rmtree(spill_dir, ignore_errors=True)
