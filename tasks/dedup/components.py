"""Connected components of the verified edges out of core: each document's cluster root and its row in clusters.parquet.

One task, but its heap follows CHUNK (edges or documents handled at once),
not N: the root of every rank lives in a memory-mapped int64 file in the
work directory (8 bytes a document on disk), and edges are streamed. Hooking
reads labels at random, so it runs at memory speed while the file fits in
the page cache (8 GB at 1B documents; its pages are clean or written back,
never the process's own), at disk speed beyond.

Roots by min-label hooking and pointer jumping, both vectorised. Invariant:
label[x] ≤ x and label[x] is in x's component. A round reads every edge
still crossing two trees, hooks the larger label under the smaller one
(the smallest per hooked label within a chunk), then one ascending sweep
compresses every label to its tree's root (a label points down, so the
ranks below a chunk are already compressed when it is reached; inside it,
pointer doubling). A round keeps only the edges that still cross, as pairs
of roots, in a scratch file of this task; it stops when none cross. Then
every component is one star whose root is its smallest rank: the keeper.
Each non-minimal tree hooks in every round and a minimal one that nobody
hooked onto hooks in the next, so the trees at least halve every two
rounds: O(log N) rounds, far fewer in practice (the edges are a forest
plus best edges, tasks/dedup/near_dup_files.reduce_edges).

Rows of clusters.parquet (sorted by cluster id, then id; rank order is id
order) are placed by a counting sort: component sizes by root, their
exclusive prefix sum over roots of clusters of two or more, then each
member's row = its root's next free row, ranks ascending. So later tasks
write any row of the file knowing only their own documents.

Output per id range: `clusters-rNNNNN.npy` of (root, row) per rank (row -1:
not clustered), checked by its sha256; the shared files are deleted.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import numpy as np

from tasks.dedup.minhash import write_checked_array
from tasks.dedup.near_dup_files import CorpusRef
from tasks.dedup.spill_reader import SpillFiles

CHUNK = 1 << 20  # edges or documents handled at once: the task's heap is a few times CHUNK × 24 bytes
NODE = np.dtype([("root", "<i8"), ("row", "<i8")])  # a document's cluster root and its row in clusters.parquet (-1: none)


def node_file(directory: str, index: int) -> str:
    return str(Path(directory) / f"clusters-r{index:05d}.npy")


def blank_labels(path: Path, documents: int) -> np.memmap:
    """An int64 file of `documents` entries, each its own label, written CHUNK at a time."""
    labels = np.lib.format.open_memmap(path, mode="w+", dtype=np.int64, shape=(documents,))
    for start in range(0, documents, CHUNK):
        labels[start:start + CHUNK] = np.arange(start, min(documents, start + CHUNK))
    return labels


def hook(labels: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hook the larger label of each crossing edge under the smaller; the crossing edges as (smaller, larger) labels."""
    label_a, label_b = labels[a], labels[b]
    crossing = label_a != label_b
    low, high = np.minimum(label_a[crossing], label_b[crossing]), np.maximum(label_a[crossing], label_b[crossing])
    order = np.lexsort((low, high))
    firsts = order[np.concatenate(([True], high[order][1:] != high[order][:-1]))] if len(order) else order
    targets = high[firsts]
    labels[targets] = np.minimum(labels[targets], low[firsts])
    return low, high


def compress(labels: np.ndarray) -> None:
    """Point every label at its tree's root, one ascending sweep of CHUNK documents at a time."""
    for start in range(0, len(labels), CHUNK):
        block = np.array(labels[start:start + CHUNK])
        below = block < start
        block[below] = labels[block[below]]  # ranks below the block were compressed already: one step reaches the root
        while True:
            inside = block >= start
            stepped = block.copy()
            stepped[inside] = block[block[inside] - start]  # pointer doubling inside the block
            if np.array_equal(stepped, block):
                break
            block = stepped
        labels[start:start + CHUNK] = block


def scratch_pairs(path: Path) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The (low, high) root pairs a round left in `path` (raw int64 pairs), CHUNK at a time."""
    count = os.path.getsize(path) // 16
    for start in range(0, count, CHUNK):
        pairs = np.fromfile(path, dtype=np.int64, count=2 * min(CHUNK, count - start), offset=16 * start).reshape(-1, 2)
        yield pairs[:, 0], pairs[:, 1]


def linked_pairs(spill: SpillFiles, linked: list[tuple[str, str]]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(a, b) of every linked-edge file, each checked against its digest, CHUNK edges at a time."""
    for path, sha256 in linked:
        spill.verify(path, sha256)
        count = spill.shape(path)[0]
        for start in range(0, count, CHUNK):
            edges = spill.read(path, start, min(count, start + CHUNK))
            yield edges["a"], edges["b"]


def component_roots(labels: np.ndarray, spill: SpillFiles, linked: list[tuple[str, str]], scratch: Path) -> int:
    """Fill `labels` with each rank's root (smallest rank of its component); returns the rounds that hooked something."""
    source, rounds = linked_pairs(spill, linked), 0
    while True:
        crossing = 0
        kept = scratch.with_name(f"{scratch.name}.{rounds % 2}")
        with open(kept, "wb") as out:
            for a, b in source:
                low, high = hook(labels, a, b)
                np.stack((low, high), axis=1).tofile(out)
                crossing += len(low)
        compress(labels)
        if not crossing:
            kept.unlink()
            scratch.with_name(f"{scratch.name}.{(rounds + 1) % 2}").unlink(missing_ok=True)
            return rounds
        rounds += 1
        source = scratch_pairs(kept)


def first_rows(labels: np.ndarray, next_rows: np.ndarray) -> tuple[int, int]:
    """Turn `next_rows` (a zeroed int64 file of N entries) into the first clusters.parquet row of each cluster, by root
    (= by cluster id), -1 for a root of a lone document; returns (clusters, clustered documents)."""
    documents = len(labels)
    for start in range(0, documents, CHUNK):
        roots, sizes = np.unique(labels[start:start + CHUNK], return_counts=True)
        next_rows[roots] += sizes
    clusters = clustered = 0
    for start in range(0, documents, CHUNK):
        sizes = np.array(next_rows[start:start + CHUNK])
        in_cluster = sizes >= 2
        counted = np.where(in_cluster, sizes, 0)
        next_rows[start:start + CHUNK] = np.where(in_cluster, clustered + np.cumsum(counted) - counted, -1)
        clusters += int(in_cluster.sum())
        clustered += int(counted.sum())
    return clusters, clustered


def place_rows(labels: np.ndarray, next_rows: np.ndarray, start: int, stop: int) -> np.ndarray:
    """(root, row) of ranks [start, stop), which must follow the ranks placed before: each member takes its root's next
    row, ranks ascending, so a cluster's rows are in id order."""
    roots = np.asarray(labels[start:stop])
    order = np.argsort(roots, kind="stable")
    ordered = roots[order]
    nodes = np.empty(len(roots), NODE)
    nodes["root"] = roots
    if not len(roots):
        return nodes
    firsts = np.concatenate(([True], ordered[1:] != ordered[:-1]))
    group_start = np.maximum.accumulate(np.where(firsts, np.arange(len(ordered)), 0))
    base = next_rows[ordered]
    nodes["row"][order] = np.where(base >= 0, base + np.arange(len(ordered)) - group_start, -1)
    group_roots, counts = ordered[firsts], np.diff(np.append(np.flatnonzero(firsts), len(ordered)))
    in_cluster = next_rows[group_roots] >= 0
    next_rows[group_roots[in_cluster]] += counts[in_cluster]
    return nodes


def label_components(corpus: CorpusRef, linked: list[tuple[str, str]], directory: str) -> dict:
    """Task: each rank's (root, clusters.parquet row), one checked file per id range in `directory`; returns their
    digests, the cluster and clustered-document counts and the hooking rounds."""
    files = corpus.load()
    work = Path(directory)
    work.mkdir(parents=True, exist_ok=True)
    spill = SpillFiles()
    try:
        labels = blank_labels(work / "labels.npy", files.documents)
        rounds = component_roots(labels, spill, linked, work / "crossing")
    finally:
        spill.close()
    next_rows = np.lib.format.open_memmap(work / "next-rows.npy", mode="w+", dtype=np.int64, shape=(files.documents,))
    clusters, clustered = first_rows(labels, next_rows)
    digests = []
    for index, part in enumerate(files.ranges):
        nodes = np.concatenate([np.empty(0, NODE)] + [place_rows(labels, next_rows, start, min(part.stop, start + CHUNK))
                                                      for start in range(part.first, part.stop, CHUNK)])
        digests.append(write_checked_array(Path(node_file(directory, index)), nodes))
    del labels, next_rows
    for name in ("labels.npy", "next-rows.npy"):
        (work / name).unlink()
    return {"node_sha256": digests, "clusters": clusters, "clustered": clustered, "rounds": rounds}
