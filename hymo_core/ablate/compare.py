"""Paired differences of each variant against the base: over held-out documents and suite items, across seeds.

Every variant is measured on the same held-out documents and the same suite items as the base, with
the same seeds, so each seed gives one *pair* of runs. The improvement I (base - variant bits per
byte; variant - base accuracy) is computed per seed and on the seed-mean of each unit's difference:

* bits per byte is byte-weighted (total bits over total bytes, as heldout.py's groups are), so its
  item standard error is the ratio estimator's: se = sqrt(n/(n-1) * sum_i (u_i - I b_i)^2) / sum_i b_i,
  u_i the document's bit difference, b_i its bytes;
* accuracy is the mean of per-item differences (each -1, 0 or 1 per seed), se = sd / sqrt(n)
  (hymo_core.eval.paired.paired_difference, as `hymo eval`'s paired checkpoints);
* the seed spread is the standard deviation of the per-seed improvements; its error of the mean
  (sd / sqrt(S)) is added in quadrature to the item error. The two overlap (each seed's pair also
  carries item noise), so the sum is a conservative standard error. Its degrees of freedom
  (`effective_df`, Welch-Satterthwaite) choose the rule's t quantile: with 2 seeds and the seed
  spread dominant they are near 1.

Each verdict is stated with the proxies' training tokens (`token_budget`): it is a claim at that budget.
"""
from __future__ import annotations

import math
import statistics
from typing import Any

from hymo_core.eval.metrics import PICKS
from hymo_core.eval.paired import paired_difference

SUITE_PICK = "accuracy_per_char"  # lm-eval acc_norm: the convention the suite's headline numbers use


def suite_item_scores(tasks: dict[str, Any]) -> dict[str, int]:
    """`task/item id` -> 1 when the item was answered right (multiple-choice tasks' per-item picks)."""
    key = PICKS[SUITE_PICK]
    return {f"{task}/{row['id']}": int(row[key] == row["answer"]) for task, result in tasks.items()
            for row in result.get("per_item", []) if key in row}


def _seed_spread(per_seed: list[float]) -> tuple[float, float]:
    sd = statistics.stdev(per_seed) if len(per_seed) >= 2 else 0.0
    return sd, sd / math.sqrt(len(per_seed))


def effective_df(se_items: float, n: int, se_seeds: float, seeds: int) -> float:
    """Welch-Satterthwaite degrees of freedom of se² = se_items² (n - 1 df) + se_seeds² (seeds - 1 df).

    It is seeds - 1 when the seed spread dominates and n - 1 when the item error does; infinite when
    neither part has a spread (se = 0: the interval has no width whatever its quantile)."""
    parts = [(se_items, n - 1), (se_seeds, seeds - 1)]
    parts = [(se, df) for se, df in parts if math.isfinite(se) and se > 0 and df >= 1]
    if not parts:
        return math.inf
    return sum(se**2 for se, _ in parts) ** 2 / sum(se**4 / df for se, df in parts)


def paired_bpb(base: dict[int, list[dict]], variant: dict[int, list[dict]], source: str | None = None) -> dict[str, Any]:
    """Bits-per-byte improvement of `variant` over `base` on the documents both scored, per seed and pooled.

    `base` / `variant`: seed -> document_bits rows. `source`: only that source's documents.
    """
    seeds = sorted(set(base) & set(variant))
    if not seeds:
        raise ValueError("paired_bpb: the base and the variant share no seed")
    rows = [{r["id"]: r for r in side[s] if source is None or r["source"] == source} for s in seeds for side in (base, variant)]
    ids = sorted(set.intersection(*(set(r) for r in rows)))
    if not ids:
        raise ValueError("paired_bpb: no held-out document was scored in every run")
    n_bytes = [rows[0][i]["bytes"] for i in ids]
    total_bytes = sum(n_bytes)
    gains = [[rows[2 * k][i]["bits"] - rows[2 * k + 1][i]["bits"] for i in ids] for k in range(len(seeds))]
    per_seed = [sum(g) / total_bytes for g in gains]
    mean_gain = [sum(g[j] for g in gains) / len(seeds) for j in range(len(ids))]
    improvement = sum(mean_gain) / total_bytes
    n = len(ids)
    residual = sum((u - improvement * b) ** 2 for u, b in zip(mean_gain, n_bytes))
    se_items = math.sqrt(n / (n - 1) * residual) / total_bytes if n >= 2 else float("nan")
    seed_sd, se_seeds = _seed_spread(per_seed)
    base_bpb = statistics.fmean(sum(rows[2 * k][i]["bits"] for i in ids) / total_bytes for k in range(len(seeds)))
    return {"metric": "heldout_bpb", "units": "documents", "n": n, "bytes": total_bytes, "seeds": seeds,
            "base": base_bpb, "variant": base_bpb - improvement, "improvement": improvement, "per_seed": per_seed,
            "se_items": se_items, "seed_sd": seed_sd, "se": math.sqrt(se_items**2 + se_seeds**2),
            "df": effective_df(se_items, n, se_seeds, len(seeds))}


def paired_accuracy(base: dict[int, dict[str, int]], variant: dict[int, dict[str, int]]) -> dict[str, Any] | None:
    """Suite accuracy improvement (variant - base) on the items both answered, per seed and pooled; None without items."""
    seeds = sorted(set(base) & set(variant))
    if not seeds:
        return None
    ids = sorted(set.intersection(*(set(side[s]) for s in seeds for side in (base, variant))))
    if not ids:
        return None
    per_seed = [statistics.fmean(variant[s][i] - base[s][i] for i in ids) for s in seeds]
    # Items paired on their seed-mean scores: the same mean and sd / sqrt(n) as `hymo eval`'s paired checkpoints.
    pair = paired_difference([statistics.fmean(base[s][i] for s in seeds) for i in ids],
                             [statistics.fmean(variant[s][i] for s in seeds) for i in ids])
    improvement, se_items = pair["mean"], pair["stderr"] if len(ids) >= 2 else float("nan")
    seed_sd, se_seeds = _seed_spread(per_seed)
    base_acc = statistics.fmean(statistics.fmean(base[s][i] for i in ids) for s in seeds)
    return {"metric": "suite_accuracy", "convention": SUITE_PICK, "units": "items", "n": len(ids), "seeds": seeds,
            "base": base_acc, "variant": base_acc + improvement, "improvement": improvement, "per_seed": per_seed,
            "se_items": se_items, "seed_sd": seed_sd, "se": math.sqrt(se_items**2 + se_seeds**2),
            "df": effective_df(se_items, len(ids), se_seeds, len(seeds))}


def token_budget(*sides: dict[int, dict]) -> str:
    """The proxies' training tokens, as a verdict states them ("at 40,960 training tokens per proxy run")."""
    tokens = sorted({r["train_tokens"] for side in sides for r in side.values() if r.get("train_tokens")})
    if not tokens:
        return "at an unrecorded training budget"
    if len(tokens) == 1:
        return f"at {tokens[0]:,} training tokens per proxy run"
    return f"at {tokens[0]:,} to {tokens[-1]:,} training tokens per proxy run"


def compare_variant(rule, base_runs: dict[int, dict], variant_runs: dict[int, dict]) -> dict[str, Any]:
    """Both metrics, per-source bits per byte, and the rule's verdict. Runs: seed -> {"documents", "suite"}."""
    base_docs = {s: r["documents"] for s, r in base_runs.items()}
    variant_docs = {s: r["documents"] for s, r in variant_runs.items()}
    bpb = paired_bpb(base_docs, variant_docs)
    sources = sorted({row["source"] for rows in base_docs.values() for row in rows})
    per_source = {}
    for source in sources:
        try:
            per_source[source] = paired_bpb(base_docs, variant_docs, source)
        except ValueError:  # a source whose documents no run shares
            continue
    accuracy = paired_accuracy({s: suite_item_scores(r.get("suite", {})) for s, r in base_runs.items()},
                               {s: suite_item_scores(r.get("suite", {})) for s, r in variant_runs.items()})
    decided = {"heldout_bpb": bpb, "suite_accuracy": accuracy}[rule.metric]
    for row in (bpb, accuracy, *per_source.values()):
        if row is not None:  # the interval each row is judged (and drawn) with
            row["multiplier"] = rule.multiplier(row["df"])
    verdict = "within noise" if decided is None else rule.verdict(decided["improvement"], decided["se"], decided["per_seed"], decided["df"])
    budget = token_budget(base_runs, variant_runs)
    return {"heldout_bpb": bpb, "per_source_bpb": per_source, "suite_accuracy": accuracy, "verdict": verdict,
            "train_tokens": budget, "statement": f"{verdict} {budget}"}
