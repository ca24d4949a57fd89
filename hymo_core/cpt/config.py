"""A continuation recipe (`CptConfig`), in a module without torch: `hymo`'s parser reads its defaults on every
command, and importing the runner for them cost seconds of start-up."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hymo_core.train.config import TrainConfig


@dataclass(frozen=True)
class CptConfig:
    """One continuation recipe; defaults are Lab 5's low-LR / 30 % replay condition scaled to the sample recipe."""

    replay_ratio: float = 0.3
    peak_lr: float = 4e-4  # a tenth of the sample's pretraining peak (Lab 5: 3e-4 after 3e-3)
    steps: int = 100
    warmup_steps: int = 10  # short: the fresh optimizer's moments need a few steps to reach their scale
    min_lr_ratio: float = 0.1  # cosine floor, as a fraction of peak_lr
    eval_interval: int = 20
    eval_batches: int = 10  # Lab 5: ten fixed batches per held-out set
    sampler_seed: int = 0  # the replay coins; the same for every condition compared
    seed: int = 0  # the loaders' window orders

    def __post_init__(self) -> None:
        if not 0.0 <= self.replay_ratio <= 1.0:
            raise ValueError(f"replay_ratio must lie in [0, 1], got {self.replay_ratio}")
        if self.steps < 1 or self.eval_interval < 1 or self.eval_batches < 1 or not 0 <= self.warmup_steps < self.steps:
            raise ValueError("steps, eval_interval, eval_batches must be >= 1 and 0 <= warmup_steps < steps")

    def train_config(self, base: dict[str, Any]) -> TrainConfig:
        """The base's recipe (batch, sequence, optimizer settings) with this continuation's schedule."""
        return TrainConfig.from_dict({**base, "peak_lr": self.peak_lr, "max_steps": self.steps, "warmup_steps": self.warmup_steps,
                                      "schedule": "cosine", "horizon_steps": 0, "decay_steps": 0, "min_lr_ratio": self.min_lr_ratio,
                                      "log_interval": min(10, self.steps), "eval_interval": self.steps, "checkpoint_interval": self.steps,
                                      "eval_batches": self.eval_batches, "overfit_one_batch": False, "seed": self.seed})
