"""The acceptance gate of a continued-pretraining run: a file written before training, the only input to the verdict.

Seed 001 (CPT section): fix the acceptance threshold before training, e.g.
domain improvement with a general-task regression of at most one point, on
enough paired items to judge that size; with large uncertainty a point
estimate is not enough. `gate.toml`:

    [[criterion]]
    metric = "domain_loss_reduction"   # base - CPT held-out loss on the domain's fixed batches, nats/token
    direction = ">="
    threshold = 1.0

    [[criterion]]
    metric = "general_loss_rise"       # CPT - base on the general fixed batches
    direction = "<="
    threshold = 0.20

    [[criterion]]                      # optional
    metric = "task_accuracy_drop"      # base - CPT accuracy (fraction) on the first `paired_items` items of `task`
    task = "hellaswag"
    paired_items = 500
    direction = "<="
    threshold = 0.01
    rule = "ci95"                      # pass only if the whole 95 % interval is on the passing side; default "point"

The file's sha256 goes into the run manifest before the first update; the
verdict re-reads the file, re-hashes it and refuses (GateTampered) if it
changed. Uncertainty comes from paired differences, before and after, on the same units:

* held-out losses: whole documents (the validation prefix split at EOS). The estimate is the
  token-weighted mean difference, and its standard error comes from a bootstrap over documents
  (`BOOTSTRAP_RESAMPLES` resamples, seed `BOOTSTRAP_SEED`). Consecutive windows of one document are
  correlated, so treating windows as independent understates the error; documents are nearly independent.
* task items: independent items, mean +- sd / sqrt(n).

The 95 % interval is estimate +- 1.96 se. A `ci95` criterion judged on fewer than `MIN_CI95_UNITS`
documents or items is refused (GateError), not passed: the normal interval needs enough units for
the central limit to hold (30 is the usual rule of thumb), and with one document the bootstrap's
error is exactly 0, so any interval "passes" as "+- 0.0000".
"""
from __future__ import annotations

import hashlib
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

GATE_FILE = "gate.toml"
METRICS = ("domain_loss_reduction", "general_loss_rise", "task_accuracy_drop")
DIRECTIONS = (">=", "<=")
RULES = ("point", "ci95")
Z95 = 1.959964
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
MIN_CI95_UNITS = 30


class GateError(ValueError):
    """A gate file that cannot be used (the message names the file and the criterion)."""


class GateTampered(RuntimeError):
    """The gate file changed after the run recorded its hash: no verdict is given."""


@dataclass(frozen=True)
class Criterion:
    metric: str
    direction: str
    threshold: float
    rule: str = "point"
    task: str | None = None
    paired_items: int | None = None

    def passes(self, value: float) -> bool:
        return value >= self.threshold if self.direction == ">=" else value <= self.threshold


def sha256_bytes(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


def parse_gate(text: str, where: str = GATE_FILE) -> list[Criterion]:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise GateError(f"{where}: not TOML ({exc})") from exc
    entries = raw.get("criterion")
    if not isinstance(entries, list) or not entries:
        raise GateError(f"{where}: needs at least one [[criterion]] table")
    criteria = []
    for index, entry in enumerate(entries, 1):
        try:
            criterion = Criterion(metric=entry["metric"], direction=entry["direction"], threshold=float(entry["threshold"]),
                                  rule=entry.get("rule", "point"), task=entry.get("task"), paired_items=entry.get("paired_items"))
        except (KeyError, TypeError, ValueError) as exc:
            raise GateError(f"{where}: criterion {index} needs metric, direction and a numeric threshold ({exc})") from exc
        if criterion.metric not in METRICS or criterion.direction not in DIRECTIONS or criterion.rule not in RULES:
            raise GateError(f"{where}: criterion {index}: metric must be one of {METRICS}, direction one of {DIRECTIONS}, rule one of {RULES}")
        if criterion.metric == "task_accuracy_drop" and (not criterion.task or not isinstance(criterion.paired_items, int) or criterion.paired_items < 1):
            raise GateError(f"{where}: criterion {index}: task_accuracy_drop needs `task` and a positive integer `paired_items`")
        unknown = sorted(set(entry) - {"metric", "direction", "threshold", "rule", "task", "paired_items"})
        if unknown:
            raise GateError(f"{where}: criterion {index}: unknown keys {unknown}")
        criteria.append(criterion)
    return criteria


def gate_text(criteria: Sequence[Criterion]) -> str:
    """The TOML a gate is written as (the CLI's flags become this file before training)."""
    blocks = []
    for c in criteria:
        lines = ["[[criterion]]", f'metric = "{c.metric}"', f'direction = "{c.direction}"', f"threshold = {c.threshold!r}", f'rule = "{c.rule}"']
        if c.task:
            lines += [f'task = "{c.task}"', f"paired_items = {c.paired_items}"]
        blocks.append("\n".join(lines))
    return "# Acceptance gate, written before training; its sha256 is in cpt_manifest.json.\n\n" + "\n\n".join(blocks) + "\n"


def read_gate(path: Path, expected_sha256: str | None = None) -> tuple[list[Criterion], str]:
    """(criteria, sha256) of the gate file; GateTampered when it no longer has the recorded hash."""
    payload = Path(path).read_bytes()
    digest = sha256_bytes(payload)
    if expected_sha256 is not None and digest != expected_sha256:
        raise GateTampered(f"{path}: sha256 {digest[:12]}… but the run recorded {expected_sha256[:12]}… before its first step; "
                           "the gate was edited after the run started, refusing to judge")
    return parse_gate(payload.decode("utf-8"), str(path)), digest


def paired_estimate(differences: Sequence[float]) -> dict[str, float]:
    """Mean of paired differences with its standard error and 95 % interval."""
    n = len(differences)
    if n == 0:
        raise ValueError("no paired observations")
    mean = sum(differences) / n
    variance = sum((d - mean) ** 2 for d in differences) / (n - 1) if n > 1 else 0.0
    stderr = math.sqrt(variance / n)
    return {"value": mean, "stderr": stderr, "ci95_low": mean - Z95 * stderr, "ci95_high": mean + Z95 * stderr, "n": n}


def document_estimate(difference_sums: Sequence[float], tokens: Sequence[int], resamples: int = BOOTSTRAP_RESAMPLES,
                      seed: int = BOOTSTRAP_SEED) -> dict[str, Any]:
    """Token-weighted mean of per-document loss differences, with a bootstrap over whole documents.

    `difference_sums[d]` is document d's summed per-token difference, `tokens[d]` its token count.
    """
    import numpy as np

    sums, counts = np.asarray(difference_sums, dtype=np.float64), np.asarray(tokens, dtype=np.float64)
    n = len(sums)
    if n == 0 or counts.sum() == 0:
        raise ValueError("no paired documents")
    value = float(sums.sum() / counts.sum())
    generator = np.random.default_rng(seed)
    estimates = np.empty(resamples)
    for r in range(resamples):
        pick = generator.integers(0, n, size=n)
        estimates[r] = sums[pick].sum() / max(counts[pick].sum(), 1.0)
    stderr = float(estimates.std(ddof=1)) if n > 1 else 0.0
    return {"value": value, "stderr": stderr, "ci95_low": value - Z95 * stderr, "ci95_high": value + Z95 * stderr, "n": n,
            "unit": "documents", "tokens": int(counts.sum()), "stderr_method": f"bootstrap over documents ({resamples} resamples, seed {seed})"}


def estimate(paired: Sequence[float] | dict[str, Any]) -> dict[str, Any]:
    """Documents ({"difference_sums", "tokens"}) get the document bootstrap; a plain list, independent units."""
    if isinstance(paired, dict):
        return document_estimate(paired["difference_sums"], paired["tokens"])
    return {**paired_estimate(paired), "unit": "items", "stderr_method": "sd / sqrt(n) over independent items"}


def _units(paired: Sequence[float] | dict[str, Any]) -> int:
    return len(paired["difference_sums"]) if isinstance(paired, dict) else len(paired)


def check_sample_sizes(criteria: Sequence[Criterion], paired: dict[str, Sequence[float] | dict[str, Any]], where: str = GATE_FILE) -> None:
    """GateError when a `ci95` criterion has fewer than MIN_CI95_UNITS paired documents or items."""
    for c in criteria:
        key = f"{c.metric}:{c.task}" if c.task else c.metric
        if c.rule == "ci95" and key in paired and _units(paired[key]) < MIN_CI95_UNITS:
            unit = "documents" if isinstance(paired[key], dict) else "items"
            raise GateError(f"{where}: criterion {key} has rule ci95 but only {_units(paired[key])} held-out {unit}; a 95 % interval "
                            f"needs at least {MIN_CI95_UNITS} (raise eval_batches / paired_items, or use rule = \"point\")")


def judge(criteria: Sequence[Criterion], paired: dict[str, Sequence[float] | dict[str, Any]]) -> dict[str, Any]:
    """The verdict: every criterion with its estimate and whether it passed; passed = all passed.

    `paired[metric]` (or `paired["task_accuracy_drop:TASK"]`) holds the paired differences, already
    oriented as the metric says (reduction = base - CPT, rise = CPT - base, drop = base - CPT):
    per-document sums and token counts for losses, one value per item for tasks.
    """
    check_sample_sizes(criteria, paired)
    rows = []
    for c in criteria:
        key = f"{c.metric}:{c.task}" if c.task else c.metric
        if key not in paired:
            raise GateError(f"gate criterion {key} was not measured by this run")
        result = estimate(paired[key])
        if c.rule == "point":
            passed = c.passes(result["value"])
        else:  # the whole interval on the passing side
            passed = c.passes(result["ci95_low"] if c.direction == ">=" else result["ci95_high"])
        rows.append({"metric": key, "direction": c.direction, "threshold": c.threshold, "rule": c.rule, **result, "passed": passed})
    return {"passed": all(r["passed"] for r in rows), "criteria": rows}
