"""The near-duplicate pass after bucketing: verify each candidate pair once, then join verified pairs into clusters.

Two kinds of runner task:
* `verify_rank_partition`, one per range of ranks: gathers from every key
  partition the candidate pairs and verified edges whose smaller rank falls in
  its range, de-duplicates them (a pair proposed by several bands is verified
  once; a pair a bucket already counted exactly is not verified again),
  computes the exact Jaccard of the rest and writes what decides the outcome
  (tasks/near_dup_files.reduce_edges);
* `link_clusters`: the clusters from those edges (tasks/dedup/components.py)
  and the removal map and cluster table as Parquet in the stage directory,
  which the shard tasks read, as tasks bounded by an id range
  (tasks/dedup/cluster_tables.py).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tasks.dedup.cluster_tables import answer_names, ask_names, best_edges_by_range, range_rows, write_clusters
from tasks.dedup.components import label_components
from tasks.dedup.minhash import write_checked_array
from tasks.dedup.near_dup_files import EDGE, PAIR, CorpusFiles, CorpusRef, ShingleSets, edges_array, partition_file, read_slices, reduce_edges
from tasks.dedup.removal_map import REMOVALS_DIR, RemovalContext, ShardFiles, shard_removals
from tasks.dedup.slice_index import indexed_slice
from tasks.dedup.spill_reader import SpillFiles
from tasks.runner.stage_runner import map_shards

CLUSTERS_FILE = "clusters.parquet"


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


def link_clusters(files: CorpusFiles, config: Any, linked: list[tuple[str, str]], work_dir: str, spill_dir: str,
                  workers: int) -> RemovalContext:
    """Clusters from every partition's edges as runner tasks (tasks/dedup/cluster_tables.py): best edges by id range,
    components, names asked and answered by range, rows by range; clusters.parquet and the removal files in the stage
    directory. The host passes file numbers, digests and counts."""
    directory = str(Path(spill_dir) / "clusters")
    corpus = files.saved()  # the tasks are sent its path and digest, not O(shards + ranges) values each
    ranges, sizes = len(files.ranges), [part.stop - part.first for part in files.ranges]
    jobs = [(corpus, path, sha256, number, directory) for number, (path, sha256) in enumerate(linked)]
    list(map_shards(best_edges_by_range, jobs, workers, "best edges", [1] * len(jobs)))
    [components] = list(map_shards(label_components, [(corpus, linked, directory)], 1, "clusters", [files.documents]))
    digests, clustered = components["node_sha256"], components["clustered"]
    list(map_shards(ask_names, [(corpus, index, len(linked), digests[index], directory) for index in range(ranges)], workers,
                    "cluster names asked", sizes))
    list(map_shards(answer_names, [(corpus, index, directory) for index in range(ranges)], workers, "cluster names answered", sizes))
    removed = sum(map_shards(range_rows, [(corpus, config.jaccard_threshold, index, len(linked), digests[index], clustered, directory)
                                          for index in range(ranges)], workers, "cluster rows", sizes))
    list(map_shards(write_clusters, [(directory, ranges, clustered, str(Path(work_dir) / CLUSTERS_FILE))], 1, "clusters.parquet", [clustered]))
    shard_jobs = [(work_dir, name, number, ranges, directory) for number, name in enumerate(files.shard_names)]
    written = sorted(filter(None, map_shards(shard_removals, shard_jobs, workers, "removals by shard", [1] * len(shard_jobs))))
    removals = ShardFiles(REMOVALS_DIR, {shard: (path, sha256, rows) for shard, path, sha256, rows in written})
    stats = {"clusters": components["clusters"], "clustered_documents": clustered, "removed": removed}
    return RemovalContext(removals, stats, [(CLUSTERS_FILE, clustered)])
