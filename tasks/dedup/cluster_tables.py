"""The near-duplicate pass's outputs from its components, by id range: removal rows by shard and clusters.parquet.

What a removed document's row needs lives in three id ranges: its own (id,
input shard, best edge), its root's (kept id) and its best partner's
(matched id). So, each a runner task exchanging checked files under
<spill>/clusters/ (slices indexed beside their file, tasks/dedup/slice_index.py):
1. `best_edges_by_range`, one per linked-edge file: each node's best edge in
   that file, both orientations, written by the node's id range (an edge
   sits in the partition of its smaller rank; its larger end's best edge may
   be anywhere);
2. tasks/dedup/components.py: each rank's root and clusters.parquet row;
3. `ask_names`, one per id range: its members' best edge (highest Jaccard,
   ties to the smallest partner rank: the best of every file's best), and
   the distinct root and partner ranks outside the range it needs named,
   written by their range;
4. `answer_names`, one per id range: the ids of the ranks each range asked
   of it, one asking range at a time;
5. `range_rows`, one per id range: its removal rows by input shard and its
   cluster rows by block of CLUSTER_BLOCK_ROWS rows of clusters.parquet;
6. `write_clusters`, one task: clusters.parquet block by block, row groups
   of the size manifests.atomic writes, so its bytes are those of one
   write of the whole sorted table; and one task per input shard assembling
   its removal file (tasks/dedup/removal_map.shard_removals).
No task holds more than one range's documents, a linked-edge file or one
block of clusters.parquet.
"""
from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from manifests.atomic import PARQUET_OPTIONS, atomic_write_parquet_stream
from tasks.dedup.components import node_file
from tasks.dedup.minhash import ChecksumMismatch, check_intermediate
from tasks.dedup.near_dup_files import CorpusFiles, CorpusRef, RankedArrays, Slice, best_per_node, write_partitioned
from tasks.dedup.removal_map import REMOVALS_SCHEMA
from tasks.dedup.slice_index import indexed_slice, numbered_file, partition_slices, write_slice_index
from tasks.dedup.spill_reader import SpillFiles
from tasks.dedup.table_slices import ipc_bytes, read_table_slices

RULE = "near_duplicate"
NODE_EDGE = np.dtype([("node", "<i8"), ("partner", "<i8"), ("jaccard", "<f8")])  # a document's best edge in one file
NAMES = pa.schema([("rank", pa.int64()), ("id", pa.string())])
CLUSTER_ROWS = pa.schema([("row", pa.int64()), ("id", pa.string()), ("cluster_id", pa.string())])
CLUSTERS_SCHEMA = pa.schema([("id", pa.string()), ("cluster_id", pa.string()), ("kept_id", pa.string())])
CLUSTER_BLOCK_ROWS = 64 * PARQUET_OPTIONS["row_group_size"]  # clusters.parquet rows one writer step holds: whole row groups
NEEDS_ESCAPE = r'["\\\x00-\x1f]'  # characters json.dumps(ensure_ascii=False) escapes in a string


def range_of(files: CorpusFiles, ranks: np.ndarray) -> np.ndarray:
    return np.searchsorted(np.asarray(files.firsts(), np.int64), ranks, side="right") - 1


def best_edges_by_range(corpus: CorpusRef, path: str, sha256: str, number: int, directory: str) -> int:
    """Task: every node's best edge among one linked-edge file's, written by the node's id range; returns how many."""
    files = corpus.load()
    spill = SpillFiles()
    try:
        spill.verify(path, sha256)
        edges = spill.read(path, 0, spill.shape(path)[0])
    finally:
        spill.close()
    best = np.empty(0, NODE_EDGE)
    if len(edges):
        nodes, partners, similarities, _ = best_per_node(edges)
        best = np.empty(len(nodes), NODE_EDGE)
        best["node"], best["partner"], best["jaccard"] = nodes, partners, similarities
    out = numbered_file(Path(directory) / "best", number)
    write_slice_index(out, write_partitioned(Path(out), best, range_of(files, best["node"]), len(files.ranges)))
    return len(best)


def range_members(spill: SpillFiles, files: CorpusFiles, index: int, linked_files: int, node_sha256: str,
                  directory: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(ranks, roots, best partners, best Jaccards, clusters.parquet rows) of the range's clustered documents, ranks ascending."""
    parts = [spill.read_checked_slice(s.path, s.start, s.stop, s.sha256)
             for s in partition_slices(spill, Path(directory) / "best", linked_files, index)]
    edges = np.concatenate([np.empty(0, NODE_EDGE), *parts])
    order = np.lexsort((edges["partner"], -edges["jaccard"], edges["node"]))  # the best of every file's best
    edges = edges[order[np.concatenate(([True], edges["node"][order][1:] != edges["node"][order][:-1]))]] if len(order) else edges
    path = node_file(directory, index)
    spill.verify(path, node_sha256)
    nodes = spill.read(path, 0, spill.shape(path)[0])
    ranks = edges["node"]
    if np.count_nonzero(nodes["row"] >= 0) != len(ranks):
        raise ChecksumMismatch(f"{path}: clustered documents differ from those with a best edge; the cluster files disagree")
    mine = nodes[ranks - files.ranges[index].first]
    return ranks, mine["root"], edges["partner"], edges["jaccard"], mine["row"]


def ask_names(corpus: CorpusRef, index: int, linked_files: int, node_sha256: str, directory: str) -> int:
    """Task: the distinct ranks outside this range whose ids its rows need (roots; best partners of removed documents),
    written by their range; returns how many."""
    files = corpus.load()
    spill = SpillFiles()
    try:
        ranks, roots, partners, _, _ = range_members(spill, files, index, linked_files, node_sha256, directory)
    finally:
        spill.close()
    needed = np.unique(np.concatenate((roots, partners[roots != ranks])))
    needed = needed[range_of(files, needed) != index]
    out = numbered_file(Path(directory) / "asks", index)
    write_slice_index(out, write_partitioned(Path(out), needed, range_of(files, needed), len(files.ranges)))
    return len(needed)


def range_ids(files: CorpusFiles, index: int) -> pa.Array:
    """The range's ids in rank order, its file checked against its digest."""
    path = check_intermediate(files.range_path(index, "ids.parquet"), files.ranges[index].ids_sha256)
    return pq.read_table(path).column("id").combine_chunks()


def write_streamed_slices(path: Path, tables: Iterable[pa.Table]) -> list[Slice]:
    """tasks/dedup/table_slices.write_table_slices for tables made one at a time: the same file, one table held at once."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header_bytes = 128  # a 1-D uint8 .npy header, whatever its length (np.lib.format pads it to 64-byte lines)
    slices, position = [], 0
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        handle.write(b"\0" * header_bytes)
        for table in tables:
            blob = ipc_bytes(table)
            handle.write(blob)
            slices.append(Slice(str(path), position, position + len(blob), hashlib.sha256(blob).hexdigest()))
            position += len(blob)
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(header, {"descr": "|u1", "fortran_order": False, "shape": (position,)})
        if len(header.getvalue()) != header_bytes:
            raise ValueError(f"{path}: unexpected .npy header length {len(header.getvalue())}")
        handle.seek(0)
        handle.write(header.getvalue())
    tmp.replace(path)
    return slices


def answer_names(corpus: CorpusRef, index: int, directory: str) -> int:
    """Task: the ids of the ranks each range asked of this one, one asking range at a time; returns how many."""
    files = corpus.load()
    ids, first = range_ids(files, index), files.ranges[index].first
    spill = SpillFiles()
    answered = 0

    def answers() -> Iterable[pa.Table]:
        nonlocal answered
        for asking in range(len(files.ranges)):
            part = indexed_slice(spill, numbered_file(Path(directory) / "asks", asking), index)
            ranks = spill.read_checked_slice(part.path, part.start, part.stop, part.sha256)
            answered += len(ranks)
            yield pa.table([pa.array(ranks, pa.int64()), ids.take(pa.array(ranks - first))], schema=NAMES)

    try:
        out = numbered_file(Path(directory) / "names", index)
        write_slice_index(out, write_streamed_slices(Path(out), answers()))
    finally:
        spill.close()
    return answered


def json_strings(values: pa.Array) -> pa.Array:
    """Each string as json.dumps(value, ensure_ascii=False) writes it, in Arrow (Python only for strings with escapes)."""
    quoted = pc.binary_join_element_wise('"', values, '"', "")
    escaped = pc.match_substring_regex(values, NEEDS_ESCAPE)
    if not pc.any(escaped).as_py():
        return quoted
    which = pc.filter(values, escaped).to_pylist()
    return pc.replace_with_mask(quoted, escaped, pa.array([json.dumps(value, ensure_ascii=False) for value in which], pa.string()))


def json_floats(values: np.ndarray) -> pa.Array:
    """Each float as json.dumps writes it (Python's repr): Arrow's shortest round-trip digits, ".0" on integral values,
    and Python for values Python writes with an exponent (below 1e-4 or from 1e16)."""
    text = pc.cast(pa.array(values, pa.float64()), pa.string())
    integral = pc.invert(pc.match_substring_regex(text, r"[.eE]|n|i"))
    text = pc.if_else(integral, pc.binary_join_element_wise(text, ".0", ""), text)
    exponent = (np.abs(values) < 1e-4) & (values != 0) | (np.abs(values) >= 1e16) | ~np.isfinite(values)
    if not exponent.any():
        return text
    mask = pa.array(exponent)
    return pc.replace_with_mask(text, mask, pa.array([json.dumps(value) for value in values[exponent].tolist()], pa.string()))


def removal_details(kept_ids: pa.Array, matched_ids: pa.Array, similarities: np.ndarray) -> pa.Array:
    """manifests.schema.dumps_json({"cluster_id", "kept_id", "matched_id", "jaccard"}) of every row, in Arrow."""
    kept = json_strings(kept_ids)
    return pc.binary_join_element_wise('{"cluster_id":', kept, ',"jaccard":', json_floats(similarities), ',"kept_id":', kept,
                                       ',"matched_id":', json_strings(matched_ids), "}", "")


def write_partitioned_table(path: str, table: pa.Table, partition_of: np.ndarray, partitions: int) -> None:
    """`table`'s rows by partition (stable), one checked slice each, indexed beside the file."""
    order = np.argsort(partition_of, kind="stable")
    bounds = np.searchsorted(partition_of[order], np.arange(partitions + 1)).tolist()
    table = table.take(pa.array(order))
    write_slice_index(path, write_streamed_slices(Path(path), (table.slice(start, stop - start) for start, stop in zip(bounds, bounds[1:]))))


def id_lookup(files: CorpusFiles, index: int, ids: pa.Array, named: pa.Table) -> Callable[[np.ndarray], pa.Array]:
    """ids_of(ranks): from the range's own ids, or from those other ranges named for it."""
    first = files.ranges[index].first
    named_ranks = np.asarray(named.column("rank").combine_chunks(), np.int64)
    order = np.argsort(named_ranks)
    named_ranks = named_ranks[order]
    lookup = pa.concat_arrays([ids, named.column("id").combine_chunks().take(pa.array(order))])

    def ids_of(ranks: np.ndarray) -> pa.Array:
        at = np.where(range_of(files, ranks) == index, ranks - first, len(ids) + np.searchsorted(named_ranks, ranks))
        return lookup.take(pa.array(at))

    return ids_of


def range_rows(corpus: CorpusRef, threshold: float, index: int, linked_files: int, node_sha256: str, clustered: int,
               directory: str) -> int:
    """Task: the range's removal rows, by input shard number, and its clusters.parquet rows, by block; returns the removals."""
    files = corpus.load()
    spill = SpillFiles()
    try:
        ranks, roots, partners, similarities, rows = range_members(spill, files, index, linked_files, node_sha256, directory)
        ids = range_ids(files, index)
        named = read_table_slices(spill, partition_slices(spill, Path(directory) / "names", len(files.ranges), index), NAMES)
        ids_of = id_lookup(files, index, ids, named)
        member_ids, kept_ids = ids.take(pa.array(ranks - files.ranges[index].first)), ids_of(roots)
        removed = np.flatnonzero(roots != ranks)
        shards = np.asarray(RankedArrays(files, "spans.npy", spill)[ranks[removed]], np.int64).reshape(-1, 3)[:, 0]
    finally:
        spill.close()
    taken, similarity = pa.array(removed), similarities[removed]
    removals = pa.table([member_ids.take(taken), pa.repeat(RULE, len(removed)), pa.array(similarity, pa.float64()),
                         pa.array(np.full(len(removed), threshold), pa.float64()),
                         removal_details(kept_ids.take(taken), ids_of(partners[removed]), similarity)], schema=REMOVALS_SCHEMA)
    write_partitioned_table(numbered_file(Path(directory) / "removed", index), removals, shards, len(files.shard_names))
    write_partitioned_table(numbered_file(Path(directory) / "rows", index), pa.table([rows, member_ids, kept_ids], schema=CLUSTER_ROWS),
                            rows // CLUSTER_BLOCK_ROWS, -(-clustered // CLUSTER_BLOCK_ROWS))
    return len(removed)


def write_clusters(directory: str, ranges: int, clustered: int, path: str) -> int:
    """Task: clusters.parquet (id, cluster_id, kept_id by cluster id, then id) from every range's rows, one block at a time;
    the bytes of manifests.atomic.atomic_write_parquet of the whole table. Returns its rows."""
    spill = SpillFiles()

    def blocks() -> Iterator[pa.Table]:
        for block, start in enumerate(range(0, clustered, CLUSTER_BLOCK_ROWS)):
            rows = read_table_slices(spill, partition_slices(spill, Path(directory) / "rows", ranges, block), CLUSTER_ROWS)
            rows = rows.sort_by([("row", "ascending")]).combine_chunks()
            expected = np.arange(start, min(clustered, start + CLUSTER_BLOCK_ROWS))
            if not np.array_equal(np.asarray(rows.column("row")), expected):
                raise ChecksumMismatch(f"{directory}/rows: block {block} does not hold rows {start}..{expected[-1]} once each")
            cluster_ids = rows.column("cluster_id")
            yield pa.table([rows.column("id"), cluster_ids, cluster_ids], schema=CLUSTERS_SCHEMA)

    try:
        return atomic_write_parquet_stream(Path(path), CLUSTERS_SCHEMA, blocks())
    finally:
        spill.close()
