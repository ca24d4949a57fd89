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
