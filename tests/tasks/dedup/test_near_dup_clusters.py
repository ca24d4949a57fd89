"""The cluster step of dedup_fuzzy as range-bounded tasks: the same bytes as the one-task union-find it replaced, and no
task holding more when the corpus grows at a fixed range and shard size (counted: traced heap and Arrow pool bytes)."""
from __future__ import annotations

import json
import pickle
import random
import sys
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tasks.dedup.cluster_tables as cluster_tables
import tasks.dedup.components as components
import tasks.dedup.near_dup_links as near_dup_links
from manifests.atomic import atomic_write_parquet
from manifests.digest import sha256_file
from manifests.schema import dumps_json
from tasks.dedup.minhash import ChecksumMismatch, UnionFind, read_checked_array, write_checked_array
from tasks.dedup.near_dup_files import (EDGE, CorpusFiles, RankedArrays, RankRange, best_per_node, edges_array, range_file, rank_partition,
                                        reduce_edges)
from tasks.dedup.removal_map import RemovalContext, removal_table, write_removal_table
from tasks.dedup.spill_reader import SpillFiles


# ---------------------------------------------------------------- the one-task implementation this replaced (the oracle)

NO_MATCH = -1.0


def oracle_link_clusters(files: CorpusFiles, threshold: float, linked: list[tuple[str, str]], work_dir: str) -> RemovalContext:
    parts = [np.asarray(read_checked_array(Path(path), sha256, mmap=False)) for path, sha256 in linked]
    edges = np.concatenate(parts) if parts else np.empty(0, EDGE)
    clusters = UnionFind(files.documents)
    for a, b in zip(edges["a"].tolist(), edges["b"].tolist()):
        clusters.union(a, b)
    best_similarity = np.full(files.documents, NO_MATCH, dtype=np.float64)
    best_partner = np.zeros(files.documents, dtype=np.int64)
    nodes, partners, similarities, _ = best_per_node(edges)
    best_similarity[nodes], best_partner[nodes] = similarities, partners
    ids = oracle_corpus_ids(files)
    spill = SpillFiles()
    try:
        spans = RankedArrays(files, "spans.npy", spill)

        def shards_of(ranks: np.ndarray) -> pa.Array:
            return pa.array(files.shard_names, pa.string()).take(pa.array(np.asarray(spans[ranks][:, 0] if len(ranks) else [], np.int64)))

        clustered = np.flatnonzero(best_similarity != NO_MATCH)
        roots = np.fromiter((clusters.find(rank) for rank in clustered.tolist()), dtype=np.int64, count=len(clustered))
        member_ids, kept_ids = ids.take(pa.array(clustered)), ids.take(pa.array(roots))
        clusters_table = pa.table({"id": member_ids, "cluster_id": kept_ids, "kept_id": kept_ids}).sort_by(
            [("cluster_id", "ascending"), ("id", "ascending")])
        is_removed = roots != clustered
        removed = clustered[is_removed]
        similarity = best_similarity[removed]
        kept = kept_ids.filter(pa.array(is_removed)).to_pylist()
        matched = ids.take(pa.array(best_partner[removed])).to_pylist()
        details = [dumps_json({"cluster_id": kept_id, "kept_id": kept_id, "matched_id": matched_id, "jaccard": jaccard})
                   for kept_id, matched_id, jaccard in zip(kept, matched, similarity.tolist())]
        removals = removal_table(member_ids.filter(pa.array(is_removed)), shards_of(removed), ["near_duplicate"] * len(removed), similarity,
                                 [threshold] * len(removed), details)
    finally:
        spill.close()
    atomic_write_parquet(Path(work_dir) / "clusters.parquet", clusters_table)
    stats = {"clusters": len(np.unique(roots)), "clustered_documents": clusters_table.num_rows, "removed": removals.num_rows}
    return write_removal_table(Path(work_dir), removals, stats, [("clusters.parquet", clusters_table.num_rows)])


def oracle_corpus_ids(files: CorpusFiles) -> pa.Array:
    return pa.concat_arrays([cluster_tables.range_ids(files, index) for index in range(len(files.ranges))])


# ---------------------------------------------------------------- a corpus's rank-indexed files, written directly

@dataclass(frozen=True)
class Config:
    jaccard_threshold: float = 0.8


ODD_IDS = ['q"uote', "back\\slash", "new\nline", "tab\t", "ünï-ça", "中文", "\x01ctl", "emoji-\U0001f600"]


def corpus_files(directory: Path, documents: int, ranges: int, shards: int, rng: random.Random, empty_range: bool = False,
                 even: bool = False) -> CorpusFiles:
    """ids (some needing JSON escapes) in rank order = UTF-8 byte order, cut into `ranges` id ranges (random or `even`
    sizes); spans naming a shard."""
    raw = {f"{rng.getrandbits(48):012x}-{i}" for i in range(documents - len(ODD_IDS))} | set(ODD_IDS[:documents])
    ids = sorted(raw, key=lambda s: s.encode("utf-8"))
    cuts = sorted(rng.sample(range(1, documents), ranges - 1)) if ranges > 1 else []
    cuts = [documents * i // ranges for i in range(1, ranges)] if even else cuts
    if empty_range and cuts:
        cuts = sorted(cuts + [cuts[0]])[: ranges - 1]
    bounds = [0, *cuts, documents]
    parts = []
    for index, (first, stop) in enumerate(zip(bounds, bounds[1:])):
        ids_path = range_file(str(directory), index, "ids.parquet")
        atomic_write_parquet(Path(ids_path), pa.table({"id": pa.array(ids[first:stop], pa.string())}))
        spans = np.stack([np.array([rng.randrange(shards) for _ in range(stop - first)], np.int64), np.zeros(stop - first, np.int64),
                          np.zeros(stop - first, np.int64)], axis=1).reshape(-1, 3)
        spans_sha256 = write_checked_array(Path(range_file(str(directory), index, "spans.npy")), spans)
        parts.append(RankRange(first, stop, sha256_file(Path(ids_path)), spans_sha256, ""))
    return CorpusFiles(str(directory), documents, 112, (), tuple(parts), tuple(f"part-{s:05d}" for s in range(shards)))


def linked_files(directory: Path, edges: np.ndarray, documents: int, partitions: int) -> list[tuple[str, str]]:
    """Edges as the verification tasks leave them: by the partition of their smaller rank, each reduced, sorted by (a, b)."""
    part = rank_partition(edges["a"], documents, partitions) if len(edges) else np.zeros(0, np.int64)
    linked = []
    for p in range(partitions):
        path = directory / f"linked-{p:05d}.npy"
        linked.append((str(path), write_checked_array(path, reduce_edges(edges[part == p]))))
    return linked


def graph(kind: str, documents: int, rng: random.Random) -> np.ndarray:
    """Edges (a < b, distinct pairs) of a random graph of one shape over ranks [0, documents)."""
    order = list(range(documents))
    rng.shuffle(order)
    pairs: set[tuple[int, int]] = set()
    if kind == "chains":  # long paths through random ranks
        at = 0
        while at < documents * 3 // 4:
            length = rng.randint(2, 60)
            pairs |= {(order[i], order[i + 1]) for i in range(at, min(documents - 1, at + length))}
            at += length + rng.randint(1, 5)
    elif kind == "stars":  # a hub with many leaves, the hub sometimes the largest rank
        at = 0
        while at < documents - 2:
            size = rng.randint(2, 40)
            members = order[at:at + size]
            hub = max(members) if rng.random() < 0.5 else members[0]
            pairs |= {(hub, leaf) for leaf in members if leaf != hub}
            at += size + rng.randint(0, 3)
    elif kind == "dense":  # small clusters with many edges, most documents isolated
        for _ in range(documents // 20):
            members = rng.sample(range(documents), rng.randint(2, 8))
            pairs |= {(x, y) for x in members for y in members if x != y and rng.random() < 0.6}
    elif kind == "one_giant":  # one component across every range
        pairs |= {(order[i], order[rng.randrange(i)]) for i in range(1, documents)}
    pairs = {(min(x, y), max(x, y)) for x, y in pairs if x != y}
    a, b = (np.array(sorted(pairs), np.int64).reshape(-1, 2).T if pairs else (np.zeros(0, np.int64), np.zeros(0, np.int64)))
    ties = [0.8, 0.85, 0.9, 1.0]  # few distinct values: best-edge ties decided by the smallest partner
    jaccard = np.array([rng.choice(ties) if rng.random() < 0.7 else rng.uniform(0.8, 1.0) for _ in range(len(a))])
    if len(jaccard):
        jaccard[:: 97] = 3e-5  # Python writes these with an exponent
    return edges_array(a, b, jaccard)


def stage_bytes(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*.parquet"))}


def run_both(tmp_path: Path, name: str, documents: int, ranges: int, shards: int, kind: str, seed: int, workers: int = 1,
             empty_range: bool = False) -> tuple[RemovalContext, RemovalContext, Path, Path]:
    rng = random.Random(seed)
    spill = tmp_path / name / "_spill"
    files = corpus_files(spill, documents, ranges, shards, rng, empty_range)
    linked = linked_files(spill, graph(kind, documents, rng), documents, rng.randint(1, 5))
    old_dir, new_dir = tmp_path / name / "old", tmp_path / name / "new"
    (tmp_path / name / "inputs.pkl").write_bytes(pickle.dumps((files, linked)))
    old = oracle_link_clusters(files, 0.8, linked, str(old_dir))
    new = near_dup_links.link_clusters(files, Config(), linked, str(new_dir), str(spill), workers)
    return old, new, old_dir, new_dir


def assert_same_outputs(old: RemovalContext, new: RemovalContext, old_dir: Path, new_dir: Path) -> None:
    assert new.stats == old.stats and list(new.stats) == list(old.stats)
    assert new.artifacts() == old.artifacts()
    digests = [{s: (sha, rows) for s, (_, sha, rows) in context.removals.files.items()} for context in (old, new)]
    assert digests[1] == digests[0]
    assert list(new.removals.files) == list(old.removals.files)
    assert stage_bytes(new_dir) == stage_bytes(old_dir)


@pytest.mark.parametrize("kind,documents,ranges,shards,seed", [
    ("chains", 600, 5, 3, 1), ("stars", 500, 7, 4, 2), ("dense", 800, 3, 2, 3), ("one_giant", 300, 6, 5, 4), ("chains", 40, 1, 1, 5),
])
def test_same_bytes_as_the_one_task_union_find(tmp_path, monkeypatch, kind, documents, ranges, shards, seed):
    monkeypatch.setattr(components, "CHUNK", 16)  # many chunks: hooking and compression across chunk bounds
    old, new, old_dir, new_dir = run_both(tmp_path, kind, documents, ranges, shards, kind, seed)
    assert old.stats["removed"] > 0 and old.stats["clusters"] > 0
    assert_same_outputs(old, new, old_dir, new_dir)
    removals = pq.read_table(next((new_dir / "removals").iterdir())).to_pylist()
    assert all(json.loads(row["detail"])["jaccard"] == row["value"] for row in removals)


def test_same_bytes_with_an_empty_range_workers_and_no_edges(tmp_path, monkeypatch):
    monkeypatch.setattr(components, "CHUNK", 7)
    old, new, old_dir, new_dir = run_both(tmp_path, "empty-range", 300, 6, 3, "stars", 8, workers=2, empty_range=True)
    assert_same_outputs(old, new, old_dir, new_dir)
    first = stage_bytes(new_dir)
    files, linked = pickle.loads((tmp_path / "empty-range" / "inputs.pkl").read_bytes())
    again = near_dup_links.link_clusters(files, Config(), linked, str(new_dir), str(tmp_path / "empty-range" / "_spill"), 1)
    assert stage_bytes(new_dir) == first and again.stats == new.stats  # a rerun over what a first run left: the same bytes
    rng = random.Random(9)
    spill = tmp_path / "none" / "_spill"
    files = corpus_files(spill, 50, 3, 2, rng)
    linked = linked_files(spill, edges_array(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)), 50, 2)
    old = oracle_link_clusters(files, 0.8, linked, str(tmp_path / "none" / "old"))
    new = near_dup_links.link_clusters(files, Config(), linked, str(tmp_path / "none" / "new"), str(spill), 1)
    assert_same_outputs(old, new, tmp_path / "none" / "old", tmp_path / "none" / "new")
    assert new.stats == {"clusters": 0, "clustered_documents": 0, "removed": 0} and not new.removals.files


def test_same_bytes_over_several_row_groups_and_blocks(tmp_path, monkeypatch):
    """clusters.parquet written block by block is the file one write of the sorted table makes (row groups of 16,384)."""
    monkeypatch.setattr(cluster_tables, "CLUSTER_BLOCK_ROWS", 16_384)
    monkeypatch.setattr(components, "CHUNK", 5_000)
    old, new, old_dir, new_dir = run_both(tmp_path, "big", 60_000, 4, 3, "chains", 10)
    assert old.stats["clustered_documents"] > 2 * 16_384
    assert pq.ParquetFile(new_dir / "clusters.parquet").metadata.num_row_groups >= 3
    assert_same_outputs(old, new, old_dir, new_dir)


def test_a_corrupt_cluster_file_fails_clearly(tmp_path, monkeypatch):
    real = components.label_components

    def corrupting(files, linked, directory):
        result = real(files, linked, directory)
        path = components.node_file(directory, 0)
        with open(path, "r+b") as handle:
            handle.seek(-8, 2)
            handle.write(b"\x07" * 8)
        return result

    monkeypatch.setattr(near_dup_links, "label_components", corrupting)
    with pytest.raises(ChecksumMismatch, match="clusters-r00000"):
        run_both(tmp_path, "corrupt", 200, 2, 2, "stars", 11)


# ---------------------------------------------------------------- components and the JSON text, on their own

def test_roots_are_the_smallest_rank_of_each_component_in_few_rounds(tmp_path, monkeypatch):
    """A path through ranks in random order, and a zigzag of hooks through every rank, converge in O(log N) rounds,
    every document's root the smallest rank (0)."""
    monkeypatch.setattr(components, "CHUNK", 64)
    rng = np.random.default_rng(0)
    documents = 4096
    order = rng.permutation(documents)
    a, b = np.minimum(order[:-1], order[1:]), np.maximum(order[:-1], order[1:])
    path = tmp_path / "linked.npy"
    linked = [(str(path), write_checked_array(path, edges_array(a, b, np.ones(len(a)))))]
    labels = components.blank_labels(tmp_path / "labels.npy", documents)
    spill = SpillFiles()
    rounds = components.component_roots(labels, spill, linked, tmp_path / "crossing")
    spill.close()
    assert np.all(np.asarray(labels) == 0) and 1 <= rounds <= 2 * np.log2(documents)
    zigzag = np.arange(0, documents - 1)  # 0-1, 2-3 ... then 1-2, 3-4 ...: chains of hooks through every rank
    a, b = np.concatenate((zigzag[::2], zigzag[1::2])), np.concatenate((zigzag[::2], zigzag[1::2])) + 1
    linked = [(str(path), write_checked_array(path, edges_array(a, b, np.ones(len(a)))))]
    labels = components.blank_labels(tmp_path / "labels2.npy", documents)
    spill = SpillFiles()
    assert components.component_roots(labels, spill, linked, tmp_path / "crossing") <= 2 * np.log2(documents)
    spill.close()
    assert np.all(np.asarray(labels) == 0)


def test_streamed_table_slices_are_the_file_write_table_slices_writes(tmp_path):
    from tasks.dedup.table_slices import write_table_slices

    tables = [pa.table({"rank": pa.array(np.arange(n), pa.int64()), "id": pa.array([f"id-{i}" for i in range(n)])}) for n in (3, 0, 70_000, 1)]
    streamed = cluster_tables.write_streamed_slices(tmp_path / "streamed.npy", iter(tables))
    whole = write_table_slices(tmp_path / "whole.npy", tables)
    assert (tmp_path / "streamed.npy").read_bytes() == (tmp_path / "whole.npy").read_bytes()
    assert [(s.start, s.stop, s.sha256) for s in streamed] == [(s.start, s.stop, s.sha256) for s in whole]


def test_json_text_is_what_json_dumps_writes():
    rng = np.random.default_rng(1)
    values = np.concatenate((rng.integers(1, 10**6, 20_000) / 10**6, [1.0, 0.5, 0.8, 1e-4, 9.99e-5, 3e-5, 1e-300, 0.1 + 0.2, 1 / 3]))
    assert cluster_tables.json_floats(values).to_pylist() == [json.dumps(v) for v in values.tolist()]
    strings = ["plain", *ODD_IDS, "", "a\x1fb", "x\x7fy", "\u2028"]
    assert cluster_tables.json_strings(pa.array(strings)).to_pylist() == [json.dumps(s, ensure_ascii=False) for s in strings]


# ---------------------------------------------------------------- what a cluster-step task holds, counted

DOCUMENTS_PER_RANGE = 8000  # and per shard


def counting_map_shards(peaks: dict[str, int], arrow_reads: list[int]) -> Callable:
    """map_shards run inline, recording per label the most bytes one job held: its traced heap peak (numpy, Python)
    plus the largest Arrow table it read (Arrow's own allocations are not traced). Each job runs twice (a rerun gives
    the same result) and the smaller count is kept: a one-off resize of an interpreter table (interned strings) is
    not what the task holds."""

    def held(fn, job) -> tuple[Any, int]:
        arrow_reads.clear()
        tracemalloc.start()
        try:
            result = fn(*job)
            _, heap_peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        return result, heap_peak + max(arrow_reads, default=0)

    def run(fn, jobs, workers, label, sizes):
        for job in jobs:
            (result, first), (again, second) = held(fn, job), held(fn, job)
            assert type(result) is RemovalContext or again == result
            peaks[label] = max(peaks.get(label, 0), min(first, second))
            yield result

    return run


def counted_reads(monkeypatch, arrow_reads: list[int]) -> None:
    """Every Arrow table the cluster tasks read (an id range's ids, table slices; the old task's every id) adds its
    bytes to `arrow_reads`."""
    import tasks.dedup.removal_map as removal_map

    def counting(read: Callable) -> Callable:
        def wrapped(*args):
            table = read(*args)
            arrow_reads.append(table.nbytes)
            return table
        return wrapped

    monkeypatch.setattr(cluster_tables, "range_ids", counting(cluster_tables.range_ids))
    monkeypatch.setattr(cluster_tables, "read_table_slices", counting(cluster_tables.read_table_slices))
    monkeypatch.setattr(removal_map, "read_table_slices", counting(removal_map.read_table_slices))
    monkeypatch.setattr(sys.modules[__name__], "oracle_corpus_ids", counting(oracle_corpus_ids))  # every id, as the old task held


def cluster_inputs(directory: Path, ranges: int) -> tuple[CorpusFiles, list[tuple[str, str]]]:
    """DOCUMENTS_PER_RANGE documents a range and a shard, small near-copy clusters mostly near in id order, a few far."""
    rng = random.Random(ranges)
    documents = DOCUMENTS_PER_RANGE * ranges
    files = corpus_files(directory, documents, ranges, ranges, rng, even=True)
    edges = graph("dense", documents, rng)
    local = edges[np.abs(edges["a"] - edges["b"]) < 3000]
    return files, linked_files(directory, np.concatenate((local, edges[:: 50])), documents, ranges)


def largest_task_bytes(monkeypatch, directory: Path, inputs: tuple[CorpusFiles, list[tuple[str, str]]], old: bool = False) -> dict[str, int]:
    """Per task label, the most bytes one task held running the cluster step (or the one task it replaced) on `inputs`."""
    arrow_reads: list[int] = []
    counted_reads(monkeypatch, arrow_reads)
    files, linked = inputs
    peaks: dict[str, int] = {}
    counted_map = counting_map_shards(peaks, arrow_reads)
    if old:
        list(counted_map(oracle_link_clusters, [(files, 0.8, linked, str(directory / "old"))], 1, "union-find", [1]))
    else:
        monkeypatch.setattr(near_dup_links, "map_shards", counted_map)
        near_dup_links.link_clusters(files, Config(), linked, str(directory / "new"), files.directory, 1)
    return peaks


def test_no_cluster_task_holds_more_when_the_corpus_grows_8x(tmp_path, monkeypatch):
    monkeypatch.setattr(components, "CHUNK", 1024)  # the component task's heap follows its chunk, not N
    monkeypatch.setattr(cluster_tables, "CLUSTER_BLOCK_ROWS", 2048)  # the clusters.parquet writer holds one block
    small_inputs = cluster_inputs(tmp_path / "small" / "_spill", 2)
    large_inputs = cluster_inputs(tmp_path / "large" / "_spill", 16)  # 8× the documents, same range and shard size
    small = largest_task_bytes(monkeypatch, tmp_path / "small", small_inputs)
    large = largest_task_bytes(monkeypatch, tmp_path / "large", large_inputs)
    assert set(small) == set(large) and len(small) == 7
    for label in small:
        assert large[label] <= 1.3 * small[label], (label, small[label], large[label])
    # the same count on the one task it replaced grows with the corpus (8× less a constant ~1 MB: hashing buffers)
    old_small = largest_task_bytes(monkeypatch, tmp_path / "small", small_inputs, old=True)["union-find"]
    old_large = largest_task_bytes(monkeypatch, tmp_path / "large", large_inputs, old=True)["union-find"]
    assert old_large > 2.5 * old_small and old_large > 4 * max(large.values()), (old_small, old_large, large)
