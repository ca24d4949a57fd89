"""Batch-size and LR advice from a run's measured gradient noise scale (`hymo plan batch`).

McCandlish et al. (2018) model the trade-off of batch B against the critical batch
B_crit ≈ B_noise: to reach a given loss, the steps taken S and the tokens spent E obey

    S / S_min = 1 + B_noise / B          E / E_min = 1 + B / B_noise

so below B_noise a larger batch buys nearly linear step savings, above it mostly spends tokens.
For SGD the best LR at batch B is ε_max / (1 + B_noise / B). Seed 001 states the caveat this module
repeats in every answer: these relations are derived for SGD; for Adam-family optimizers (HyMo's
AdamW and Muon/NorMuon) they are an empirical model, so an LR moved with the batch is a starting
point for a sweep, not a result.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

CAVEAT = ("The relations are derived for SGD (McCandlish et al. 2018); for Adam, AdamW and Muon/NorMuon "
          "they are an empirical model: confirm a moved LR with a short LR sweep at the new batch.")
NEAR_CRITICAL = 2.0  # within this factor of B_noise a batch counts as near critical


@dataclass(frozen=True)
class BatchAdvice:
    b_noise_tokens: float
    batch_tokens: int
    steps_over_min: float  # S / S_min at the current batch
    tokens_over_min: float  # E / E_min at the current batch
    lr_factor_at_critical: float  # SGD's optimum LR at B_noise over its optimum at the current batch
    verdict: str


def latest_noise_scale(metrics_path: Path) -> dict:
    """The last `noise_scale` record of a metrics.jsonl (or of RUN_DIR/metrics.jsonl) with a finite B_simple."""
    path = metrics_path / "metrics.jsonl" if metrics_path.is_dir() else metrics_path
    if not path.is_file():
        raise ValueError(f"{path}: no metrics.jsonl (train with gradient_accumulation_steps >= 2 to measure the noise scale)")
    found = None
    with path.open() as handle:
        for number, line in enumerate(handle, 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not a JSON record ({error.msg})") from None
            noise = record.get("noise_scale")
            if noise and noise.get("b_simple_tokens"):
                found = {**noise, "step": record.get("step")}
    if found is None:
        raise ValueError(f"{path}: no logged step with a positive noise-scale estimate (it needs gradient_accumulation_steps >= 2; "
                         "early in training |G|^2's estimate can be negative: train longer or log more often)")
    return found


SPREAD_STEPS = 20  # logged steps the spread is taken over (B_simple grows as the loss falls: the latest ones)
BOOTSTRAP_SAMPLES = 2000


@dataclass(frozen=True)
class NoiseSpread:
    """How much one B_noise estimate can be trusted: the per-step estimates and a bootstrap over the steps."""

    steps: list[int]  # the logged steps used
    per_step_median: float  # of the single-pair estimates tr(Σ)_i / |G|²_i (inf where |G|²_i <= 0)
    per_step_quartiles: tuple[float, float]
    unbounded_steps: int  # steps whose |G|² estimate was <= 0: noise alone, B_simple unbounded
    ratio_of_means: float  # mean tr(Σ) / mean |G|² over the steps (inf when mean |G|² <= 0)
    interval: tuple[float, float]  # 5th and 95th percentile of the ratio of means over bootstrap resamples of the steps
    samples: int


def _quantiles(values, levels):
    import numpy as np

    return [float(q) for q in np.quantile(values, levels, method="inverted_cdf")]  # sample values: inf stays inf


def noise_scale_spread(metrics_path: Path, last: int = SPREAD_STEPS, samples: int = BOOTSTRAP_SAMPLES, seed: int = 0) -> NoiseSpread | None:
    """The spread of B_simple over the last `last` logged steps that carry both gradient norms; None with fewer than 3."""
    import numpy as np

    from hymo_core.train.noise_scale import two_batch_estimates

    path = metrics_path / "metrics.jsonl" if metrics_path.is_dir() else metrics_path
    pairs = []
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line) if line.strip() else {}
        noise = record.get("noise_scale") or {}
        if all(isinstance(noise.get(k), (int, float)) for k in ("grad_sq_small", "grad_sq_big", "b_small_tokens", "b_big_tokens")):
            pairs.append((record.get("step"), *two_batch_estimates(noise["grad_sq_small"], noise["grad_sq_big"],
                                                                   noise["b_small_tokens"], noise["b_big_tokens"])))
    pairs = pairs[-last:]
    if len(pairs) < 3:
        return None
    true_sq = np.array([p[1] for p in pairs])
    trace = np.array([p[2] for p in pairs])
    per_step = np.where(true_sq > 0, np.maximum(trace, 0.0) / np.where(true_sq > 0, true_sq, 1.0), np.inf)

    def ratio(t_sq, tr):
        return float(tr.mean() / t_sq.mean()) if t_sq.mean() > 0 else float("inf")

    generator = np.random.default_rng(seed)
    picks = generator.integers(0, len(pairs), (samples, len(pairs)))
    mean_true, mean_trace = true_sq[picks].mean(axis=1), trace[picks].mean(axis=1)
    resampled = np.where(mean_true > 0, np.maximum(mean_trace, 0.0) / np.where(mean_true > 0, mean_true, 1.0), np.inf)
    low, high = _quantiles(resampled, [0.05, 0.95])
    q1, median, q3 = _quantiles(per_step, [0.25, 0.5, 0.75])
    return NoiseSpread([p[0] for p in pairs], median, (q1, q3), int((true_sq <= 0).sum()), ratio(true_sq, trace), (low, high), samples)


def _verdict_kind(b_noise_tokens: float, batch_tokens: int) -> str:
    ratio = b_noise_tokens / batch_tokens
    return "below" if ratio > NEAR_CRITICAL else "above" if ratio < 1 / NEAR_CRITICAL else "near"


def format_spread(spread: NoiseSpread, batch_tokens: int) -> str:
    def tokens(value: float) -> str:
        return "unbounded" if not math.isfinite(value) else f"{value:,.0f}"

    n = len(spread.steps)
    lines = [f"spread over the last {n} logged steps (steps {spread.steps[0]}-{spread.steps[-1]}):",
             f"  per step: median {tokens(spread.per_step_median)} tokens, interquartile {tokens(spread.per_step_quartiles[0])}"
             f"-{tokens(spread.per_step_quartiles[1])} ({spread.unbounded_steps} of {n} steps had a |G|² estimate <= 0: unbounded)",
             f"  ratio of the steps' means: {tokens(spread.ratio_of_means)} tokens, 90 % bootstrap interval "
             f"{tokens(spread.interval[0])}-{tokens(spread.interval[1])} ({spread.samples:,} resamples of the steps)"]
    ends = {_verdict_kind(value, batch_tokens) if math.isfinite(value) and value > 0 else "below" for value in spread.interval}
    if len(ends) > 1:
        lines.append("  the interval spans more than one verdict (" + " and ".join(sorted(f"{e} B_noise" for e in ends))
                     + "): the advice is not settled; log more steps (smaller log_interval) or train longer")
    return "\n".join(lines)


def advise(b_noise_tokens: float, batch_tokens: int) -> BatchAdvice:
    if not (b_noise_tokens > 0 and math.isfinite(b_noise_tokens)) or batch_tokens <= 0:
        raise ValueError(f"need a positive noise scale and batch, got B_noise={b_noise_tokens} and B={batch_tokens}")
    ratio = b_noise_tokens / batch_tokens
    if ratio > NEAR_CRITICAL:
        verdict = (f"the batch is {ratio:.1f}x below B_noise: a larger batch (toward {b_noise_tokens:,.0f} tokens) "
                   "cuts optimizer steps almost in proportion at little extra token cost")
    elif ratio < 1 / NEAR_CRITICAL:
        verdict = (f"the batch is {1 / ratio:.1f}x above B_noise: extra tokens per step buy few saved steps; "
                   "a smaller batch reaches the same loss on fewer tokens")
    else:
        verdict = "the batch is near the critical batch: a balanced trade of steps against tokens"
    return BatchAdvice(b_noise_tokens, batch_tokens, 1 + ratio, 1 + 1 / ratio, (1 + ratio) / 2, verdict)


def format_advice(advice: BatchAdvice, peak_lr: float | None = None, step: int | None = None) -> str:
    at = f" (step {step})" if step is not None else ""
    lines = [
        f"gradient noise scale B_simple{at}: {advice.b_noise_tokens:,.0f} tokens (the critical batch, B_crit ≈ B_noise)",
        f"current batch: {advice.batch_tokens:,} tokens per update",
        f"  steps vs the minimum:  S/S_min = 1 + B_noise/B = {advice.steps_over_min:.2f}",
        f"  tokens vs the minimum: E/E_min = 1 + B/B_noise = {advice.tokens_over_min:.2f}",
        f"advice: {advice.verdict}",
        f"LR at B = B_noise (SGD: ε_opt ∝ 1/(1 + B_noise/B)): x{advice.lr_factor_at_critical:.2f} the current optimum"
        + (f", i.e. {peak_lr * advice.lr_factor_at_critical:.3g} from peak {peak_lr:.3g}" if peak_lr else ""),
        f"caveat: {CAVEAT}",
    ]
    return "\n".join(lines)
