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
"""
from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from prefect import task

from manifests.atomic import atomic_write_parquet, atomic_write_text
from manifests.stage_manifest import StageManifest, read_manifest
from tasks.encoding import encoded_batches
from tasks.split import iter_split_docs, seeded_rank
from tasks.stage_runner import run_artifact_stage
from tasks.tokenizer import TOKENIZER_FILE, load_tokenizer

STAGE = "mixture"
VERSION = "1"
PLAN_FILE = "plan.parquet"
TABLE_FILE = "mixture.json"
UNKNOWN_LANG = "und"


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


def repeats_for_group(docs: list[tuple[str, int]], target: float, max_epochs: float, seed: int) -> tuple[dict[str, int], float]:
    """Per-document repeat counts meeting `target` tokens as closely as whole documents allow, capped."""
    unique = sum(n for _, n in docs)
    epochs = min(target / unique, max_epochs) if unique else 0.0
    full = math.floor(epochs)
    extra_tokens = (epochs - full) * unique
    repeats, taken = {}, 0
    for doc_id, n in sorted(docs, key=lambda d: seeded_rank(seed, d[0])):
        bonus = 1 if taken < extra_tokens else 0
        taken += n * bonus
        repeats[doc_id] = full + bonus
    return repeats, epochs


def count_tokens(split_dir: Path, tokenizer) -> list[dict[str, Any]]:
    """Tokens per training document, EOS included (what it occupies in the stream)."""
    rows = []
    for batch, ids in encoded_batches(tokenizer, iter_split_docs(split_dir, "train", ["id", "source", "lang", "text"])):
        for doc_id, source, lang, doc_ids in zip(batch.column("id").to_pylist(), batch.column("source").to_pylist(), batch.column("lang").to_pylist(), ids):
            rows.append({"id": doc_id, "source": source, "lang": lang or UNKNOWN_LANG, "tokens": len(doc_ids) + 1})
    return rows


def plan_mixture(docs: list[dict[str, Any]], config: MixtureConfig) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Repeat count per document and the realised table (per source and per language)."""
    groups: dict[tuple[str, str], list[tuple[str, int]]] = defaultdict(list)
    for doc in docs:
        groups[(doc["source"], doc["lang"])].append((doc["id"], doc["tokens"]))
    unique = {g: sum(n for _, n in members) for g, members in groups.items()}
    unique_by_source: dict[str, int] = defaultdict(int)
    for (source, _), u in unique.items():
        unique_by_source[source] += u
    weights = source_weights(dict(unique_by_source), dict(config.weights))
    total = float(config.total_tokens if config.total_tokens is not None else sum(unique.values()))
    targets = group_targets(unique, weights, total, config.temperature_alpha)
    repeats: dict[str, int] = {}
    realised: dict[tuple[str, str], dict[str, float]] = {}
    for g in sorted(groups):
        group_repeats, epochs = repeats_for_group(groups[g], targets[g], config.max_epochs, config.seed)
        repeats.update(group_repeats)
        contributed = sum(group_repeats[i] * n for i, n in groups[g])
        realised[g] = {"target": targets[g], "contributed": contributed, "capped": unique[g] > 0 and targets[g] / unique[g] > config.max_epochs}
    plan = [{**doc, "repeats": repeats[doc["id"]]} for doc in docs]
    return plan, realised_table(unique, weights, realised, total, config)


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


def build_mixture_files(split_dir: Path, tokenizer_dir: Path, config: MixtureConfig, work_dir: Path) -> tuple[list[tuple[str, int | None]], dict[str, Any]]:
    tokenizer_manifest = read_manifest(tokenizer_dir)
    tokenizer = load_tokenizer(tokenizer_manifest.directory / TOKENIZER_FILE)
    docs = count_tokens(split_dir, tokenizer)
    plan, table = plan_mixture(docs, config)
    plan_table = pa.Table.from_pylist(plan, schema=pa.schema([("id", pa.string()), ("source", pa.string()), ("lang", pa.string()), ("tokens", pa.int64()), ("repeats", pa.int32())]))
    atomic_write_parquet(work_dir / PLAN_FILE, plan_table)
    atomic_write_text(work_dir / TABLE_FILE, json.dumps(table, indent=2, ensure_ascii=False) + "\n")
    return [(PLAN_FILE, len(plan)), (TABLE_FILE, len(table["sources"]))], {"mixture": table}


def run_mixture(config: MixtureConfig, split_dir: Path, tokenizer_dir: Path, out_dir: Path) -> StageManifest:
    return run_artifact_stage(STAGE, VERSION, asdict(config), [Path(split_dir), Path(tokenizer_dir)], Path(out_dir),
                              lambda work_dir: build_mixture_files(Path(split_dir), Path(tokenizer_dir), config, work_dir))


@task(name="mixture", task_run_name="mixture")
def mixture_task(config: MixtureConfig, split_dir: Path, tokenizer_dir: Path, out_dir: Path) -> StageManifest:
    return run_mixture(config, split_dir, tokenizer_dir, out_dir)
