"""Learning rate as a pure function of the absolute successful step.

Contract (seed 002, `learning_rate_at_step`): steps are one-based counts of
*successful* optimizer updates; step 0 is rejected. Because nothing here
keeps state, a run split into sessions gets exactly the rates of an
uninterrupted run: warmup never restarts and a session's own `max_steps`
never becomes the decay horizon.

Shapes: linear warmup, then `constant`, `cosine` down to `min_lr_ratio` at
`horizon_steps`, or `wsd` (warmup-stable-decay, seed 000 §4): hold the peak,
then decay over the last `decay_steps` steps before `horizon_steps` with a
linear, cosine or sqrt shape. WSD's appeal is that extending a run only
lengthens the stable phase; the peak LR needs no retuning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SCHEDULE_KINDS = ("constant", "cosine", "wsd")
DECAY_SHAPES = ("linear", "cosine", "sqrt")


@dataclass(frozen=True)
class ScheduleConfig:
    peak_lr: float
    warmup_steps: int = 0
    kind: str = "constant"
    # Absolute step at which cosine/WSD reach min_lr_ratio * peak_lr. It is a
    # property of the recipe, not of a session.
    horizon_steps: int = 0
    decay_steps: int = 0  # WSD only: length of the final decay phase
    decay_shape: str = "linear"  # WSD only
    min_lr_ratio: float = 0.1

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULE_KINDS:
            raise ValueError(f"kind must be one of {SCHEDULE_KINDS}, got {self.kind!r}")
        if self.decay_shape not in DECAY_SHAPES:
            raise ValueError(f"decay_shape must be one of {DECAY_SHAPES}, got {self.decay_shape!r}")
        if not self.peak_lr > 0:
            raise ValueError("peak_lr must be positive")
        if self.warmup_steps < 0:
            raise ValueError("warmup_steps must be >= 0")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError("min_lr_ratio must lie in [0, 1]")
        if self.kind in ("cosine", "wsd") and self.horizon_steps <= self.warmup_steps:
            raise ValueError("horizon_steps must exceed warmup_steps for a decaying schedule")
        if self.kind == "wsd" and not 0 < self.decay_steps <= self.horizon_steps - self.warmup_steps:
            raise ValueError("wsd needs 0 < decay_steps <= horizon_steps - warmup_steps")


def _decay_fraction(progress: float, shape: str) -> float:
    """1 at the start of decay, 0 at its end."""
    if shape == "linear":
        return 1.0 - progress
    if shape == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return math.sqrt(1.0 - progress)  # "sqrt", validated by ScheduleConfig


def learning_rate_at_step(config: ScheduleConfig, step: int) -> float:
    """LR for the `step`-th successful update (1-based, absolute across sessions)."""
    if isinstance(step, bool) or not isinstance(step, int):
        raise TypeError(f"step must be an int, got {type(step).__name__}")
    if step < 1:
        raise ValueError(f"step is one-based; got {step}")
    peak = config.peak_lr
    if step <= config.warmup_steps:
        return peak * step / config.warmup_steps
    if config.kind == "constant":
        return peak
    floor = config.min_lr_ratio * peak
    if config.kind == "cosine":
        span = config.horizon_steps - config.warmup_steps
        progress = min(1.0, (step - config.warmup_steps) / span)
        return floor + (peak - floor) * _decay_fraction(progress, "cosine")
    decay_start = config.horizon_steps - config.decay_steps
    if step <= decay_start:
        return peak
    progress = min(1.0, (step - decay_start) / config.decay_steps)
    return floor + (peak - floor) * _decay_fraction(progress, config.decay_shape)
