"""One key partition of the near-duplicate pass: group its LSH buckets and turn each into candidate pairs or verified edges.

A task of the runner (process pool or Dask), one per hash range of the band
keys. Every (band, key) lives in exactly one partition, so each bucket is
seen whole by one task, and what a bucket yields depends only on its members:
* a bucket of FOLD_IDENTICAL_FROM members or more first folds members whose
  shingle set equals an earlier member's (edge at Jaccard 1.0 to that member),
  then gets the exact Jaccard of all its pairs in bulk (tasks/dedup/pair_jaccard.py)
  — verified edges;
* a smaller bucket (or one too dense for bulk) yields the pairs whose 8-bit
  signature fingerprints agree enough (tasks/dedup/signature_filter.py) — candidates,
  verified later, once per pair, by the task that owns the pair's smaller rank
  (tasks/dedup/near_dup_links.py): a true near-copy collides in several bands and
  would otherwise be verified in each; the two-member buckets (most of them) are
  filtered together, one fingerprint read for all (`BucketLinker.link_pairs`);
* a bucket of STAR_FROM members or more (after folding) is first linked as a
  star: members in rank order, each compared with the bucket's leaders so far
  (fingerprints first, then the exact Jaccard of those that agree), joined by a
  verified edge to every leader it matches, or becoming a leader itself. A mass
  of near-identical pages (a mirrored site) is then ~m comparisons, not m²/2.
  A member that matches two leaders links their families, as all pairs would, and
  a new leader meets every earlier member once; two non-leaders of two leaders'
  families that match only each other would not be linked, which is why the
  star is kept for buckets that are one family or a few: once STAR_LEADERS
  leaders exist the bucket is not such a mass (a templated site's pages are all
  below the threshold with each other), the star stops, its edges stay, and the
  bucket goes through the paths below;
* a bucket still larger than `max_bucket_members` after folding, or one whose
  agreeing candidate pairs would exceed MAX_BUCKET_CANDIDATES (many families of
  near-copies that the star gave up on and bulk Jaccard refused), yields only
  each member's pairs with the first member and with its neighbour (audited:
  the skipped pairs are counted), so no bucket sends more than a bounded
  number of pairs to verification.
Outputs are two files sorted by the rank partition of the pair's smaller rank
(candidates; edges reduced to what decides the outcome, tasks/dedup/near_dup_files.py),
one checked slice per rank partition, found through the file's slice index
(tasks/dedup/slice_index.py): the host passes no slice at all.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from tasks.dedup.near_dup_files import (EDGE, PAIR, RANK_BITS, RANKED_RECORD, CorpusFiles, CorpusRef, RankedArrays, ShingleSets, edges_array,
                                        partition_file, rank_partition, read_slices, reduce_edges, shard_file, write_partitioned)
from tasks.dedup.pair_jaccard import pair_blocks
from tasks.dedup.signature_filter import agreeing_pairs, minimum_agreement
from tasks.dedup.slice_index import indexed_slice, write_slice_index
from tasks.dedup.spill_reader import SpillFiles

FOLD_IDENTICAL_FROM = 64  # buckets from this size fold identical shingle sets, then count all pairs' Jaccards in bulk
STAR_FROM = 2048  # buckets from this size (after folding) are first linked as a star to leaders
STAR_LEADERS = 256  # leaders beyond which a bucket is not a near-identical mass: the star stops
MAX_BUCKET_CANDIDATES = 1 << 24  # candidate pairs one bucket may yield (256 MB as int64 pairs); beyond, the audited fallback
EDGE_BUFFER = 1 << 20  # edges held before they are reduced (a near-identical mass yields ~m²/2 of them)
log = logging.getLogger(__name__)


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


def bucket_bounds(records: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ranks sorted by (band, key, rank), each bucket's start in them, its size); `records`: RANKED_RECORD."""
    bands = records["band_rank"] >> np.uint64(RANK_BITS)
    ranks = (records["band_rank"] & np.uint64((1 << RANK_BITS) - 1)).astype(np.int64)
    order = np.lexsort((ranks, records["key"], bands))
    keys, bands, ranks = records["key"][order], bands[order], ranks[order]
    if len(keys) < 2:
        return ranks, np.zeros(0, np.int64), np.zeros(0, np.int64)
    starts = np.flatnonzero(np.concatenate(([True], (keys[1:] != keys[:-1]) | (bands[1:] != bands[:-1]))))
    return ranks, starts, np.diff(np.append(starts, len(keys)))


class BucketLinker:
    """What one partition's buckets yield: candidate pairs to verify and edges already verified."""

    def __init__(self, config: Any, files: CorpusFiles, spill: SpillFiles):
        self.config, self.documents = config, files.documents
        self.prints_NK = RankedArrays(files, "prints.npy", spill)  # fingerprints of any ranks, read from their range's file
        self.shingle_sets = ShingleSets(files, spill)
        self.minimum = minimum_agreement(config.num_hashes, config.jaccard_threshold, config.miss_probability)
        self.identical_to: dict[int, int] = {}  # member -> first of its identical group, once checked in this task
        self.candidate_codes: list[np.ndarray] = []  # a * documents + b
        self.edges: list[np.ndarray] = []
        self.buffered_edges = 0
        self.counts = {"buckets": 0, "largest_bucket": 0, "candidate_pairs": 0, "below_signature_agreement": 0,
                       "folded_identical": 0, "bulk_exact_pairs": 0, "fallback_buckets": 0, "fallback_skipped_pairs": 0,
                       "star_buckets": 0, "star_compared_pairs": 0, "star_abandoned": 0}

    def link_bucket(self, members: np.ndarray) -> None:
        counts = self.counts
        counts["buckets"] += 1
        counts["largest_bucket"] = max(counts["largest_bucket"], len(members))
        if len(members) >= FOLD_IDENTICAL_FROM:
            members = self.fold_identical(members)
        pair_count = len(members) * (len(members) - 1) // 2
        counts["candidate_pairs"] += pair_count
        if len(members) < 2:
            return
        if len(members) >= STAR_FROM and self.link_star(members):
            return
        if len(members) > self.config.max_bucket_members:
            self.link_fallback(members, pair_count, f"it exceeds max_bucket_members={self.config.max_bucket_members}")
            return
        if len(members) >= FOLD_IDENTICAL_FROM and self.link_exactly(members, pair_count):
            return
        agreeing = agreeing_pairs(self.prints_NK[members], self.minimum, limit=MAX_BUCKET_CANDIDATES)
        if agreeing is None:
            self.link_fallback(members, pair_count, f"its agreeing pairs exceed {MAX_BUCKET_CANDIDATES:,}")
            return
        firsts, seconds = agreeing
        counts["below_signature_agreement"] += pair_count - len(firsts)
        self.add_candidates(members[firsts], members[seconds])

    def link_pairs(self, firsts: np.ndarray, seconds: np.ndarray) -> None:
        """Every bucket of exactly two members at once (most buckets): what `link_bucket` does for each, vectorised."""
        if not len(firsts):
            return
        counts = self.counts
        counts["buckets"] += len(firsts)
        counts["largest_bucket"] = max(counts["largest_bucket"], 2)
        counts["candidate_pairs"] += len(firsts)
        agree = np.count_nonzero(self.prints_NK[firsts] == self.prints_NK[seconds], axis=1) >= self.minimum
        counts["below_signature_agreement"] += len(firsts) - int(agree.sum())
        self.add_candidates(firsts[agree], seconds[agree])

    def fold_identical(self, members: np.ndarray) -> np.ndarray:
        """Join members whose shingle set equals an earlier member's and keep only the first of each such group.

        Equal sets have equal Jaccard with every third document, so dropping
        the later ones from the all-pairs comparison loses no pair. Equal
        fingerprints only propose a group; the sets themselves are compared,
        once per task (identical documents share every band's bucket).
        """
        prints = np.ascontiguousarray(self.prints_NK[members])
        _, group_of = np.unique(prints.view(np.dtype((np.void, prints.shape[1]))).ravel(), return_inverse=True)
        first_of_group: dict[int, int] = {}
        raw_of_first: dict[int, np.ndarray] = {}  # read once per group, compared with every later member
        kept, folded = [], []
        for member, group in zip(members.tolist(), group_of.ravel().tolist()):
            first = first_of_group.setdefault(group, member)
            if first != member:
                if self.identical_to.get(member) == first:
                    continue  # checked in another band's bucket: its edge is already out
                if group not in raw_of_first:
                    raw_of_first[group] = self.shingle_sets.raw(first)
                if self.shingle_sets.identical(first, member, raw_of_first[group]):
                    self.identical_to[member] = first
                    folded.append((first, member))
                    continue
            kept.append(member)
        if folded:
            self.counts["folded_identical"] += len(folded)
            pairs = np.asarray(folded, dtype=np.int64)
            self.add_edges(pairs[:, 0], pairs[:, 1], np.ones(len(pairs)))
        return np.asarray(kept, dtype=np.int64)

    def link_star(self, members: np.ndarray) -> bool:
        """Link a dense bucket to leaders with verified edges (see the module docstring); False if it has too many families.

        Pairs compared (`star_compared_pairs`): each member with the leaders whose fingerprints agree enough with it, and
        each new leader with the earlier members that agree with it: at most (leaders + 1) per member, ~1 in a mirror."""
        prints = np.ascontiguousarray(self.prints_NK[members])
        leaders: list[int] = []  # positions in `members`
        firsts, seconds, similarities = [], [], []
        compared, abandoned = 0, False
        for position in range(len(members)):
            matched = False
            if leaders:
                ahead = np.asarray(leaders)
                agreeing = ahead[np.count_nonzero(prints[ahead] == prints[position], axis=1) >= self.minimum]
                if not len(agreeing) or not self._star_edges(members, position, agreeing, firsts, seconds, similarities):
                    # no leader matches: it will lead, so it meets every earlier member once (an earlier near-copy of it
                    # that joined another leader is linked here)
                    earlier = np.arange(position)
                    earlier = earlier[np.count_nonzero(prints[:position] == prints[position], axis=1) >= self.minimum]
                    compared += len(earlier)
                    if len(earlier):
                        self._star_edges(members, position, earlier, firsts, seconds, similarities)
                else:
                    matched = True
                compared += len(agreeing)
            if not matched:
                if len(leaders) >= STAR_LEADERS:
                    abandoned = True
                    break
                leaders.append(position)
        self.counts["star_abandoned" if abandoned else "star_buckets"] += 1
        self.counts["star_compared_pairs"] += compared
        if firsts:  # verified either way: they stay when the bucket goes on to the other paths
            self.add_edges(np.concatenate(firsts), np.concatenate(seconds), np.concatenate(similarities))
        return not abandoned

    def _star_edges(self, members: np.ndarray, position: int, partners: np.ndarray, firsts: list, seconds: list, similarities: list) -> bool:
        """Verified edges from members[position] to those `partners` (positions, all before it) at the threshold; whether any."""
        jaccard = self.shingle_sets.jaccards(int(members[position]), members[partners].tolist())
        hit = jaccard >= self.config.jaccard_threshold
        if hit.any():
            firsts.append(members[partners[hit]])
            seconds.append(np.full(int(hit.sum()), members[position], np.int64))
            similarities.append(jaccard[hit])
        return bool(hit.any())

    def link_exactly(self, members: np.ndarray, pair_count: int) -> bool:
        """Exact Jaccard of every pair of a large bucket in bulk (tasks/dedup/pair_jaccard.py); False if too dense for that."""
        blocks = pair_blocks([self.shingle_sets.of(member) for member in members.tolist()], self.config.jaccard_threshold)
        if blocks is None:
            return False
        self.counts["bulk_exact_pairs"] += pair_count
        for firsts, seconds, similarities in blocks:  # streamed: a near-identical mass yields ~m²/2 pairs
            self.add_edges(members[firsts], members[seconds], similarities)
        return True

    def link_fallback(self, members: np.ndarray, pair_count: int, reason: str) -> None:
        pairs = np.asarray(list(fallback_pairs(members.tolist())), dtype=np.int64)
        self.add_candidates(pairs[:, 0], pairs[:, 1])
        self.counts["fallback_buckets"] += 1
        self.counts["fallback_skipped_pairs"] += pair_count - len(pairs)
        log.warning("dedup_fuzzy: a bucket of %d distinct members: %s; linked first/neighbour only, "
                    "%d pairs not compared (counted in the manifest as fallback_skipped_pairs)",
                    len(members), reason, pair_count - len(pairs))

    def add_candidates(self, firsts: np.ndarray, seconds: np.ndarray) -> None:
        if len(firsts):
            self.candidate_codes.append(firsts.astype(np.int64) * self.documents + seconds)

    def add_edges(self, firsts: np.ndarray, seconds: np.ndarray, similarities: np.ndarray) -> None:
        if not len(firsts):
            return
        self.edges.append(edges_array(firsts, seconds, similarities))
        self.buffered_edges += len(firsts)
        if self.buffered_edges > EDGE_BUFFER:
            self.edges = [reduce_edges(np.concatenate(self.edges))]
            self.buffered_edges = len(self.edges[0])

    def candidate_pairs(self) -> np.ndarray:
        codes = np.unique(np.concatenate(self.candidate_codes)) if self.candidate_codes else np.zeros(0, np.int64)
        pairs = np.empty(len(codes), PAIR)
        pairs["a"], pairs["b"] = codes // self.documents, codes % self.documents
        return pairs

    def verified_edges(self) -> np.ndarray:
        return reduce_edges(np.concatenate(self.edges)) if self.edges else np.empty(0, EDGE)


def link_key_partition(corpus: CorpusRef, config: Any, partition: int, partitions: int, out_dir: str) -> dict[str, Any]:
    """Task: the buckets of one key partition -> candidate pairs and verified edges, sliced by rank partition.

    Its band records are entry `partition` of every shard's ranked-band index; what it writes is indexed the same
    way, one entry per rank partition, so it returns only counts whatever the number of shards and partitions.
    """
    files = corpus.load()
    spill = SpillFiles()
    try:
        records = [indexed_slice(spill, shard_file(files.directory, shard, "ranked_bands"), partition) for shard in files.shard_names]
        linker = BucketLinker(config, files, spill)
        ranks, starts, sizes = bucket_bounds(read_slices(spill, records, RANKED_RECORD))
        pairs = starts[sizes == 2]
        linker.link_pairs(ranks[pairs], ranks[pairs + 1])
        for start, size in zip(starts[sizes > 2].tolist(), sizes[sizes > 2].tolist()):
            linker.link_bucket(ranks[start: start + size])
        candidates, edges = linker.candidate_pairs(), linker.verified_edges()
        for kind, written in (("candidates", candidates), ("edges", edges)):
            path = partition_file(out_dir, kind, partition)
            write_slice_index(path, write_partitioned(Path(path), written, rank_partition(written["a"], files.documents, partitions),
                                                      partitions))
        return {"partition": partition, "written_pairs": len(candidates), "counts": linker.counts}
    finally:
        spill.close()
