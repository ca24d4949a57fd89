"""Mixture: how many times each training document appears in the token stream.

Seed 001 (mixture section): with weights w_s summing to 1 and a budget of D
tokens, source s supplies w_s·D tokens and is used w_s·D/U_s times, U_s being
its unique tokens. Muennighoff et al. (2023): up to ~4 epochs of repeated data
are worth nearly as much as new data, so repetition is capped at `max_epochs`
and the tokens the cap leaves unfilled are reported as a shortfall, never
silently redistributed. Seed 001 (multilingual balance): optional temperature
sampling p_l ∝ q_l^α across languages (α = 0.3 as in mT5).

Work happens per (source, language) group: fractional epochs give every
document ⌊e⌋ repeats plus one more for a seeded prefix of the group's
documents until the fraction's tokens are covered, so the result is
deterministic given the seed and independent of shard layout.

How it runs: one runner task per split shard (process pool, or Dask tasks on
a cluster) tokenises that shard's training documents into its own token file,
the tokenizer shipped as a path and its sha256, and ranks its documents; one
task per shard copies its file into its region of the joined stream, in shard
order (tasks/corpus/token_join.py: the same bytes as one sequential pass, no
token through the host), and the seeded prefixes are found by group and written as one plan part
per split shard by further tasks (tasks/corpus/repeat_plan.py): the host holds
per-group aggregates and block records, never a document.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from manifests.atomic import atomic_write_text
from manifests.digest import sha256_file
from manifests.stage_manifest import StageManifest, read_manifest
from tasks.corpus.encoding import encode_to_file, token_dtype
from tasks.corpus.repeat_plan import (COUNT_SCHEMA, CountBlock, Group, GroupCut, RankedShard, blocks_in_bin, cut_bin, cut_in_bin, prefix_budget,
                                      rank_counts, shard_plan)
from tasks.corpus.split import split_side_of_shard
from tasks.corpus.token_join import join_token_files
from tasks.runner.stage_runner import default_workers, map_shards, run_artifact_stage
from tasks.corpus.tokenizer import EOS_TOKEN, TOKENIZER_FILE, checked_tokenizer, vocab_size_of

STAGE = "mixture"
VERSION = "3"  # 3: the plan is one part per split shard (plan/<shard>.parquet), decided by tasks
PLAN_DIR = "plan"  # one part per split shard, in shard order: id, source, lang, tokens, repeats, offset (into TOKENS_FILE)
TOKENS_FILE = "train_tokens.bin"  # every training document's ids + EOS, in plan order: the shards stage's input
TABLE_FILE = "mixture.json"
UNKNOWN_LANG = "und"
SPILL_DIR = "_tokens"  # under the work directory: each split shard's token file, joined into TOKENS_FILE
RANK_DIR = "_ranked"  # under the work directory: each shard's ranked counts and histogram, while the plan is decided


@dataclass(frozen=True)
class MixtureConfig:
    weights: dict[str, float] = field(default_factory=dict)  # source -> weight; empty = natural proportions
    total_tokens: int | None = None  # D; None = one pass over every unique training token
    max_epochs: float = 4.0  # Muennighoff et al. 2023 (seed 001)
    temperature_alpha: float | None = None  # set (e.g. 0.3, seed 001 / mT5) to rebalance languages
    seed: int = 0


def source_weights(unique_by_source: dict[str, int], weights: dict[str, float]) -> dict[str, float]:
    """Normalised weights; every source in the corpus needs one (0 excludes it) when any are given."""
    total = sum(unique_by_source.values())
    if not weights:
        return {s: (u / total if total else 0.0) for s, u in unique_by_source.items()}
    unknown = sorted(set(weights) - set(unique_by_source))
    missing = sorted(set(unique_by_source) - set(weights))
    if unknown or missing:
        raise ValueError(f"mixture weights: unknown sources (or none of their documents reached training) {unknown}, "
                         f"sources without a weight {missing} (give 0 to exclude)")
    if any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
        raise ValueError(f"mixture weights must be >= 0 with a positive sum, got {weights}")
    given = sum(weights.values())
    return {s: weights[s] / given for s in unique_by_source}


def temperature_shares(tokens_by_lang: dict[str, float], alpha: float) -> dict[str, float]:
    """p_l ∝ q_l^α: α = 1 keeps the natural shares, α -> 0 tends to uniform."""
    total = sum(tokens_by_lang.values())
    powered = {lang: (t / total) ** alpha for lang, t in tokens_by_lang.items() if t > 0}
    norm = sum(powered.values())
    return {lang: powered.get(lang, 0.0) / norm for lang in tokens_by_lang}


def group_targets(unique: dict[tuple[str, str], int], weights: dict[str, float], total_tokens: float, alpha: float | None) -> dict[tuple[str, str], float]:
    """Target tokens per (source, lang): w_s·D split by language inside the source, then optionally re-tempered."""
    by_source: dict[str, int] = defaultdict(int)
    for (source, _), u in unique.items():
        by_source[source] += u
    targets = {g: weights[g[0]] * total_tokens * u / by_source[g[0]] if by_source[g[0]] else 0.0 for g, u in unique.items()}
    if alpha is None:
        return targets
    by_lang: dict[str, float] = defaultdict(float)
    for (_, lang), t in targets.items():
        by_lang[lang] += t
    shares = temperature_shares(by_lang, alpha)
    natural = {lang: t / total_tokens for lang, t in by_lang.items()}
    return {g: t * shares[g[1]] / natural[g[1]] if natural[g[1]] else 0.0 for g, t in targets.items()}




@lru_cache(maxsize=2)
def tokenizer_layout(tokenizer_path: str, tokenizer_sha256: str) -> tuple[Any, int, np.dtype]:
    """The checked tokenizer, its EOS id and the token dtype, once per worker process and tokenizer (its vocabulary, a
    dictionary of every id, is built once, not once per shard task)."""
    tokenizer = checked_tokenizer(tokenizer_path, tokenizer_sha256)
    return tokenizer, tokenizer.token_to_id(EOS_TOKEN), token_dtype(vocab_size_of(tokenizer))


def encode_shard_side(shard_path: str, shard: str, side: str, tokenizer_path: str, tokenizer_sha256: str, out_path: str) -> dict[str, Any]:
    """Task: one split shard's documents of one side ("train" or "validation") tokenised, ids + EOS each, into
    `out_path`; their counts, and their `lang` column as it was read (for a caller in the same task).

    Runs on a worker: the tokenizer arrives as a file path and its sha256 and is
    checked before use. `tokens` counts EOS too (what a document occupies in the stream).
    """
    tokenizer, eos_id, dtype = tokenizer_layout(tokenizer_path, tokenizer_sha256)
    docs = [split_side_of_shard(shard_path, side, ["id", "source", "lang", "text"])]
    tables = [COUNT_SCHEMA.empty_table()]
    langs = []
    partial = f"{out_path}.partial"
    digest = hashlib.sha256()
    for batch, lengths in encode_to_file(tokenizer, docs, eos_id, dtype, partial, digest):
        langs.extend(batch.column("lang").chunks)
        lang = pc.fill_null(batch.column("lang"), UNKNOWN_LANG)
        lang = pc.if_else(pc.equal(lang, ""), UNKNOWN_LANG, lang)
        tables.append(pa.table([batch.column("id"), batch.column("source"), lang, pa.array(lengths, pa.int64())], schema=COUNT_SCHEMA))
    os.replace(partial, out_path)  # a rerun after a dead worker writes the same bytes again
    return {"shard": shard, "path": out_path, "sha256": digest.hexdigest(), "counts": pa.concat_tables(tables).combine_chunks(),
            "langs": pa.chunked_array(langs, pa.string())}


def encode_and_rank_shard(shard_path: str, shard: str, shard_index: int, tokenizer_path: str, tokenizer_sha256: str, out_path: str,
                          seed: int, rank_dir: str) -> dict[str, Any]:
    """Task: one split shard's training documents tokenised (`encode_shard_side`) and ranked (repeat_plan step 1);
    only file paths and per-group aggregates go back."""
    encoded = encode_shard_side(shard_path, shard, "train", tokenizer_path, tokenizer_sha256, out_path)
    return {"shard": shard, "path": encoded["path"], "sha256": encoded["sha256"],
            "ranked": rank_counts(encoded["counts"], shard, shard_index, seed, rank_dir)}


def group_order(ranked: list[RankedShard]) -> list[Group]:
    """Groups in the order of (first appearance of the source, first appearance of the language) over the corpus."""
    sources: dict[str, int] = {}
    langs: dict[str, int] = {}
    for shard in ranked:
        for source in shard.first_seen[0]:
            sources.setdefault(source, len(sources))
        for lang in shard.first_seen[1]:
            langs.setdefault(lang, len(langs))
    groups = {group for shard in ranked for group in shard.groups}
    return sorted(groups, key=lambda g: (sources[g[0]], langs[g[1]]))


def bin_of_group(group: Group, histograms: list[tuple[str, str, int]], budget: float) -> tuple[Group, tuple[int, int]]:
    return group, cut_bin(histograms, budget)


def last_of_group(group: Group, bin_index: int, tokens_before: int, budget: float, blocks: list[CountBlock]) -> tuple[Group, tuple[int, int, int]]:
    return group, cut_in_bin(group, bin_index, tokens_before, budget, blocks)


def plan_training_side(split_dir: Path, tokenizer_path: Path, config: MixtureConfig, work_dir: Path,
                       workers: int) -> tuple[list[tuple[str, int]], dict[str, Any], int, str]:
    """Tokenise, rank and plan the training side (repeat_plan steps 1-4): plan parts [(path under work_dir, rows, sha256)],
    the realised table, the tokens written and the token stream's sha256 (each taken by the task that wrote the file)."""
    spill_dir, rank_dir = work_dir / SPILL_DIR, work_dir / RANK_DIR
    spill_dir.mkdir(parents=True, exist_ok=True)
    rank_dir.mkdir(parents=True, exist_ok=True)
    upstream = read_manifest(split_dir, verify=False)
    files = sorted(upstream.files("data"), key=lambda f: Path(f.path).stem)
    try:
        jobs = [(str(upstream.path_of(f)), Path(f.path).stem, index, str(tokenizer_path), sha256_file(tokenizer_path),
                 str(spill_dir / f"{Path(f.path).stem}.tokens"), config.seed, str(rank_dir)) for index, f in enumerate(files)]
        shards = sorted(map_shards(encode_and_rank_shard, jobs, workers, "tokenising: train", [f.rows or 0 for f in files]),
                        key=lambda result: result["shard"])
        tokens_sha256 = join_token_files(shards, work_dir / TOKENS_FILE, workers)
        parts, table, tokens = plan_ranked([shard["ranked"] for shard in shards], config, work_dir, workers)
        return parts, table, tokens, tokens_sha256
    finally:
        shutil.rmtree(spill_dir, ignore_errors=True)
        shutil.rmtree(rank_dir, ignore_errors=True)


def plan_ranked(ranked: list[RankedShard], config: MixtureConfig, work_dir: Path, workers: int) -> tuple[list[tuple[str, int]], dict[str, Any], int]:
    """repeat_plan steps 2-4 over ranked shards (in shard order): plan parts under work_dir/plan, the realised table, tokens."""
    (work_dir / PLAN_DIR).mkdir(exist_ok=True)
    groups = group_order(ranked)
    unique = {g: sum(shard.groups[g][1] for shard in ranked if g in shard.groups) for g in groups}
    unique_by_source: dict[str, int] = defaultdict(int)
    for (src, _), u in unique.items():
        unique_by_source[src] += u
    weights = source_weights(dict(unique_by_source), dict(config.weights))
    total = float(config.total_tokens if config.total_tokens is not None else sum(unique.values()))
    targets = group_targets(unique, weights, total, config.temperature_alpha)
    budgets = {g: prefix_budget(unique[g], targets[g], config.max_epochs) for g in groups}
    with_prefix = [g for g in groups if budgets[g][2] > 0]
    bin_jobs = [(g, [(*shard.histogram, list(shard.groups).index(g)) for shard in ranked if g in shard.groups], budgets[g][2]) for g in with_prefix]
    bins = dict(map_shards(bin_of_group, bin_jobs, workers, "mixture: rank bins", [len(job[1]) for job in bin_jobs]))
    last_jobs = [(g, bins[g][0], bins[g][1], budgets[g][2], blocks_in_bin([s.blocks for s in ranked], g, bins[g][0])) for g in with_prefix]
    lasts = dict(map_shards(last_of_group, last_jobs, workers, "mixture: prefix ends", [len(job[4]) for job in last_jobs]))
    cuts = {g: GroupCut(budgets[g][1], bins[g][0], lasts[g]) if g in lasts else GroupCut(budgets[g][1]) for g in groups}
    offsets = np.cumsum([0, *(shard.tokens for shard in ranked)]).tolist()
    plan_jobs = [(shard, index, {g: cuts[g] for g in shard.groups}, offsets[index], str(work_dir / PLAN_DIR / f"{shard.shard}.parquet"))
                 for index, shard in enumerate(ranked)]
    planned = list(map_shards(shard_plan, plan_jobs, workers, "mixture: plan", [shard.rows for shard in ranked]))
    contributed: dict[Group, int] = defaultdict(int)
    for _, _, by_group, _ in planned:
        for g, n in by_group.items():
            contributed[g] += n
    realised = {g: {"target": targets[g], "contributed": contributed[g], "capped": unique[g] > 0 and targets[g] / unique[g] > config.max_epochs}
                for g in groups}
    parts = sorted((str(Path(path).relative_to(work_dir)), rows, sha256) for path, rows, _, sha256 in planned)
    return parts, realised_table(unique, weights, realised, total, config), int(offsets[-1])


def plan_parts(manifest: StageManifest) -> list[Path]:
    """The plan parts of a published mixture stage, in shard order (what the shards stage lays out)."""
    return sorted(manifest.directory / output.path for output in manifest.outputs if output.path.startswith(f"{PLAN_DIR}/"))


def realised_table(unique, weights, realised, total, config: MixtureConfig) -> dict[str, Any]:
    def summarise(key_of) -> list[dict[str, Any]]:
        acc: dict[str, dict[str, float]] = defaultdict(lambda: {"unique_tokens": 0, "target_tokens": 0.0, "tokens_contributed": 0, "capped": False})
        for g, u in unique.items():
            row = acc[key_of(g)]
            row["unique_tokens"] += u
            row["target_tokens"] += realised[g]["target"]
            row["tokens_contributed"] += realised[g]["contributed"]
            row["capped"] = row["capped"] or realised[g]["capped"]
        out = []
        for name, row in sorted(acc.items()):
            row["target_tokens"] = round(row["target_tokens"])
            row["epochs"] = round(row["tokens_contributed"] / row["unique_tokens"], 4) if row["unique_tokens"] else 0.0
            row["shortfall_tokens"] = max(0, row["target_tokens"] - row["tokens_contributed"]) if row["capped"] else 0
            out.append({"name": name, **row})
        return out

    sources = summarise(lambda g: g[0])
    for row in sources:
        row["weight"] = round(weights[row["name"]], 6)
    contributed = sum(r["tokens_contributed"] for r in sources)
    return {
        "total_tokens_requested": round(total),
        "tokens_contributed": contributed,
        "shortfall_tokens": sum(r["shortfall_tokens"] for r in sources),
        "max_epochs": config.max_epochs,
        "temperature_alpha": config.temperature_alpha,
        "seed": config.seed,
        "sources": sources,
        "languages": summarise(lambda g: g[1]),
    }


def build_mixture_files(split_dir: Path, tokenizer_dir: Path, config: MixtureConfig, work_dir: Path,
                        workers: int | None = None) -> tuple[list[tuple[str, int | None]], dict[str, Any]]:
    parts, table, tokens, tokens_sha256 = plan_training_side(Path(split_dir), read_manifest(tokenizer_dir).directory / TOKENIZER_FILE,
                                                             config, work_dir, workers or default_workers())
    atomic_write_text(work_dir / TABLE_FILE, json.dumps(table, indent=2, ensure_ascii=False) + "\n")
    return [*parts, (TABLE_FILE, len(table["sources"])), (TOKENS_FILE, tokens, tokens_sha256)], {"mixture": table}


def run_mixture(config: MixtureConfig, split_dir: Path, tokenizer_dir: Path, out_dir: Path, workers: int | None = None) -> StageManifest:
    return run_artifact_stage(STAGE, VERSION, asdict(config), [Path(split_dir), Path(tokenizer_dir)], Path(out_dir),
                              lambda work_dir: build_mixture_files(Path(split_dir), Path(tokenizer_dir), config, work_dir, workers))
