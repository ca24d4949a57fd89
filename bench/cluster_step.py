"""dedup_fuzzy's cluster step alone (near_dup_links.link_clusters) on a synthetic corpus: wall, CPU and peak RSS.

    python bench/cluster_step.py prepare --docs 200000 --dir /tmp/cluster-bench
    PYTHONPATH=<tree> python bench/cluster_step.py run --dir /tmp/cluster-bench

`prepare` writes what the verification tasks leave: every id range's ids.parquet
and spans.npy, and one reduced linked-edge file per rank partition
(tasks/dedup/near_dup_files.reduce_edges), of a corpus where 40 % of the
documents are near-copies in clusters of 2 to 200 (a random tree plus a few
extra edges each, Jaccard 0.8-1.0 with ties) and one cluster of 5,000. `run`
times link_clusters of whichever tree is on PYTHONPATH (the one-task union-find
before, the range tasks after), inline (workers=1, so the process's peak is
the largest task's), in a fresh process, and prints one JSON line.
"""
from __future__ import annotations

import argparse
import inspect
import json
import pickle
import resource
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from manifests.atomic import atomic_write_parquet
from manifests.digest import sha256_file
from tasks.dedup.minhash import write_checked_array
from tasks.dedup.near_dup_files import CorpusFiles, RankRange, edges_array, range_file, rank_partition, reduce_edges


@dataclass(frozen=True)
class Config:
    jaccard_threshold: float = 0.8


def near_copy_edges(documents: int, rng: np.random.Generator) -> np.ndarray:
    """Edges of clusters over randomly chosen ranks: 40 % of the documents, sizes 2-200 (heavy-tailed) and one of 5,000."""
    members = rng.permutation(documents)[: int(0.4 * documents)]
    sizes = [5000]
    while sum(sizes) < len(members):
        sizes.append(int(min(200, 2 + rng.pareto(1.5) * 2)))
    a_parts, b_parts, at = [], [], 0
    for size in sizes:
        cluster = members[at:at + size]
        at += size
        if len(cluster) < 2:
            continue
        parents = (rng.random(len(cluster) - 1) * np.arange(1, len(cluster))).astype(np.int64)  # a random tree
        extra = rng.integers(0, len(cluster), (len(cluster) // 4, 2))
        a_parts += [cluster[1:], cluster[extra[:, 0]]]
        b_parts += [cluster[parents], cluster[extra[:, 1]]]
    a, b = np.concatenate(a_parts), np.concatenate(b_parts)
    keep = a != b
    low, high = np.minimum(a[keep], b[keep]), np.maximum(a[keep], b[keep])
    codes = np.unique(low * documents + high)
    jaccard = np.where(rng.random(len(codes)) < 0.5, rng.choice([0.8, 0.9, 1.0], len(codes)), rng.uniform(0.8, 1.0, len(codes)))
    return edges_array(codes // documents, codes % documents, jaccard)


def prepare(documents: int, ranges: int, shards: int, directory: Path) -> None:
    rng = np.random.default_rng(0)
    shutil.rmtree(directory, ignore_errors=True)
    spill = directory / "_spill"
    ids = np.char.add(np.char.mod("%012x", np.sort(rng.choice(2**47, documents, replace=False))), "-doc")  # sorted = rank order
    parts = []
    for index in range(ranges):
        first, stop = documents * index // ranges, documents * (index + 1) // ranges
        ids_path = range_file(str(spill), index, "ids.parquet")
        atomic_write_parquet(Path(ids_path), pa.table({"id": pa.array(ids[first:stop].tolist(), pa.string())}))
        spans = np.zeros((stop - first, 3), np.int64)
        spans[:, 0] = rng.integers(0, shards, stop - first)
        spans_sha256 = write_checked_array(Path(range_file(str(spill), index, "spans.npy")), spans)
        parts.append(RankRange(first, stop, sha256_file(Path(ids_path)), spans_sha256, ""))
    files = CorpusFiles(str(spill), documents, 112, (), tuple(parts), tuple(f"part-{s:05d}" for s in range(shards)))
    edges = near_copy_edges(documents, rng)
    partition = rank_partition(edges["a"], documents, ranges)
    linked = []
    for p in range(ranges):
        path = spill / f"linked-{p:05d}.npy"
        linked.append((str(path), write_checked_array(path, reduce_edges(edges[partition == p]))))
    (directory / "inputs.pkl").write_bytes(pickle.dumps((files, linked)))
    print(json.dumps({"documents": documents, "edges": len(edges), "ranges": ranges, "shards": shards}))


def run(directory: Path) -> None:
    from tasks.dedup import near_dup_links

    files, linked = pickle.loads((directory / "inputs.pkl").read_bytes())
    out = directory / "out"
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(directory / "_spill" / "clusters", ignore_errors=True)
    baseline_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    wall, cpu = time.perf_counter(), time.process_time()
    if "spill_dir" in inspect.signature(near_dup_links.link_clusters).parameters:
        context = near_dup_links.link_clusters(files, Config(), linked, str(out), str(directory / "_spill"), 1)
    else:
        context = near_dup_links.link_clusters(files, Config(), linked, str(out))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "peak_rss_mb": round(peak_kb / 1024, 1),
                      "peak_above_start_mb": round((peak_kb - baseline_kb) / 1024, 1), **context.stats,
                      "clusters_sha256": sha256_file(out / "clusters.parquet")[:16],
                      "removal_files": {s: sha[:12] for s, (_, sha, _) in sorted(context.removals.files.items())}}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["prepare", "run"])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/cluster-bench"))
    parser.add_argument("--docs", type=int, default=200_000)
    parser.add_argument("--ranges", type=int, default=4)
    parser.add_argument("--shards", type=int, default=16)
    args = parser.parse_args()
    if args.step == "prepare":
        prepare(args.docs, args.ranges, args.shards, args.dir)
    else:
        run(args.dir)


if __name__ == "__main__":
    main()
