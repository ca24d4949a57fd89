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
the tokenizer shipped as a path and its sha256; the flow host joins the files
in shard order (the same bytes as one sequential pass) and plans from the
per-document counts, about 50 bytes a training document.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from manifests.atomic import atomic_write_parquet, atomic_write_text
from manifests.digest import sha256_file
from manifests.stage_manifest import StageManifest, read_manifest
from tasks.corpus.encoding import encode_to_file, token_dtype
from tasks.dedup.minhash import ChecksumMismatch
from tasks.corpus.split import seeded_rank, split_side_of_shard
from tasks.runner.stage_runner import default_workers, map_shards, run_artifact_stage
from tasks.corpus.tokenizer import EOS_TOKEN, TOKENIZER_FILE, checked_tokenizer, vocab_size_of

STAGE = "mixture"
VERSION = "2"  # 2: the training side's tokens are written once here (train_tokens.bin) and laid out by shards
PLAN_FILE = "plan.parquet"  # id, source, lang, tokens, repeats, offset (into TOKENS_FILE)
TOKENS_FILE = "train_tokens.bin"  # every training document's ids + EOS, in plan order: the shards stage's input
TABLE_FILE = "mixture.json"
UNKNOWN_LANG = "und"
SPILL_DIR = "_tokens"  # under the work directory: each split shard's token file, joined into TOKENS_FILE
COPY_BYTES = 8 << 20  # joining the token files: memory per copy, whatever the corpus


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


def seeded_ranks(ids: list[str], seed: int) -> np.ndarray:
    """Each id's `seeded_rank` as an unsigned 64-bit integer: the same order as its fixed-width hex string."""
    return np.fromiter((int(seeded_rank(seed, doc_id), 16) for doc_id in ids), dtype=np.uint64, count=len(ids))


def repeats_for_group(ranks: np.ndarray, tokens: np.ndarray, target: float, max_epochs: float) -> tuple[np.ndarray, float]:
    """Per-document repeat counts meeting `target` tokens as closely as whole documents allow, capped.

    Every document gets ⌊e⌋ repeats; then, in seeded-rank order, documents get
    one more while the tokens already given one stay below the fraction's share.
    """
    unique = int(tokens.sum())
    epochs = min(target / unique, max_epochs) if unique else 0.0
    full = math.floor(epochs)
    order = np.argsort(ranks, kind="stable")
    taken_before = np.cumsum(tokens[order]) - tokens[order]
    repeats = np.full(len(tokens), full, dtype=np.int32)
    repeats[order[taken_before < (epochs - full) * unique]] += 1
    return repeats, epochs


COUNT_SCHEMA = pa.schema([("id", pa.string()), ("source", pa.string()), ("lang", pa.string()), ("tokens", pa.int64())])


def encode_shard_side(shard_path: str, shard: str, side: str, tokenizer_path: str, tokenizer_sha256: str, out_path: str) -> dict[str, Any]:
    """Task: one split shard's documents of one side ("train" or "validation") tokenised, ids + EOS each, into
    `out_path`; their counts.

    Runs on a worker: the tokenizer arrives as a file path and its sha256 and is
    checked before use. `tokens` counts EOS too (what a document occupies in the stream).
    """
    tokenizer = checked_tokenizer(tokenizer_path, tokenizer_sha256)
    docs = [split_side_of_shard(shard_path, side, ["id", "source", "lang", "text"])]
    tables = [COUNT_SCHEMA.empty_table()]
    partial = f"{out_path}.partial"
    for batch, lengths in encode_to_file(tokenizer, docs, tokenizer.token_to_id(EOS_TOKEN), token_dtype(vocab_size_of(tokenizer)), partial):
        lang = pc.fill_null(batch.column("lang"), UNKNOWN_LANG)
        lang = pc.if_else(pc.equal(lang, ""), UNKNOWN_LANG, lang)
        tables.append(pa.table([batch.column("id"), batch.column("source"), lang, pa.array(lengths, pa.int64())], schema=COUNT_SCHEMA))
    os.replace(partial, out_path)  # a rerun after a dead worker writes the same bytes again
    return {"shard": shard, "path": out_path, "sha256": sha256_file(Path(out_path)), "counts": pa.concat_tables(tables).combine_chunks()}


def encode_split_side(split_dir: Path, side: str, tokenizer_path: Path, tokens_path: Path, workers: int) -> pa.Table:
    """Tokenise every document of one side once, shard by shard as runner tasks; the token files joined in shard
    order into `tokens_path`; the counts. (The training side's file is the stream the shards stage lays out,
    so no document is tokenised twice.)

    The flow host only concatenates files (checking each one's sha256 as it copies) and keeps the counts:
    about 50 bytes a document, no text and no token.
    """
    spill_dir = tokens_path.parent / SPILL_DIR
    spill_dir.mkdir(parents=True, exist_ok=True)
    upstream = read_manifest(split_dir, verify=False)
    try:
        jobs = [(str(upstream.path_of(f)), Path(f.path).stem, side, str(tokenizer_path), sha256_file(tokenizer_path),
                 str(spill_dir / f"{Path(f.path).stem}.tokens")) for f in upstream.files("data")]
        shards = sorted(map_shards(encode_shard_side, jobs, workers, f"tokenising: {side}", [f.rows or 0 for f in upstream.files("data")]),
                        key=lambda result: result["shard"])
        with open(tokens_path, "wb") as joined:
            for shard in shards:
                digest = hashlib.sha256()
                with open(shard["path"], "rb") as part:
                    while chunk := part.read(COPY_BYTES):
                        digest.update(chunk)
                        joined.write(chunk)
                if digest.hexdigest() != shard["sha256"]:
                    raise ChecksumMismatch(f"{shard['path']}: sha256 differs from what its task recorded; nothing was published")
        return pa.concat_tables([COUNT_SCHEMA.empty_table(), *(shard["counts"] for shard in shards)]).combine_chunks()
    finally:
        shutil.rmtree(spill_dir, ignore_errors=True)


def plan_mixture(counts: pa.Table, config: MixtureConfig) -> tuple[pa.Table, dict[str, Any]]:
    """`counts` (id, source, lang, tokens) with a `repeats` column added, and the realised table."""
    source = pc.dictionary_encode(counts.column("source")).combine_chunks()
    lang = pc.dictionary_encode(counts.column("lang")).combine_chunks()
    group_of = source.indices.to_numpy().astype(np.int64) * max(len(lang.dictionary), 1) + lang.indices.to_numpy()
    names = {code: (source.dictionary[code // max(len(lang.dictionary), 1)].as_py(), lang.dictionary[code % max(len(lang.dictionary), 1)].as_py())
             for code in np.unique(group_of).tolist()}
    tokens = counts.column("tokens").to_numpy()
    members = {names[code]: np.flatnonzero(group_of == code) for code in names}
    unique = {g: int(tokens[m].sum()) for g, m in members.items()}
    unique_by_source: dict[str, int] = defaultdict(int)
    for (src, _), u in unique.items():
        unique_by_source[src] += u
    weights = source_weights(dict(unique_by_source), dict(config.weights))
    total = float(config.total_tokens if config.total_tokens is not None else sum(unique.values()))
    targets = group_targets(unique, weights, total, config.temperature_alpha)
    ranks = seeded_ranks(counts.column("id").to_pylist(), config.seed)
    repeats = np.zeros(len(tokens), dtype=np.int32)
    realised: dict[tuple[str, str], dict[str, float]] = {}
    for g in sorted(members):
        m = members[g]
        repeats[m], _ = repeats_for_group(ranks[m], tokens[m], targets[g], config.max_epochs)
        realised[g] = {"target": targets[g], "contributed": int(repeats[m].astype(np.int64) @ tokens[m]),
                       "capped": unique[g] > 0 and targets[g] / unique[g] > config.max_epochs}
    return counts.append_column("repeats", pa.array(repeats, pa.int32())), realised_table(unique, weights, realised, total, config)


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
    counts = encode_split_side(Path(split_dir), "train", read_manifest(tokenizer_dir).directory / TOKENIZER_FILE, work_dir / TOKENS_FILE,
                               workers or default_workers())
    plan, table = plan_mixture(counts, config)
    tokens = plan.column("tokens").to_numpy()
    plan = plan.append_column("offset", pa.array(np.cumsum(tokens) - tokens, pa.int64()))
    atomic_write_parquet(work_dir / PLAN_FILE, plan)
    atomic_write_text(work_dir / TABLE_FILE, json.dumps(table, indent=2, ensure_ascii=False) + "\n")
    return [(PLAN_FILE, plan.num_rows), (TABLE_FILE, len(table["sources"])), (TOKENS_FILE, int(tokens.sum()))], {"mixture": table}


def run_mixture(config: MixtureConfig, split_dir: Path, tokenizer_dir: Path, out_dir: Path, workers: int | None = None) -> StageManifest:
    return run_artifact_stage(STAGE, VERSION, asdict(config), [Path(split_dir), Path(tokenizer_dir)], Path(out_dir),
                              lambda work_dir: build_mixture_files(Path(split_dir), Path(tokenizer_dir), config, work_dir, workers))
