"""Near-duplicate removal: MinHash-LSH candidates, exact-Jaccard verification, union-find, smallest id kept.

Seed 001, "近似重复和 Jaccard 相似度" through "已发表流程的选择": word 5-gram
shingle sets (character 5-grams for space-less scripts), 112 hashes as 14
bands × 8 rows (FineWeb's choice), candidates verified with the exact Jaccard
of the shingle sets against 0.8, so a false candidate costs verification time
and never a wrong removal; verified pairs are joined with union-find because
near-duplicates chain (A~B, B~C), and each cluster keeps its smallest id.

How it runs:
1. workers, one shard each: shingle hashes, signatures, band keys; band keys
   and shingle hashes are spilled to .npy files whose sha256 the worker records;
2. the global pass ranks all ids (rank order = id order, so "smallest rank"
   is "smallest id" whatever the shard layout), then for one band at a time
   sorts (key, rank) records from every shard's spill file, walks the runs of
   equal keys, and verifies candidate pairs — memory is one band's records;
3. each shard drops the removed ids.
Rule `near_duplicate`, value = exact Jaccard with the matched document,
detail {"cluster_id", "kept_id", "matched_id", "jaccard"}; the cluster is
named after its keeper. Artifact `clusters.parquet`: id, cluster_id, kept_id
for every member of every cluster of two or more documents.
"""
from __future__ import annotations

import shutil
import time
from collections import OrderedDict
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from manifests.atomic import atomic_write_parquet
from manifests.stage_manifest import StageManifest
from tasks.lazy_task import lazy_task
from tasks.minhash import HashFamily, UnionFind, band_keys, read_checked_array, signatures, write_checked_array
from tasks.removal_map import Removal, RemovalContext, apply_removals, map_upstream_shards, write_removals
from tasks.shingles import TokenHashCache, batch_ngram_hashes, jaccard_of_sets, sorted_set, tokens
from tasks.stage_runner import StageDef, run_stage

STAGE = "dedup_fuzzy"
VERSION = "1"
RULE = "near_duplicate"
CLUSTERS_FILE = "clusters.parquet"
SPILL_DIR = "_spill"
SHINGLE_SET_CACHE = 4096  # verified documents whose sorted shingle sets stay in memory


@dataclass(frozen=True)
class DedupFuzzyConfig:
    shingle_size: int = 5  # seed: word 5-grams
    bands: int = 14  # FineWeb: 112 hashes = 14 bands × 8 rows
    rows: int = 8
    jaccard_threshold: float = 0.8  # seed: exact Jaccard ≥ 0.8 on the shingle sets
    seed: int = 1  # of the hash family; fixed so re-runs find the same candidates
    fold_numbers: bool = True  # "page 3" and "page 4" shingle alike
    exhaustive_bucket_size: int = 64  # larger buckets pair every member with the first and the next only

    @property
    def num_hashes(self) -> int:
        return self.bands * self.rows


def check_config(config: DedupFuzzyConfig) -> None:
    if config.shingle_size < 1 or config.bands < 1 or config.rows < 1:
        raise ValueError(f"dedup_fuzzy: shingle_size, bands and rows must be ≥ 1, got {config}")
    if not 0.0 < config.jaccard_threshold <= 1.0:
        raise ValueError(f"dedup_fuzzy: jaccard_threshold must be in (0, 1], got {config.jaccard_threshold}")
    if config.exhaustive_bucket_size < 2:
        raise ValueError(f"dedup_fuzzy: exhaustive_bucket_size must be ≥ 2, got {config.exhaustive_bucket_size}")


def bucket_pairs(members: list[int], exhaustive_bucket_size: int) -> Iterator[tuple[int, int]]:
    """Candidate pairs of one LSH bucket (members in id order).

    Small buckets: every pair. Large ones (boilerplate, a mass-copied page):
    each member with the first and with its successor, 2m pairs instead of
    m²/2, which still links a bucket of true copies into one cluster.
    """
    if len(members) <= exhaustive_bucket_size:
        yield from combinations(members, 2)
        return
    first = members[0]
    for previous, member in zip(members, members[1:]):
        yield first, member
        if previous != first:
            yield previous, member


def signature_shard(shard_path: str, shard: str, config: DedupFuzzyConfig, spill_dir: str) -> dict[str, Any]:
    """Worker: shingle hashes, MinHash signatures and band keys of one shard, spilled with checksums."""
    table = pq.read_table(shard_path, columns=["id", "text"])
    texts = table.column("text").to_pylist()
    cache = TokenHashCache()
    shingle_hashes, offsets = batch_ngram_hashes((tokens(text, config.fold_numbers) for text in texts), config.shingle_size, cache)
    family = HashFamily.from_seed(config.num_hashes, config.seed)
    signature_rows = signatures(shingle_hashes, offsets, family)
    with_shingles = np.flatnonzero(np.diff(offsets) > 0).astype(np.int64)  # empty sets never enter buckets
    keys = band_keys(signature_rows[with_shingles], config.bands, config.rows)
    spill = Path(spill_dir)
    bands_file, shingles_file = spill / f"{shard}.bands.npy", spill / f"{shard}.shingles.npy"
    return {
        "shard": shard,
        "ids": table.column("id").to_pylist(),
        "with_shingles": with_shingles,
        "offsets": offsets,
        "bands_file": str(bands_file),
        "bands_sha256": write_checked_array(bands_file, keys),
        "shingles_file": str(shingles_file),
        "shingles_sha256": write_checked_array(shingles_file, shingle_hashes),
    }


class ShingleSets:
    """Sorted unique shingle hashes of a document by rank, read from the verified spill files."""

    def __init__(self, shards: list[dict[str, Any]], shard_of_rank: np.ndarray, local_of_rank: np.ndarray):
        self.shards, self.shard_of_rank, self.local_of_rank = shards, shard_of_rank, local_of_rank
        self.arrays: dict[int, np.ndarray] = {}
        self.cache: OrderedDict[int, np.ndarray] = OrderedDict()

    def raw(self, rank: int) -> np.ndarray:
        """The document's shingle hashes in text order (repeats included), a view into the spill file."""
        shard_index, local = int(self.shard_of_rank[rank]), int(self.local_of_rank[rank])
        if shard_index not in self.arrays:
            shard = self.shards[shard_index]
            # a plain ndarray view of the map: slicing a np.memmap costs ~10 µs of bookkeeping per call
            self.arrays[shard_index] = np.asarray(read_checked_array(Path(shard["shingles_file"]), shard["shingles_sha256"]))
        offsets = self.shards[shard_index]["offsets"]
        return self.arrays[shard_index][offsets[local]: offsets[local + 1]]

    def of(self, rank: int) -> np.ndarray:
        """The document's shingle set, sorted (recently used ones cached)."""
        if rank in self.cache:
            self.cache.move_to_end(rank)
            return self.cache[rank]
        shingle_set = sorted_set(self.raw(rank))
        self.cache[rank] = shingle_set
        if len(self.cache) > SHINGLE_SET_CACHE:
            self.cache.popitem(last=False)
        return shingle_set

    def jaccard(self, a: int, b: int) -> float:
        raw_a, raw_b = self.raw(a), self.raw(b)
        if len(raw_a) == len(raw_b) and np.array_equal(raw_a, raw_b):
            return 1.0  # same shingle sequence, same set: skip the sort
        return jaccard_of_sets(self.of(a), self.of(b))


def band_buckets(shards: list[dict[str, Any]], ranks_of_shard: list[np.ndarray], band: int, band_arrays: dict[int, np.ndarray]) -> Iterator[list[int]]:
    """Buckets (ranks in ascending order, ≥ 2 members) of one band, by sorting its (key, rank) records."""
    keys = np.concatenate([band_arrays[i][band] for i in range(len(shards))])
    ranks = np.concatenate([ranks_of_shard[i][shards[i]["with_shingles"]] for i in range(len(shards))])
    if len(keys) < 2:
        return
    order = np.lexsort((ranks, keys))
    keys, ranks = keys[order], ranks[order]
    starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    sizes = np.diff(np.append(starts, len(keys)))
    for start, size in zip(starts[sizes > 1].tolist(), sizes[sizes > 1].tolist()):
        yield ranks[start: start + size].tolist()


def find_near_duplicates(upstream: StageManifest, config: DedupFuzzyConfig, work_dir: Path, workers: int = 1) -> RemovalContext:
    """Global pass: signatures per shard in parallel, band-by-band candidates, verification, union-find."""
    check_config(config)
    started = time.perf_counter()
    spill_dir = Path(work_dir) / SPILL_DIR
    try:
        shards = map_upstream_shards(signature_shard, upstream, (config, str(spill_dir)), workers, "minhash")
        signed = time.perf_counter()
        all_ids = np.array([doc_id for shard in shards for doc_id in shard["ids"]], dtype=object)
        by_id = np.argsort(all_ids.astype(str), kind="stable")
        rank_of_position = np.empty(len(all_ids), dtype=np.int64)
        rank_of_position[by_id] = np.arange(len(all_ids))
        sizes = [len(shard["ids"]) for shard in shards]
        bounds = np.concatenate(([0], np.cumsum(sizes)))
        ranks_of_shard = [rank_of_position[bounds[i]: bounds[i + 1]] for i in range(len(shards))]
        shard_of_rank = np.repeat(np.arange(len(shards)), sizes)[by_id]
        local_of_rank = (np.arange(len(all_ids)) - np.repeat(bounds[:-1], sizes))[by_id]
        ids_by_rank = all_ids[by_id]

        band_arrays = {i: read_checked_array(Path(shard["bands_file"]), shard["bands_sha256"]) for i, shard in enumerate(shards)}
        shingle_sets = ShingleSets(shards, shard_of_rank, local_of_rank)
        clusters = UnionFind(len(all_ids))
        best_match: dict[int, tuple[float, int]] = {}  # rank -> (Jaccard, partner rank) of its best verified edge
        rejected: set[tuple[int, int]] = set()
        counts = {"buckets": 0, "buckets_already_one_cluster": 0, "largest_bucket": 0, "candidate_pairs": 0, "skipped_already_clustered": 0,
                  "verified_pairs": 0, "accepted_pairs": 0, "rejected_pairs": 0}
        for band in range(config.bands):
            for members in band_buckets(shards, ranks_of_shard, band, band_arrays):
                counts["buckets"] += 1
                counts["largest_bucket"] = max(counts["largest_bucket"], len(members))
                root = clusters.find(members[0])
                if all(clusters.find(member) == root for member in members[1:]):
                    counts["buckets_already_one_cluster"] += 1  # an earlier band verified all of it
                    continue
                for a, b in bucket_pairs(members, config.exhaustive_bucket_size):
                    counts["candidate_pairs"] += 1
                    if (a, b) in rejected:
                        continue
                    if clusters.find(a) == clusters.find(b):
                        counts["skipped_already_clustered"] += 1
                        continue
                    counts["verified_pairs"] += 1
                    similarity = shingle_sets.jaccard(a, b)
                    if similarity < config.jaccard_threshold:
                        counts["rejected_pairs"] += 1
                        rejected.add((a, b))
                        continue
                    counts["accepted_pairs"] += 1
                    clusters.union(a, b)
                    for node, partner in ((a, b), (b, a)):
                        if node not in best_match or similarity > best_match[node][0]:
                            best_match[node] = (similarity, partner)
        clustered = sorted(best_match)
        removals: dict[str, Removal] = {}
        cluster_rows: dict[str, list[str]] = {"id": [], "cluster_id": [], "kept_id": []}
        for rank in clustered:
            kept_id = str(ids_by_rank[clusters.find(rank)])
            cluster_rows["id"].append(str(ids_by_rank[rank]))
            cluster_rows["cluster_id"].append(kept_id)
            cluster_rows["kept_id"].append(kept_id)
        for rank in clustered:
            root = clusters.find(rank)
            if root == rank:
                continue
            similarity, partner = best_match[rank]
            kept_id = str(ids_by_rank[root])
            detail = {"cluster_id": kept_id, "kept_id": kept_id, "matched_id": str(ids_by_rank[partner]), "jaccard": similarity}
            removals[str(ids_by_rank[rank])] = Removal(RULE, similarity, config.jaccard_threshold, detail)
        # Roots were found for every member above, so ids of a cluster are adjacent after sorting by (cluster, id).
        clusters_table = pa.table(cluster_rows).sort_by([("cluster_id", "ascending"), ("id", "ascending")])
        atomic_write_parquet(Path(work_dir) / CLUSTERS_FILE, clusters_table)
        finished = time.perf_counter()
        stats = {"documents": len(all_ids), "shingles": int(sum(int(s["offsets"][-1]) for s in shards)), "documents_without_shingles": int(sum(len(s["ids"]) - len(s["with_shingles"]) for s in shards)),
                 **counts, "clusters": len(set(cluster_rows["cluster_id"])), "clustered_documents": len(clustered),
                 "removed": len(removals), "signature_seconds": round(signed - started, 3),
                 "candidate_and_cluster_seconds": round(finished - signed, 3)}
        return write_removals(work_dir, removals, stats, [(CLUSTERS_FILE, clusters_table.num_rows)])
    finally:
        shutil.rmtree(spill_dir, ignore_errors=True)


DEDUP_FUZZY = StageDef(STAGE, VERSION, apply_removals, prepare=find_near_duplicates)


def run_dedup_fuzzy(config: DedupFuzzyConfig, input_dir: Path, out_dir: Path, workers: int | None = None) -> StageManifest:
    return run_stage(DEDUP_FUZZY, config, input_dir, out_dir, workers)


dedup_fuzzy_task = lazy_task(run_dedup_fuzzy, name="dedup_fuzzy", task_run_name="dedup_fuzzy")
