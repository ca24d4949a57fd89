"""The near-duplicate pass after bucketing: verify each candidate pair once, then join verified pairs into clusters.

Two kinds of runner task:
* `verify_rank_partition`, one per range of ranks: gathers from every key
  partition the candidate pairs and verified edges whose smaller rank falls in
  its range, de-duplicates them (a pair proposed by several bands is verified
  once; a pair a bucket already counted exactly is not verified again),
  computes the exact Jaccard of the rest and writes what decides the outcome
  (tasks/near_dup_files.reduce_edges);
* `link_clusters`, one task: union-find over those edges (small: a forest and
  one best edge per clustered document), then the removal map and the cluster
  table as Parquet in the stage directory, which the shard tasks read.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from manifests.atomic import atomic_write_parquet
from manifests.schema import dumps_json
from manifests.digest import sha256_file
from tasks.dedup.minhash import ChecksumMismatch, UnionFind, read_checked_array, write_checked_array
from tasks.dedup.near_dup_files import (EDGE, PAIR, CorpusFiles, CorpusRef, RankedArrays, ShingleSets, best_per_node, edges_array,
                                        partition_file, read_slices, reduce_edges)
from tasks.dedup.slice_index import indexed_slice
from tasks.dedup.removal_map import RemovalContext, removal_table, write_removal_table
from tasks.dedup.spill_reader import SpillFiles

RULE = "near_duplicate"
CLUSTERS_FILE = "clusters.parquet"
NO_MATCH = -1.0  # best similarity of a document without a verified edge (accepted Jaccards are > 0)


def unique_pairs(a: np.ndarray, b: np.ndarray, documents: int) -> tuple[np.ndarray, np.ndarray]:
    """(codes a * documents + b, first index of each) of distinct pairs, codes ascending."""
    return np.unique(a.astype(np.int64) * documents + b, return_index=True)


def verify_rank_partition(corpus: CorpusRef, config: Any, partition: int, partitions: int, spill_dir: str,
                          out_path: str) -> dict[str, Any]:
    """Task: the distinct candidate pairs of one rank range verified exactly; with the edges found in bulk, reduced.

    Its pairs and edges are entry `partition` of every key partition's candidate and edge index."""
    files = corpus.load()
    spill = SpillFiles()
    try:
        candidates = [indexed_slice(spill, partition_file(spill_dir, "candidates", key), partition) for key in range(partitions)]
        edges = [indexed_slice(spill, partition_file(spill_dir, "edges", key), partition) for key in range(partitions)]
        found = read_slices(spill, edges, EDGE)
        edge_codes, first = unique_pairs(found["a"], found["b"], files.documents)
        found = found[first]
        pairs = read_slices(spill, candidates, PAIR)
        codes = np.unique(pairs["a"].astype(np.int64) * files.documents + pairs["b"])
        codes = codes[~np.isin(codes, edge_codes)]
        anchors, partners = codes // files.documents, codes % files.documents
        shingle_sets = ShingleSets(files, spill)
        accepted: list[np.ndarray] = []
        # One anchor at a time (ascending), with all its partners verified in one vectorised pass.
        anchors_at = np.flatnonzero(np.concatenate(([True], anchors[1:] != anchors[:-1], [True]))) if len(codes) else np.zeros(1, np.int64)
        for begin, end in zip(anchors_at[:-1].tolist(), anchors_at[1:].tolist()):
            similarities = shingle_sets.jaccards(int(anchors[begin]), partners[begin:end].tolist())
            keep = similarities >= config.jaccard_threshold
            accepted.append(edges_array(np.full(int(keep.sum()), anchors[begin]), partners[begin:end][keep], similarities[keep]))
        new_edges = np.concatenate(accepted) if accepted else np.empty(0, EDGE)
        linked = reduce_edges(np.concatenate((found, new_edges)))
        sha256 = write_checked_array(Path(out_path), linked)
        return {"partition": partition, "path": out_path, "sha256": sha256,
                "counts": {"verified_pairs": len(codes), "accepted_pairs": len(new_edges), "rejected_pairs": len(codes) - len(new_edges),
                           "edges_from_buckets": len(found), "linked_edges": len(linked)}}
    finally:
        spill.close()


def link_clusters(corpus: CorpusRef, config: Any, linked: list[tuple[str, str]], work_dir: str) -> RemovalContext:
    """Task: union-find over every partition's edges; removal map and clusters.parquet written into the stage directory."""
    files = corpus.load()
    parts = [np.asarray(read_checked_array(Path(path), sha256, mmap=False)) for path, sha256 in linked]
    edges = np.concatenate(parts) if parts else np.empty(0, EDGE)
    clusters = UnionFind(files.documents)
    for a, b in zip(edges["a"].tolist(), edges["b"].tolist()):
        clusters.union(a, b)
    best_similarity = np.full(files.documents, NO_MATCH, dtype=np.float64)
    best_partner = np.zeros(files.documents, dtype=np.int64)
    nodes, partners, similarities, _ = best_per_node(edges)
    best_similarity[nodes], best_partner[nodes] = similarities, partners
    ids = corpus_ids(files)
    spill = SpillFiles()
    try:
        spans = RankedArrays(files, "spans.npy", spill)  # memory-mapped: only the removed documents' rows are read

        def shards_of(ranks: np.ndarray) -> pa.Array:
            return pa.array(files.shard_names, pa.string()).take(pa.array(np.asarray(spans[ranks][:, 0] if len(ranks) else [], np.int64)))

        clusters_table, removals, cluster_count = cluster_outputs(clusters, best_similarity, best_partner, ids, config.jaccard_threshold,
                                                                  shards_of)
    finally:
        spill.close()
    atomic_write_parquet(Path(work_dir) / CLUSTERS_FILE, clusters_table)
    stats = {"clusters": cluster_count, "clustered_documents": clusters_table.num_rows, "removed": removals.num_rows}
    return write_removal_table(Path(work_dir), removals, stats, [(CLUSTERS_FILE, clusters_table.num_rows)])


def corpus_ids(files: CorpusFiles) -> pa.Array:
    """Every id in rank order: each range's file checked against its digest, then concatenated."""
    parts = []
    for index, part in enumerate(files.ranges):
        path = files.range_path(index, "ids.parquet")
        if sha256_file(Path(path)) != part.ids_sha256:
            raise ChecksumMismatch(f"{path}: sha256 differs from what its writer recorded; the intermediate file is corrupt, nothing was published")
        parts.append(pq.read_table(path).column("id").combine_chunks())
    return pa.concat_arrays(parts) if parts else pa.array([], pa.string())


def cluster_outputs(clusters: UnionFind, best_similarity: np.ndarray, best_partner: np.ndarray, ids: pa.Array,
                    threshold: float, shards_of: Callable[[np.ndarray], pa.Array]) -> tuple[pa.Table, pa.Table, int]:
    """(clusters table, removal table, number of clusters) from the verified links, as Arrow columns; `ids` in rank order,
    `shards_of(ranks)` the input shard of each rank."""
    clustered = np.flatnonzero(best_similarity != NO_MATCH)  # ascending ranks: id order
    roots = np.fromiter((clusters.find(rank) for rank in clustered.tolist()), dtype=np.int64, count=len(clustered))
    member_ids, kept_ids = ids.take(pa.array(clustered)), ids.take(pa.array(roots))
    # Roots were found for every member above, so ids of a cluster are adjacent after sorting by (cluster, id).
    clusters_table = pa.table({"id": member_ids, "cluster_id": kept_ids, "kept_id": kept_ids}).sort_by(
        [("cluster_id", "ascending"), ("id", "ascending")])
    is_removed = roots != clustered
    removed = clustered[is_removed]
    similarity = best_similarity[removed]
    kept = kept_ids.filter(pa.array(is_removed)).to_pylist()
    matched = ids.take(pa.array(best_partner[removed])).to_pylist()
    details = [dumps_json({"cluster_id": kept_id, "kept_id": kept_id, "matched_id": matched_id, "jaccard": jaccard})
               for kept_id, matched_id, jaccard in zip(kept, matched, similarity.tolist())]
    removals = removal_table(member_ids.filter(pa.array(is_removed)), shards_of(removed), [RULE] * len(removed), similarity,
                             [threshold] * len(removed), details)
    return clusters_table, removals, len(np.unique(roots))
