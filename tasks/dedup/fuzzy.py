"""Near-duplicate removal: MinHash-LSH candidates, exact-Jaccard verification, union-find, smallest id kept.

Seed 001, "近似重复和 Jaccard 相似度" through "已发表流程的选择": word 5-gram
shingle sets (character 5-grams for space-less scripts), 112 hashes as 14
bands × 8 rows (FineWeb's choice), candidates verified with the exact Jaccard
of the shingle sets against 0.8, so a false candidate costs verification time
and never a wrong removal; verified pairs are joined with union-find because
near-duplicates chain (A~B, B~C), and each cluster keeps its smallest id.

Every pair of a bucket is a candidate, however large the bucket: a templated
site puts thousands of pages that share a boilerplate block into one bucket,
and a true near-copy may pair with any of them. The pairs are filtered by
MinHash agreement, vectorised, with a margin from the estimator's binomial
spread (tasks/dedup/signature_filter.py), and only survivors are verified exactly.
Members with identical shingle sets are interchangeable (same Jaccard with
everyone else), so a mass-copied page is folded to one member first; a
bucket of 64 or more members then gets the exact Jaccard of all its pairs in
bulk (tasks/dedup/pair_jaccard.py), which has no miss probability at all and is
what makes a templated site affordable. A bucket of 2,048 or more members is
first linked as a star to bucket leaders with verified edges
(tasks/dedup/lsh_buckets.py: ~one comparison a member for a mirrored site,
not m²/2); one with 256 families or more goes on as below. Only a bucket that still has more
than `max_bucket_members` members after folding falls back to pairing each
member with the first and its neighbour; every pair that fallback skips is
counted (`fallback_skipped_pairs`) and logged.

The outcome is defined without any visiting order, so it is the same for any
number of workers and partitions: E is the set of verified pairs (exact
Jaccard ≥ threshold) of all buckets of all bands; clusters are the connected
components of E, each kept by its smallest id; a removed document's `value`
and `matched_id` are its best edge in E: the highest Jaccard, ties broken by
the smallest partner id.

How it runs (every step a task of the runner: process pool by default, Dask
tasks on a cluster; everything they exchange is a file in the stage's work
directory, which must be on shared storage for a multi-machine run):
1. one task per input shard: shingle hashes, signatures, band keys; the band
   records (key, band, row) are spilled sorted by hash range of the key (the
   shuffle), with shingle hashes and the shard's documents sorted by id (a
   sorted run with their spans and fingerprints), each file checksummed;
2. the id order as an external sort (tasks/dedup/id_ranks.py): splitters from
   a by-hash sample of the ids, one task per shard cutting its run at them,
   one task per id range merging its cuts and writing its rank-indexed files
   (tasks/dedup/near_dup_files.py), one task per shard re-keying its band
   records by rank (rank order = id order, so "smallest rank" is "smallest
   id" whatever the shard layout);
3. one task per key range (tasks/dedup/lsh_buckets.py): groups its buckets, yields
   candidate pairs (signature-filtered) and edges verified in bulk;
4. one task per rank range (tasks/dedup/near_dup_links.py): each candidate pair
   verified once, whichever bands proposed it;
5. the clusters (tasks/dedup/components.py, tasks/dedup/cluster_tables.py):
   one task per rank partition re-spilling each node's best edge by id range;
   one task for the components (vectorised hooking over streamed edges, the
   labels a memory-mapped file) that also places every clustered document's
   row of clusters.parquet; per id range, tasks asking and answering the ids
   of roots and partners and writing the removal and cluster rows; one task
   writing clusters.parquet block by block, one per shard its removal file;
6. each shard drops the removed ids.
Key, id and rank ranges number PARTITIONS_PER_WORKER × the workers (on Dask:
the scheduler's worker count), or one per PARTITION_BYTES of band records when
that is more (tasks/stage_runner.partition_count).

Memory bounds, for S shards of n documents and P ranges (N = S × n):
* the flow host holds no per-document data and no (shard, range) table:
  a few paths, digests and counts per shard (O(S), ~500 bytes each), one
  count per range and SAMPLES_PER_RANGE × P sampled ids. Every slice of a
  partitioned spill file stays in its writer's slice index
  (tasks/dedup/slice_index.py), and a task is sent the corpus description's
  path and digest (near_dup_files.CorpusRef), so no job or result grows with
  the number of partitions but the id sample, one count per range from each
  cutting task and one digest per range from the component task
  (tests/tasks/dedup/test_fuzzy_host_traffic.py counts what it exchanges);
* a signature, cut or re-key task holds one shard: O(n) (about 14 × 16 bytes
  of band records and num_hashes + 40 bytes of sorted run a document, plus its
  shingle hashes);
* an id-range task holds its range, about 1.6 N / P documents at most, a few
  hundred bytes each; a key or rank task its range's records and pairs
  (about PARTITION_BYTES), reading fingerprints and spans by rank from files;
* the cluster step's tasks: a best-edge task holds one linked-edge file (a
  rank range's reduced edges); the component task CHUNK edges or documents
  at a time (tens of MB), its labels on disk, memory-mapped (two int64
  files of N entries while it runs, and its output of (root, row) per
  rank: 32 GB at 1B documents at the peak, 16 GB left); an id-range task its range's ids, best edges and the ids it asks
  of others (at most two a clustered document) and, answering, one asking
  range's ranks at a time; the clusters.parquet writer one block of
  CLUSTER_BLOCK_ROWS rows (about 1M, whole row groups); a shard's removal
  task that shard's removals. Every reader of a partitioned file also reads
  one 48-byte index entry per writer (counted in
  tests/tasks/dedup/test_near_dup_clusters.py: no task holds more with 8×
  the documents at one range and shard size).

Rule `near_duplicate`, value = exact Jaccard with the matched document,
detail {"cluster_id", "kept_id", "matched_id", "jaccard"}; the cluster is
named after its keeper. Artifact `clusters.parquet`: id, cluster_id, kept_id
for every member of every cluster of two or more documents.
"""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from manifests.stage_manifest import StageManifest
from tasks.dedup.id_ranks import (SortedRun, bound_id_ranges, choose_splitters, rank_band_records, rank_id_range, sample_probability,
                                  SHARDS_FILE, SPLITTERS_FILE, save_list, write_sorted_run)
from tasks.dedup.lsh_buckets import fallback_pairs, link_key_partition  # noqa: F401 (fallback_pairs re-exported)
from tasks.dedup.minhash import HashFamily, band_keys, signatures, write_checked_array
from tasks.dedup.near_dup_files import RECORD, CorpusFiles, key_partition, shard_file, write_partitioned
from tasks.dedup.near_dup_links import link_clusters, verify_rank_partition
from tasks.dedup.removal_map import RemovalContext, apply_removals, map_upstream_shards
from tasks.dedup.byte_tokens import batch_token_hashes
from tasks.dedup.shingles import TokenHashCache, ngram_hashes_by_document
from tasks.dedup.signature_filter import fingerprints, minimum_agreement
from tasks.dedup.slice_index import write_slice_index
from tasks.runner.stage_runner import StageDef, map_shards, partition_count, run_stage

STAGE = "dedup_fuzzy"
VERSION = "3"  # 3: outcome defined order-free (all verified pairs; best edge = highest Jaccard, then smallest id); partitioned tasks
SPILL_DIR = "_spill"
SIGNATURE_BATCH_ROWS = 1024  # documents hashed at once in a worker: bounds its scratch memory whatever the shard size (and keeps
# two workers' byte masks in cache: 1024 rows took ~100 ms a shard against ~113 at 2048, both workers running)


@dataclass(frozen=True)
class DedupFuzzyConfig:
    shingle_size: int = 5  # seed: word 5-grams
    bands: int = 14  # FineWeb: 112 hashes = 14 bands × 8 rows
    rows: int = 8
    jaccard_threshold: float = 0.8  # seed: exact Jaccard ≥ 0.8 on the shingle sets
    seed: int = 1  # of the hash family; fixed so re-runs find the same candidates
    fold_numbers: bool = True  # "page 3" and "page 4" shingle alike
    miss_probability: float = 1e-6  # chance that the signature filter drops a pair whose Jaccard is exactly the threshold
    max_bucket_members: int = 50_000  # beyond this (after folding identical sets) a bucket is linked first/neighbour only, audited

    @property
    def num_hashes(self) -> int:
        return self.bands * self.rows


def check_config(config: DedupFuzzyConfig) -> None:
    if config.shingle_size < 1 or config.bands < 1 or config.rows < 1:
        raise ValueError(f"dedup_fuzzy: shingle_size, bands and rows must be ≥ 1, got {config}")
    if not 0.0 < config.jaccard_threshold <= 1.0:
        raise ValueError(f"dedup_fuzzy: jaccard_threshold must be in (0, 1], got {config.jaccard_threshold}")
    if not 0.0 < config.miss_probability < 1.0:
        raise ValueError(f"dedup_fuzzy: miss_probability must be in (0, 1), got {config.miss_probability}")
    if config.max_bucket_members < 2:
        raise ValueError(f"dedup_fuzzy: max_bucket_members must be ≥ 2, got {config.max_bucket_members}")


def signature_shard(shard_path: str, shard: str, config: DedupFuzzyConfig, spill_dir: str, partitions: int,
                    sample_probability: float = 1.0) -> dict[str, Any]:
    """Task: shingle hashes, MinHash signatures and band records of one shard, spilled with checksums; its sorted id run.

    Texts are hashed SIGNATURE_BATCH_ROWS documents at a time (a document's
    hashes do not depend on its neighbours), so the worker's scratch memory
    follows the batch, not the shard. Band records are written sorted by the
    hash range of their key, one checked slice per key partition: the map
    side of the shuffle. The shard's documents are also written sorted by id
    (tasks/dedup/id_ranks.py); what comes back is paths, digests, counts and a
    sample of about `sample_probability` of the ids, never a per-document array.
    """
    parquet = pq.ParquetFile(shard_path, pre_buffer=False)
    cache = TokenHashCache()
    family = HashFamily.from_seed(config.num_hashes, config.seed)
    hash_parts, offset_parts, key_parts = [np.zeros(0, np.uint64)], [np.zeros(1, np.int64)], [np.zeros((config.bands, 0), np.uint64)]
    print_parts, row_parts = [np.zeros((0, config.num_hashes), np.uint8)], [np.zeros(0, np.uint64)]
    rows_before = 0
    for batch in parquet.iter_batches(SIGNATURE_BATCH_ROWS, columns=["text"], use_threads=False):
        hashes, offsets = ngram_hashes_by_document(*batch_token_hashes(batch.column("text"), config.fold_numbers, cache), config.shingle_size)
        has_shingles = np.diff(offsets) > 0  # empty sets never enter buckets
        signature_rows = signatures(hashes, offsets, family)[has_shingles]
        key_parts.append(band_keys(signature_rows, config.bands, config.rows))
        print_parts.append(fingerprints(signature_rows))
        row_parts.append((np.flatnonzero(has_shingles) + rows_before).astype(np.uint64))
        offset_parts.append(offsets[1:] + offset_parts[-1][-1])
        hash_parts.append(hashes)
        rows_before += batch.num_rows
    keys_BN, rows = np.concatenate(key_parts, axis=1), np.concatenate(row_parts)
    records = np.empty(keys_BN.size, RECORD)
    records["key"] = keys_BN.ravel()
    records["band_row"] = (np.repeat(np.arange(config.bands, dtype=np.uint64), len(rows)) << np.uint64(32)) | np.tile(rows, config.bands)
    offsets = np.concatenate(offset_parts)
    bands_file, shingles_file = shard_file(spill_dir, shard, "bands"), shard_file(spill_dir, shard, "shingles")
    run = write_sorted_run(SortedRun(spill_dir, shard), parquet.read(columns=["id"]).column("id").combine_chunks(), offsets, rows,
                           np.concatenate(print_parts), sample_probability)
    return {
        "shard": shard,
        "documents": rows_before,
        "shingles": int(offsets[-1]),
        "without_shingles": rows_before - len(rows),
        "bands_file": bands_file,
        "band_partitions": write_slice_index(bands_file, write_partitioned(Path(bands_file), records, key_partition(records["key"], partitions),
                                                                           partitions)),
        "shingles_sha256": write_checked_array(Path(shingles_file), np.concatenate(hash_parts)),
        **run,
    }


def rank_corpus(shards: list[dict[str, Any]], ranges: int, spill_dir: Path, num_hashes: int, workers: int) -> CorpusFiles:
    """The id order as runner tasks (tasks/dedup/id_ranks.py): cut every run at the splitters, rank each id range, re-key the
    band records by rank. Every (shard, range) slice stays in its writer's index file; the host adds up one count per range."""
    splitters = choose_splitters([sample for s in shards for sample in s.pop("samples")], ranges)
    sizes = np.zeros(len(splitters) + 1, np.int64)
    splitters_file = save_list(str(spill_dir), SPLITTERS_FILE, splitters)
    for cut in map_shards(bound_id_ranges, [(s["run"], s["run_sha256"], splitters_file) for s in shards], workers, "id ranges",
                          [s["documents"] for s in shards]):
        sizes += cut["counts"]
    firsts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
    shards_file = save_list(str(spill_dir), SHARDS_FILE, [s["shard"] for s in shards])  # the runs are named by their shard
    jobs = [(str(spill_dir), r, int(firsts[r]), shards_file, num_hashes) for r in range(len(sizes))]
    ranked = sorted(map_shards(rank_id_range, jobs, workers, "ranks", sizes.tolist()), key=lambda r: r["range"].first)
    rekey = [(str(spill_dir), index, s["shard"], s["documents"], len(ranked)) for index, s in enumerate(shards)]
    for _ in map_shards(rank_band_records, rekey, workers, "rank bands", [s["documents"] for s in shards]):
        pass
    return CorpusFiles(str(spill_dir), int(sizes.sum()), num_hashes, tuple(s["shingles_sha256"] for s in shards),
                       tuple(r["range"] for r in ranked), tuple(s["shard"] for s in shards))


def find_near_duplicates(upstream: StageManifest, config: DedupFuzzyConfig, work_dir: Path, workers: int = 1) -> RemovalContext:
    """Global pass: signatures per shard, the id order by range, buckets per key range, verification per rank range,
    components and outputs by range; all runner tasks, the host holding paths, digests, splitters and counts."""
    check_config(config)
    started = time.perf_counter()
    spill_dir = Path(work_dir) / SPILL_DIR
    # Ranges follow the band records the shuffle moves (16 bytes a band a document), and the workers.
    documents = sum(f.rows or 0 for f in upstream.files("data"))
    partitions = partition_count(workers, documents * config.bands * RECORD.itemsize)
    try:
        shards = map_upstream_shards(signature_shard, upstream, (config, str(spill_dir), partitions, sample_probability(documents, partitions)),
                                     workers, "minhash")
        signed = time.perf_counter()
        files = rank_corpus(shards, partitions, spill_dir, config.num_hashes, workers)
        corpus = files.saved()  # what each bucket and verification task is sent: a path and a digest
        shingles = sum(s["shingles"] for s in shards)
        without_shingles = sum(s["without_shingles"] for s in shards)
        band_partitions = sum(s["band_partitions"] for s in shards)
        del shards
        key_jobs = [(corpus, config, p, partitions, str(spill_dir)) for p in range(partitions)]
        sizes = [max(band_partitions // partitions, 1)] * partitions  # progress weights: partitions are equal hash ranges
        bucketed = sorted(map_shards(link_key_partition, key_jobs, workers, "lsh buckets", sizes), key=lambda r: r["partition"])
        rank_jobs = [(corpus, config, r, partitions, str(spill_dir), str(spill_dir / f"linked-{r:05d}.npy")) for r in range(partitions)]
        pair_sizes = [max(sum(b["written_pairs"] for b in bucketed) // partitions, 1)] * partitions
        verified = sorted(map_shards(verify_rank_partition, rank_jobs, workers, "verify pairs", pair_sizes), key=lambda r: r["partition"])
        linked = [(v["path"], v["sha256"]) for v in verified]
        context = link_clusters(files, config, linked, str(work_dir), str(spill_dir), workers)
        finished = time.perf_counter()
        counts = summed_counts([b["counts"] for b in bucketed] + [v["counts"] for v in verified])
        context.stats = {"documents": files.documents, "shingles": shingles, "documents_without_shingles": without_shingles,
                         "partitions": partitions, "minimum_agreement": minimum_agreement(config.num_hashes, config.jaccard_threshold,
                                                                                          config.miss_probability), **counts, **context.stats,
                         "signature_seconds": round(signed - started, 3), "candidate_and_cluster_seconds": round(finished - signed, 3)}
        return context
    finally:
        shutil.rmtree(spill_dir, ignore_errors=True)


def summed_counts(parts: list[dict[str, int]]) -> dict[str, int]:
    """Work counters of all tasks added up (largest_bucket: the largest)."""
    total: dict[str, int] = {}
    for part in parts:
        for name, value in part.items():
            total[name] = max(total.get(name, 0), value) if name == "largest_bucket" else total.get(name, 0) + value
    return total


DEDUP_FUZZY = StageDef(STAGE, VERSION, apply_removals, prepare=find_near_duplicates)


def run_dedup_fuzzy(config: DedupFuzzyConfig, input_dir: Path, out_dir: Path, workers: int | None = None) -> StageManifest:
    return run_stage(DEDUP_FUZZY, config, input_dir, out_dir, workers)
