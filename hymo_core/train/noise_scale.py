"""The gradient noise scale B_simple from gradients the step computes anyway (McCandlish et al. 2018, App. A).

A gradient over a batch of B tokens has E|G_B|^2 = |G|^2 + tr(Σ)/B, where G is the true gradient
and Σ the per-token covariance. Two batch sizes give unbiased estimates of both terms:

    |G|^2  ≈ (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
    tr(Σ)  ≈ (|G_small|^2 - |G_big|^2) / (1/B_small - 1/B_big)

and B_simple = tr(Σ) / |G|^2, the batch at which a step's noise matches its signal (seed 001's
critical batch, 临界批量). With gradient accumulation both norms are free: the first
micro-batch's gradient is what `.grad` holds after its backward (B_small = one micro-batch,
every rank's under FSDP, which reduces on each backward), and the accumulated gradient is the one
clipped (B_big = the update). Each single-step estimate is noisy and |G|^2's may be negative, so
the two terms are averaged separately (a bias-corrected EMA over logged steps) and only then
divided, as the paper recommends.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from hymo_core.distributed.process_group import total_grad_norm

EMA_DECAY = 0.9  # per logged step: about the last ten records weigh in


def gradient_square_norm(model: nn.Module) -> torch.Tensor:
    """|grad|^2 over every parameter that has one, as a 0-dim device tensor (no host read)."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return torch.zeros(())
    return total_grad_norm(grads).float().square()


def two_batch_estimates(small_sq: float, big_sq: float, b_small: int, b_big: int) -> tuple[float, float]:
    """(|G|^2, tr Σ) from one pair of squared norms at batch sizes b_small < b_big (any unit, tokens here)."""
    if not 0 < b_small < b_big:
        raise ValueError(f"the two-batch estimator needs 0 < b_small < b_big, got {b_small} and {b_big}")
    true_sq = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
    trace = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big)
    return true_sq, trace


@dataclass
class NoiseScale:
    """Running (EMA) estimates of |G|^2 and tr Σ over logged steps; `b_simple` is their ratio."""

    decay: float = EMA_DECAY
    true_sq: float = 0.0
    trace: float = 0.0
    weight: float = 0.0  # the EMA's total weight, for the bias correction

    def add(self, small_sq: float, big_sq: float, b_small: int, b_big: int) -> dict[str, float | int | None]:
        """Fold one logged step in; returns that step's record (the running B_simple is None until |G|^2 > 0)."""
        true_sq, trace = two_batch_estimates(small_sq, big_sq, b_small, b_big)
        self.true_sq = self.decay * self.true_sq + (1 - self.decay) * true_sq
        self.trace = self.decay * self.trace + (1 - self.decay) * trace
        self.weight = self.decay * self.weight + (1 - self.decay)
        mean_true, mean_trace = self.true_sq / self.weight, self.trace / self.weight
        return {
            "b_small_tokens": b_small, "b_big_tokens": b_big,
            "grad_sq_small": small_sq, "grad_sq_big": big_sq,
            "true_grad_sq": mean_true, "trace_covariance": mean_trace,
            "b_simple_tokens": mean_trace / mean_true if mean_true > 0 and mean_trace > 0 else None,
        }
