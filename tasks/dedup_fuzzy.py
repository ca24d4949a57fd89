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
spread (tasks/signature_filter.py), and only survivors are verified exactly.
Members with identical shingle sets are interchangeable (same Jaccard with
everyone else), so a mass-copied page is folded to one member first; a
bucket of 64 or more members then gets the exact Jaccard of all its pairs in
bulk (tasks/pair_jaccard.py: a matrix product over the shingles most members
share, pair counts over the rest), which has no miss probability at all and
is what makes a templated site affordable. Only a bucket that still has more than `max_bucket_members` members after folding
falls back to pairing each member with the first and its neighbour; every
pair that fallback skips is counted (`fallback_skipped_pairs`) and logged.

How it runs:
1. workers, one shard each: shingle hashes, signatures, band keys; band keys,
   8-bit signature fingerprints and shingle hashes are spilled to .npy files
   whose sha256 the worker records;
2. the global pass ranks all ids (rank order = id order, so "smallest rank"
   is "smallest id" whatever the shard layout), then for one band at a time
   reads that band's (key, rank) records from every shard's spill file, sorts
   them, walks the runs of equal keys, and verifies candidate pairs, reading
   the two documents' shingle hashes from the spill files on demand;
3. each shard drops the removed ids.

Memory of the global pass, per document: 148 bytes plus the id's length held
throughout as numpy/Arrow arrays (the ids, rank -> position, shingle offsets,
band ranks, union-find parents, best verified match, 112 fingerprint bytes), and ~42 bytes more for
the one band being sorted; besides that, a shingle-set cache of at most
SHINGLE_SET_CACHE_BYTES, the rejected pairs, and the output tables (per
clustered document). No Python object per document, no spill file mapped.
Rule `near_duplicate`, value = exact Jaccard with the matched document,
detail {"cluster_id", "kept_id", "matched_id", "jaccard"}; the cluster is
named after its keeper. Artifact `clusters.parquet`: id, cluster_id, kept_id
for every member of every cluster of two or more documents.
"""
from __future__ import annotations

import logging
import shutil
import time
from bisect import bisect_right
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from manifests.atomic import atomic_write_parquet
from manifests.schema import dumps_json
from manifests.stage_manifest import StageManifest
from tasks.lazy_task import lazy_task
from tasks.minhash import HashFamily, UnionFind, band_keys, signatures, write_checked_array
from tasks.pair_jaccard import pair_blocks
from tasks.removal_map import RemovalContext, apply_removals, map_upstream_shards, removal_table, write_removal_table
from tasks.shingles import TokenHashCache, batch_ngram_hashes, jaccard_of_sets, sorted_set, tokens
from tasks.signature_filter import agreeing_pairs, fingerprints, minimum_agreement
from tasks.spill_reader import SpillFiles
from tasks.stage_runner import StageDef, counted, report_progress, run_stage

STAGE = "dedup_fuzzy"
VERSION = "2"  # 2: every pair of a bucket is a candidate (signature-filtered), not first/neighbour beyond 64 members
RULE = "near_duplicate"
CLUSTERS_FILE = "clusters.parquet"
SPILL_DIR = "_spill"
SIGNATURE_BATCH_ROWS = 2048  # documents hashed at once in a worker: bounds its scratch memory whatever the shard size
SHINGLE_SET_CACHE_BYTES = 16 << 20  # sorted shingle sets of recently verified documents kept in memory
NO_MATCH = -1.0  # best_similarity of a document without a verified edge (accepted Jaccards are > 0)
FOLD_IDENTICAL_FROM = 64  # buckets from this size fold identical shingle sets, then count all pairs' Jaccards in bulk
log = logging.getLogger(__name__)


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


def fallback_pairs(members: list[int]) -> Iterator[tuple[int, int]]:
    """The audited fallback for a pathological bucket: each member with the first and with its successor.

    2m pairs instead of m²/2; it still links a bucket of true copies into one
    cluster, but it can miss a near-copy pair elsewhere in the bucket, which
    is why its use is counted and logged.
    """
    first = members[0]
    for previous, member in zip(members, members[1:]):
        yield first, member
        if previous != first:
            yield previous, member


def signature_shard(shard_path: str, shard: str, config: DedupFuzzyConfig, spill_dir: str) -> dict[str, Any]:
    """Worker: shingle hashes, MinHash signatures and band keys of one shard, spilled with checksums.

    Texts are hashed SIGNATURE_BATCH_ROWS documents at a time (a document's
    hashes do not depend on its neighbours), so the worker's scratch memory
    follows the batch, not the shard; only the shingle hashes and band keys
    of the whole shard are held, to be spilled.
    """
    parquet = pq.ParquetFile(shard_path, pre_buffer=False)
    cache = TokenHashCache()
    family = HashFamily.from_seed(config.num_hashes, config.seed)
    hash_parts, offset_parts, key_parts = [np.zeros(0, np.uint64)], [np.zeros(1, np.int64)], [np.zeros((config.bands, 0), np.uint64)]
    print_parts = [np.zeros((0, config.num_hashes), np.uint8)]
    for batch in parquet.iter_batches(SIGNATURE_BATCH_ROWS, columns=["text"], use_threads=False):
        texts = batch.column("text").to_pylist()
        hashes, offsets = batch_ngram_hashes((tokens(text, config.fold_numbers) for text in texts), config.shingle_size, cache)
        signature_rows = signatures(hashes, offsets, family)
        signature_rows = signature_rows[np.diff(offsets) > 0]  # empty sets never enter buckets
        key_parts.append(band_keys(signature_rows, config.bands, config.rows))
        print_parts.append(fingerprints(signature_rows))
        offset_parts.append(offsets[1:] + offset_parts[-1][-1])
        hash_parts.append(hashes)
    spill = Path(spill_dir)
    bands_file, shingles_file, prints_file = spill / f"{shard}.bands.npy", spill / f"{shard}.shingles.npy", spill / f"{shard}.prints.npy"
    return {
        "shard": shard,
        "ids": parquet.read(columns=["id"]).column("id").combine_chunks(),  # Arrow, not a list of str: ~15 bytes an id
        "offsets": np.concatenate(offset_parts),
        "bands_file": str(bands_file),
        "bands_sha256": write_checked_array(bands_file, np.concatenate(key_parts, axis=1)),
        "shingles_file": str(shingles_file),
        "shingles_sha256": write_checked_array(shingles_file, np.concatenate(hash_parts)),
        "prints_file": str(prints_file),
        "prints_sha256": write_checked_array(prints_file, np.concatenate(print_parts)),
    }


class Ranks:
    """Id order of the whole corpus: rank r is the r-th smallest id; positions count documents shard after shard."""

    def __init__(self, ids_by_shard: list[pa.Array]):
        self.ids = pa.concat_arrays(ids_by_shard) if ids_by_shard else pa.array([], pa.string())
        self.bounds = [0, *np.cumsum([len(ids) for ids in ids_by_shard]).tolist()]
        count = len(self.ids)
        self.dtype = np.int32 if count < 2**31 else np.int64
        # Arrow's sort is stable and orders UTF-8 by bytes, which is code-point order, the order of Python's min().
        self.position_of_rank = np.asarray(pc.sort_indices(self.ids)).astype(self.dtype)

    def __len__(self) -> int:
        return len(self.ids)

    def by_shard(self) -> list[np.ndarray]:
        """The rank of every document, one array per shard in row order (built on demand: the pass keeps only parts)."""
        rank_of_position = np.empty(len(self), dtype=self.dtype)
        rank_of_position[self.position_of_rank] = np.arange(len(self), dtype=self.dtype)
        return [rank_of_position[start:stop] for start, stop in zip(self.bounds, self.bounds[1:])]

    def shard_and_row(self, rank: int) -> tuple[int, int]:
        position = int(self.position_of_rank[rank])
        shard_index = bisect_right(self.bounds, position) - 1
        return shard_index, position - self.bounds[shard_index]

    def ids_of(self, ranks: np.ndarray) -> pa.Array:
        return self.ids.take(self.position_of_rank[ranks])


class ShingleSets:
    """Sorted unique shingle hashes of a document by rank, read from the verified spill files on demand."""

    def __init__(self, shards: list[dict[str, Any]], ranks: Ranks, spill: SpillFiles):
        self.shards, self.ranks, self.spill = shards, ranks, spill
        self.cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self.cached_bytes = 0

    def raw(self, rank: int) -> np.ndarray:
        """The document's shingle hashes in text order (repeats included)."""
        shard_index, row = self.ranks.shard_and_row(rank)
        shard = self.shards[shard_index]
        self.spill.verify(shard["shingles_file"], shard["shingles_sha256"])
        offsets = shard["offsets"]
        return self.spill.read(shard["shingles_file"], int(offsets[row]), int(offsets[row + 1]))

    def of(self, rank: int) -> np.ndarray:
        """The document's shingle set, sorted (recently used ones cached, up to SHINGLE_SET_CACHE_BYTES)."""
        if rank in self.cache:
            self.cache.move_to_end(rank)
            return self.cache[rank]
        shingle_set = sorted_set(self.raw(rank))
        self.cache[rank] = shingle_set
        self.cached_bytes += shingle_set.nbytes
        while self.cached_bytes > SHINGLE_SET_CACHE_BYTES and len(self.cache) > 1:
            self.cached_bytes -= self.cache.popitem(last=False)[1].nbytes
        return shingle_set

    def jaccard(self, a: int, b: int) -> float:
        raw_a, raw_b = self.raw(a), self.raw(b)
        if len(raw_a) == len(raw_b) and np.array_equal(raw_a, raw_b):
            return 1.0  # same shingle sequence, same set: skip the sort
        return jaccard_of_sets(self.of(a), self.of(b))

    def jaccards(self, a: int, partners: list[int]) -> np.ndarray:
        """Exact Jaccard of document a with each partner, in one vectorised pass (same values as jaccard_of_sets).

        The partners' sets are concatenated and looked up in a's sorted set
        with one searchsorted: a bucket's anchor is checked against all its
        surviving partners without a Python step per shingle or per sort.
        """
        set_a = self.of(a)
        sets = [self.of(b) for b in partners]
        sizes = np.fromiter((len(s) for s in sets), dtype=np.int64, count=len(sets))
        values = np.concatenate(sets)
        found = np.minimum(np.searchsorted(set_a, values), len(set_a) - 1)
        hits = (set_a[found] == values).astype(np.int64)
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        shared = np.add.reduceat(hits, starts) if len(values) else np.zeros(len(sets), np.int64)
        return shared / (len(set_a) + sizes - shared)


def band_buckets(shards: list[dict[str, Any]], band_ranks: list[np.ndarray], band: int, spill: SpillFiles) -> Iterator[list[int]]:
    """Buckets (ranks in ascending order, ≥ 2 members) of one band, by sorting its (key, rank) records read from disk."""
    keys = np.concatenate([spill.row(shard["bands_file"], band) for shard in shards] or [np.empty(0, np.uint64)])
    ranks = np.concatenate(band_ranks or [np.empty(0, np.int64)])
    if len(keys) < 2:
        return
    order = np.lexsort((ranks, keys))
    keys, ranks = keys[order], ranks[order]
    del order
    starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    sizes = np.diff(np.append(starts, len(keys)))
    for start, size in zip(starts[sizes > 1].tolist(), sizes[sizes > 1].tolist()):
        yield ranks[start: start + size].tolist()


@dataclass
class Links:
    """What verification found: clusters, and for every document its best verified edge (Jaccard, partner rank)."""

    clusters: UnionFind
    best_similarity: np.ndarray  # float64, NO_MATCH where the document has no verified edge
    best_partner: np.ndarray
    counts: dict[str, int]


class Linker:
    """Verifies candidate pairs bucket by bucket and joins the accepted ones (union-find, best edge per document)."""

    def __init__(self, config: DedupFuzzyConfig, shingle_sets: ShingleSets, prints_NK: np.ndarray, documents: int, rank_dtype: np.dtype):
        self.config, self.shingle_sets, self.prints_NK = config, shingle_sets, prints_NK
        self.minimum = minimum_agreement(config.num_hashes, config.jaccard_threshold, config.miss_probability)
        self.clusters = UnionFind(documents)
        self.best_similarity = np.full(documents, NO_MATCH, dtype=np.float64)
        self.best_partner = np.zeros(documents, dtype=rank_dtype)
        self.rejected: set[int] = set()  # a * documents + b of pairs verified below the threshold (another band may propose them)
        self.documents = documents
        self.counts = {"buckets": 0, "buckets_already_one_cluster": 0, "largest_bucket": 0, "candidate_pairs": 0,
                       "below_signature_agreement": 0, "folded_identical": 0, "bulk_exact_pairs": 0, "skipped_already_clustered": 0,
                       "verified_pairs": 0, "accepted_pairs": 0, "rejected_pairs": 0, "minimum_agreement": self.minimum,
                       "fallback_buckets": 0, "fallback_skipped_pairs": 0}

    def link_bucket(self, members: list[int]) -> None:
        counts = self.counts
        counts["buckets"] += 1
        counts["largest_bucket"] = max(counts["largest_bucket"], len(members))
        find = self.clusters.find
        root = find(members[0])
        if all(find(member) == root for member in members[1:]):
            counts["buckets_already_one_cluster"] += 1  # an earlier band verified all of it
            return
        if len(members) >= FOLD_IDENTICAL_FROM:
            members = self.fold_identical(members)
        pair_count = len(members) * (len(members) - 1) // 2
        counts["candidate_pairs"] += pair_count
        if len(members) > self.config.max_bucket_members:
            self.link_fallback(members, pair_count)
            return
        if len(members) >= FOLD_IDENTICAL_FROM and self.link_exactly(members, pair_count):
            return
        firsts, seconds = agreeing_pairs(self.prints_NK[members], self.minimum)
        counts["below_signature_agreement"] += pair_count - len(firsts)
        if not len(firsts):
            return
        # One anchor at a time (ascending), with all its surviving later partners verified in one pass.
        member_array = np.asarray(members, dtype=np.int64)
        anchors_at = np.flatnonzero(np.concatenate(([True], firsts[1:] != firsts[:-1], [True])))
        for begin, end in zip(anchors_at[:-1].tolist(), anchors_at[1:].tolist()):
            anchor = members[int(firsts[begin])]
            self.verify(anchor, member_array[seconds[begin:end]].tolist())

    def link_exactly(self, members: list[int], pair_count: int) -> bool:
        """Exact Jaccard of every pair of a large bucket in bulk (tasks/pair_jaccard.py); False if too dense for that."""
        blocks = pair_blocks([self.shingle_sets.of(member) for member in members], self.config.jaccard_threshold)
        if blocks is None:
            return False
        self.counts["bulk_exact_pairs"] += pair_count
        find = self.clusters.find
        for firsts, seconds, similarities in blocks:  # streamed: a near-identical mass yields ~m²/2 pairs
            for first, second, similarity in zip(firsts.tolist(), seconds.tolist(), similarities.tolist()):
                a, b = members[first], members[second]
                if find(a) == find(b):
                    self.counts["skipped_already_clustered"] += 1
                else:
                    self.accept(a, b, similarity)
        return True

    def verify(self, anchor: int, partners: list[int]) -> None:
        counts, find, rejected, documents = self.counts, self.clusters.find, self.rejected, self.documents
        anchor_root = find(anchor)
        todo = []
        for partner in partners:
            if anchor * documents + partner in rejected:
                continue
            if find(partner) == anchor_root:
                counts["skipped_already_clustered"] += 1
                continue
            todo.append(partner)
        if not todo:
            return
        counts["verified_pairs"] += len(todo)
        for partner, similarity in zip(todo, self.shingle_sets.jaccards(anchor, todo).tolist()):
            if similarity < self.config.jaccard_threshold:
                counts["rejected_pairs"] += 1
                rejected.add(anchor * documents + partner)
            else:
                self.accept(anchor, partner, similarity)

    def accept(self, a: int, b: int, similarity: float) -> None:
        self.counts["accepted_pairs"] += 1
        self.clusters.union(a, b)
        for node, partner in ((a, b), (b, a)):
            if similarity > self.best_similarity[node]:
                self.best_similarity[node], self.best_partner[node] = similarity, partner

    def fold_identical(self, members: list[int]) -> list[int]:
        """Join members whose shingle set equals an earlier member's and keep only the first of each such group.

        Equal sets have equal Jaccard with every third document, so dropping
        the later ones from the all-pairs comparison loses no pair. Equal
        fingerprints only propose a group; the sets themselves are compared.
        """
        prints = np.ascontiguousarray(self.prints_NK[members])
        _, group_of = np.unique(prints.view(np.dtype((np.void, prints.shape[1]))).ravel(), return_inverse=True)
        first_of_group: dict[int, int] = {}
        kept: list[int] = []
        for member, group in zip(members, group_of.tolist()):
            first = first_of_group.setdefault(group, member)
            if first != member and self.shingle_sets.jaccard(first, member) == 1.0:
                self.counts["folded_identical"] += 1
                if self.clusters.find(first) != self.clusters.find(member):
                    self.counts["verified_pairs"] += 1
                    self.accept(first, member, 1.0)
                continue
            kept.append(member)
        return kept

    def link_fallback(self, members: list[int], pair_count: int) -> None:
        verified = 0
        for a, b in fallback_pairs(members):
            verified += 1
            self.verify(a, [b])
        self.counts["fallback_buckets"] += 1
        self.counts["fallback_skipped_pairs"] += pair_count - verified
        log.warning("dedup_fuzzy: a bucket of %d distinct members exceeds max_bucket_members=%d; linked first/neighbour only, "
                    "%d pairs not compared (counted in the manifest as fallback_skipped_pairs)",
                    len(members), self.config.max_bucket_members, pair_count - verified)

    def links(self) -> Links:
        return Links(self.clusters, self.best_similarity, self.best_partner, self.counts)


def link_near_duplicates(config: DedupFuzzyConfig, buckets_by_band: Iterator[Iterator[list[int]]], shingle_sets: ShingleSets,
                         prints_NK: np.ndarray, documents: int, rank_dtype: np.dtype) -> Links:
    """Verify every candidate pair of every band's buckets and join the accepted ones."""
    linker = Linker(config, shingle_sets, prints_NK, documents, rank_dtype)
    for buckets in buckets_by_band:
        for members in buckets:
            linker.link_bucket(members)
    return linker.links()


def fingerprints_by_rank(shards: list[dict[str, Any]], band_ranks: list[np.ndarray], num_hashes: int, documents: int,
                         spill: SpillFiles) -> np.ndarray:
    """Every document's 8-bit signature fingerprints, row = rank (rows of documents without shingles stay zero, unused)."""
    prints_NK = np.zeros((documents, num_hashes), dtype=np.uint8)
    for shard, ranks in zip(shards, band_ranks):
        spill.verify(shard["prints_file"], shard["prints_sha256"])
        prints_NK[ranks] = spill.read(shard["prints_file"], 0, len(ranks) * num_hashes).reshape(len(ranks), num_hashes)
    return prints_NK


def cluster_outputs(links: Links, ranks: Ranks, threshold: float) -> tuple[pa.Table, pa.Table, int]:
    """(clusters table, removal table, number of clusters) from the verified links, as Arrow columns."""
    clustered = np.flatnonzero(links.best_similarity != NO_MATCH)  # ascending ranks: id order
    roots = np.fromiter((links.clusters.find(rank) for rank in clustered.tolist()), dtype=np.int64, count=len(clustered))
    member_ids, kept_ids = ranks.ids_of(clustered), ranks.ids_of(roots)
    # Roots were found for every member above, so ids of a cluster are adjacent after sorting by (cluster, id).
    clusters_table = pa.table({"id": member_ids, "cluster_id": kept_ids, "kept_id": kept_ids}).sort_by(
        [("cluster_id", "ascending"), ("id", "ascending")])
    is_removed = roots != clustered
    removed = clustered[is_removed]
    similarity = links.best_similarity[removed]
    kept = kept_ids.filter(pa.array(is_removed)).to_pylist()
    matched = ranks.ids_of(links.best_partner[removed]).to_pylist()
    details = [dumps_json({"cluster_id": kept_id, "kept_id": kept_id, "matched_id": matched_id, "jaccard": jaccard})
               for kept_id, matched_id, jaccard in zip(kept, matched, similarity.tolist())]
    removals = removal_table(member_ids.filter(pa.array(is_removed)), [RULE] * len(removed), similarity,
                             [threshold] * len(removed), details)
    return clusters_table, removals, len(np.unique(roots))


def find_near_duplicates(upstream: StageManifest, config: DedupFuzzyConfig, work_dir: Path, workers: int = 1) -> RemovalContext:
    """Global pass: signatures per shard in parallel, band-by-band candidates, verification, union-find."""
    check_config(config)
    started = time.perf_counter()
    spill_dir = Path(work_dir) / SPILL_DIR
    spill = SpillFiles()
    try:
        shards = map_upstream_shards(signature_shard, upstream, (config, str(spill_dir)), workers, "minhash")
        signed = time.perf_counter()
        for shard in shards:
            spill.verify(shard["bands_file"], shard["bands_sha256"])
        ranks = Ranks([shard.pop("ids") for shard in shards])  # popped: the ids are held once, concatenated
        band_ranks = [shard_ranks[np.diff(shard["offsets"]) > 0] for shard_ranks, shard in zip(ranks.by_shard(), shards)]
        buckets_by_band = (band_buckets(shards, band_ranks, band, spill) for band in counted("candidate bands", range(config.bands), config.bands))
        prints_NK = fingerprints_by_rank(shards, band_ranks, config.num_hashes, len(ranks), spill)
        links = link_near_duplicates(config, buckets_by_band, ShingleSets(shards, ranks, spill), prints_NK, len(ranks), ranks.dtype)
        report_progress("clusters")
        clusters_table, removals, cluster_count = cluster_outputs(links, ranks, config.jaccard_threshold)
        atomic_write_parquet(Path(work_dir) / CLUSTERS_FILE, clusters_table)
        finished = time.perf_counter()
        stats = {"documents": len(ranks), "shingles": int(sum(int(s["offsets"][-1]) for s in shards)),
                 "documents_without_shingles": len(ranks) - sum(len(r) for r in band_ranks),
                 **links.counts, "clusters": cluster_count, "clustered_documents": clusters_table.num_rows,
                 "removed": removals.num_rows, "signature_seconds": round(signed - started, 3),
                 "candidate_and_cluster_seconds": round(finished - signed, 3)}
        return write_removal_table(work_dir, removals, stats, [(CLUSTERS_FILE, clusters_table.num_rows)])
    finally:
        spill.close()
        shutil.rmtree(spill_dir, ignore_errors=True)


DEDUP_FUZZY = StageDef(STAGE, VERSION, apply_removals, prepare=find_near_duplicates)


def run_dedup_fuzzy(config: DedupFuzzyConfig, input_dir: Path, out_dir: Path, workers: int | None = None) -> StageManifest:
    return run_stage(DEDUP_FUZZY, config, input_dir, out_dir, workers)


dedup_fuzzy_task = lazy_task(run_dedup_fuzzy, name="dedup_fuzzy", task_run_name="dedup_fuzzy")
