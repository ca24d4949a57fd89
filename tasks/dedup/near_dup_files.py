"""What the near-duplicate pass's tasks share, as files: rank-indexed ranges, partitioned spills, shingle sets by rank.

The pass runs as tasks on whatever workers the runner has (tasks/dedup/lsh_buckets.py,
tasks/dedup/near_dup_links.py), so everything a task needs is a file in the stage's
work directory, written once and opened by the tasks, not an object pickled
into each task. On a multi-machine cluster that directory must be on storage
every worker mounts at the same path.

Under <work>/_spill/, besides the per-shard spills of the signature tasks, one
set of files per id range, written by that range's task (tasks/dedup/id_ranks.py)
and indexed by rank - the range's first rank:
* rNNNNN.ids.parquet — the range's ids in rank order,
* rNNNNN.spans.npy   — per rank: shard index, first and last+1 offset of its shingle hashes,
* rNNNNN.prints.npy  — per rank: the 8-bit signature fingerprints,
each with its sha256 in `CorpusFiles.ranges`, so a reader checks the range it
reads. A partitioned file (band records, candidate pairs, verified edges) is
sorted by partition and carries one sha256 per partition slice, so each reader
checks exactly the bytes it reads, whatever the number of readers.
"""
from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from bisect import bisect_right
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from manifests.atomic import atomic_write_text
from manifests.digest import sha256_file
from tasks.dedup.minhash import UnionFind, check_intermediate, write_checked_array
from tasks.dedup.shingles import jaccard_of_sets, sorted_set
from tasks.dedup.spill_reader import SpillFiles

RECORD = np.dtype([("key", "<u8"), ("band_row", "<u8")])  # a band key and (band << 32 | row in its shard)
RANKED_RECORD = np.dtype([("key", "<u8"), ("band_rank", "<u8")])  # a band key and (band << RANK_BITS | rank of its document)
RANK_BITS = 40  # up to 2^40 documents and 2^24 bands
PAIR = np.dtype([("a", "<i8"), ("b", "<i8")])  # a candidate pair of ranks, a < b
EDGE = np.dtype([("a", "<i8"), ("b", "<i8"), ("jaccard", "<f8")])  # a verified pair at or above the threshold
SHINGLE_SET_CACHE_BYTES = 16 << 20  # sorted shingle sets of recently verified documents kept in memory


@dataclass(frozen=True)
class Slice:
    """Elements [start, stop) of a partitioned spill file and their sha256."""

    path: str
    start: int
    stop: int
    sha256: str


def range_file(directory: str, index: int, part: str) -> str:
    """A file of id range `index` (part: ids.parquet, spans.npy, prints.npy, ranked.npy)."""
    return str(Path(directory) / f"r{index:05d}.{part}")


def shard_file(directory: str, shard: str, part: str) -> str:
    """A spill file of input shard `shard` (part: bands, ranked_bands, shingles)."""
    return str(Path(directory) / f"{shard}.{part}.npy")


def partition_file(directory: str, kind: str, partition: int) -> str:
    """What key partition `partition` wrote for the rank partitions (kind: candidates, edges)."""
    return str(Path(directory) / f"{kind}-{partition:05d}.npy")


@dataclass(frozen=True)
class RankRange:
    """Ranks [first, stop) of one id range and the sha256 of its rank-indexed files."""

    first: int
    stop: int
    ids_sha256: str
    spans_sha256: str
    prints_sha256: str

    def digest(self, part: str) -> str:
        return {"ids.parquet": self.ids_sha256, "spans.npy": self.spans_sha256, "prints.npy": self.prints_sha256}[part]


@dataclass(frozen=True)
class CorpusFiles:
    """The rank-indexed files of one run of the pass (paths follow from names; digests: small enough to hand to every task)."""

    directory: str
    documents: int
    num_hashes: int
    shingle_sha256: tuple[str, ...]  # per input shard, by the shard index in the spans
    ranges: tuple[RankRange, ...]  # ascending, covering ranks [0, documents)
    shard_names: tuple[str, ...] = ()  # input shard names, by the shard index in the spans (a removal is published by shard)

    def shingle_file(self, shard_index: int) -> tuple[str, str]:
        return shard_file(self.directory, self.shard_names[shard_index], "shingles"), self.shingle_sha256[shard_index]

    def range_of(self, rank: int) -> int:
        return bisect_right(self.firsts(), rank) - 1

    def firsts(self) -> list[int]:
        return [r.first for r in self.ranges]

    def range_path(self, index: int, part: str) -> str:
        return range_file(self.directory, index, part)

    def saved(self) -> "CorpusRef":
        """This description as a checked file beside the spill files: what a task is sent instead of O(shards + ranges) values."""
        path = Path(self.directory) / CORPUS_FILE
        atomic_write_text(path, json.dumps(asdict(self), sort_keys=True))
        return CorpusRef(str(path), sha256_file(path))


CORPUS_FILE = "corpus.json"


@dataclass(frozen=True)
class CorpusRef:
    """Where a run's CorpusFiles is stored, and its sha256: a job of the same few hundred bytes whatever the corpus."""

    path: str
    sha256: str

    def load(self) -> CorpusFiles:
        return load_corpus_files(self.path, self.sha256)


@lru_cache(maxsize=4)
def load_corpus_files(path: str, sha256: str) -> CorpusFiles:
    """The stored description, checked against its digest; cached, as every task of a worker reads the same one."""
    fields = json.loads(check_intermediate(path, sha256).read_text())
    return CorpusFiles(fields["directory"], fields["documents"], fields["num_hashes"], tuple(fields["shingle_sha256"]),
                       tuple(RankRange(**r) for r in fields["ranges"]), tuple(fields["shard_names"]))


class RankedArrays:
    """Rows of a rank-indexed array (spans.npy, prints.npy) for any ranks, each range's file checked once, memory-mapped."""

    def __init__(self, files: CorpusFiles, part: str, spill: SpillFiles):
        self.files, self.part, self.spill = files, part, spill
        self.firsts = np.asarray(files.firsts() + [files.documents], np.int64)
        self.maps: dict[int, np.ndarray] = {}

    def of_range(self, index: int) -> np.ndarray:
        if index not in self.maps:
            path = self.files.range_path(index, self.part)
            self.spill.verify(path, self.files.ranges[index].digest(self.part))
            self.maps[index] = np.load(path, mmap_mode="r", allow_pickle=False)
        return self.maps[index]

    def __getitem__(self, ranks: np.ndarray) -> np.ndarray:
        ranks = np.asarray(ranks, np.int64)
        which = np.searchsorted(self.firsts, ranks, side="right") - 1
        out = None
        for index in np.unique(which).tolist():
            chosen = which == index
            rows = self.of_range(index)[ranks[chosen] - self.firsts[index]]
            if out is None:
                out = np.empty((len(ranks), *rows.shape[1:]), rows.dtype)
            out[chosen] = rows
        return out if out is not None else np.empty(0)


def key_partition(keys: np.ndarray, partitions: int) -> np.ndarray:
    """The partition of each band key by hash range: its top 32 bits scaled onto [0, partitions)."""
    return ((keys >> np.uint64(32)) * np.uint64(partitions) >> np.uint64(32)).astype(np.int64)


def rank_partition(ranks: np.ndarray, documents: int, partitions: int) -> np.ndarray:
    """The partition of each rank by range: equal shares of the corpus in id order."""
    return ranks.astype(np.int64) * partitions // max(documents, 1)


def write_partitioned(path: Path, records: np.ndarray, partition_of: np.ndarray, partitions: int) -> list[Slice]:
    """Write `records` sorted by partition (stable) and return one checked slice per partition."""
    order = np.argsort(partition_of, kind="stable")
    records, partition_of = records[order], partition_of[order]
    bounds = np.searchsorted(partition_of, np.arange(partitions + 1)).tolist()
    write_checked_array(Path(path), records)
    return [Slice(str(path), start, stop, hashlib.sha256(records[start:stop].tobytes()).hexdigest())
            for start, stop in zip(bounds, bounds[1:])]


def read_slices(spill: SpillFiles, slices: list[Slice], dtype: np.dtype) -> np.ndarray:
    parts = [spill.read_checked_slice(s.path, s.start, s.stop, s.sha256) for s in slices]
    return np.concatenate(parts) if parts else np.empty(0, dtype)


def edges_array(a: np.ndarray, b: np.ndarray, jaccard: np.ndarray) -> np.ndarray:
    edges = np.empty(len(a), EDGE)
    edges["a"], edges["b"], edges["jaccard"] = a, b, jaccard
    return edges


def best_per_node(edges: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(node, partner, Jaccard, edge index) of every node's best edge: highest Jaccard, ties to the smallest partner rank."""
    nodes = np.concatenate((edges["a"], edges["b"]))
    partners = np.concatenate((edges["b"], edges["a"]))
    similarities = np.concatenate((edges["jaccard"], edges["jaccard"]))
    order = np.lexsort((partners, -similarities, nodes))
    firsts = order[np.concatenate(([True], nodes[order][1:] != nodes[order][:-1]))] if len(order) else order
    return nodes[firsts], partners[firsts], similarities[firsts], firsts % max(len(edges), 1)


def forest_edges(edges: np.ndarray) -> np.ndarray:
    """Indices of edges that form a spanning forest of the graph (enough to know its connected components)."""
    nodes, local = np.unique(np.concatenate((edges["a"], edges["b"])), return_inverse=True)
    clusters = UnionFind(len(nodes))
    union = clusters.union
    count = len(edges)
    firsts, seconds = local[:count].tolist(), local[count:].tolist()
    return np.fromiter((i for i, (a, b) in enumerate(zip(firsts, seconds)) if union(a, b)), dtype=np.int64)


def reduce_edges(edges: np.ndarray) -> np.ndarray:
    """The edges that decide the outcome, sorted by (a, b): a spanning forest plus every node's best edge.

    Clusters depend only on connectivity and a removal row only on its
    document's best edge, so dropping the rest changes nothing, and reducing
    a union of reduced sets gives the same outcome as reducing all edges:
    tasks can reduce what they found before anyone sees it.
    """
    if not len(edges):
        return edges
    keep = np.union1d(best_per_node(edges)[3], forest_edges(edges))
    kept = edges[keep]
    return kept[np.lexsort((kept["b"], kept["a"]))]


class ShingleSets:
    """Sorted unique shingle hashes of a document by rank, read from the checked spill files on demand."""

    def __init__(self, files: CorpusFiles, spill: SpillFiles):
        self.files, self.spill = files, spill
        # a range's spans.npy (24 bytes a document) is read one row per lookup, with pread: a copy of the spans in every
        # bucket and verification task would be 2.4 GB each at 100M documents.
        self.firsts = files.firsts()
        self.spans_paths = [files.range_path(index, "spans.npy") for index in range(len(files.ranges))]  # built once: a lookup is hot
        self.shingle_files = [files.shingle_file(shard) for shard in range(len(files.shard_names))]
        self.cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self.cached_bytes = 0

    def raw(self, rank: int) -> np.ndarray:
        """The document's shingle hashes in text order (repeats included)."""
        index = bisect_right(self.firsts, rank) - 1
        spans_path = self.spans_paths[index]
        self.spill.verify(spans_path, self.files.ranges[index].spans_sha256)
        local = rank - self.firsts[index]
        shard, start, stop = self.spill.read(spans_path, 3 * local, 3 * local + 3).tolist()
        path, sha256 = self.shingle_files[shard]
        self.spill.verify(path, sha256)
        return self.spill.read(path, start, stop)

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

    def identical(self, a: int, b: int, raw_a: np.ndarray | None = None) -> bool:
        """Whether the two documents have the same shingle set (`raw_a`: a's raw hashes when the caller holds them)."""
        raw_a, raw_b = self.raw(a) if raw_a is None else raw_a, self.raw(b)
        if len(raw_a) == len(raw_b) and np.array_equal(raw_a, raw_b):
            return True  # same shingle sequence, same set: skip the sort
        return jaccard_of_sets(self.of(a), self.of(b)) == 1.0

    def jaccards(self, a: int, partners: list[int]) -> np.ndarray:
        """Exact Jaccard of document a with each partner, in one vectorised pass (same values as jaccard_of_sets).

        The partners' sets are concatenated and looked up in a's sorted set
        with one searchsorted: an anchor is checked against all its partners
        without a Python step per shingle or per sort.
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
