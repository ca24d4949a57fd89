"""Domain batches with general-text replay: each sequence is general with probability `ratio` (seed 001, Lab 5).

Every step draws one domain batch and one general batch and keeps, per
sequence, the general one where a Bernoulli(ratio) draw says so: replay is a
per-sequence coin, not an exact per-batch quota, and because both candidate
batches are drawn whatever the coins say, runs with different ratios but the
same seeds see the same candidate windows (Lab 5's aligned comparison).
The coins of step s come from a private generator seeded with
(sampler_seed, s), so the sampler's state is one counter and the global RNGs
are never touched. The loader has the `TokenLoader` surface the trainer uses
(`next_batch`, `start_next_epoch`, `state_dict`, `corpus`); each side starts
its next seeded epoch by itself when it runs out.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hymo_core.train.data import EndOfEpoch, TokenLoader


class ReplayLoader:
    def __init__(self, domain: TokenLoader, general: TokenLoader, ratio: float, sampler_seed: int = 0):
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"replay ratio must lie in [0, 1], got {ratio}")
        if (domain.seq_len, domain.batch_size) != (general.seq_len, general.batch_size):
            raise ValueError(f"domain and general loaders differ in (seq_len, batch_size): "
                             f"{(domain.seq_len, domain.batch_size)} vs {(general.seq_len, general.batch_size)}")
        self.domain, self.general, self.ratio, self.sampler_seed = domain, general, ratio, sampler_seed
        self.corpus = domain.corpus  # the corpus a checkpoint of this run records
        self.seq_len, self.batch_size = domain.seq_len, domain.batch_size
        self.steps = 0  # batches handed out
        self.general_sequences = 0

    @property
    def position(self) -> int:
        return self.steps

    def general_mask(self, step: int) -> np.ndarray:
        """The coins of batch `step` (0-based): True where the sequence is replayed general text."""
        return np.random.Generator(np.random.PCG64([self.sampler_seed, step])).random(self.batch_size) < self.ratio

    @staticmethod
    def _draw(loader: TokenLoader) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            return loader.next_batch()
        except EndOfEpoch:
            loader.start_next_epoch()
            return loader.next_batch()

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        general_B = torch.from_numpy(self.general_mask(self.steps))
        dx_BT, dy_BT = self._draw(self.domain)
        gx_BT, gy_BT = self._draw(self.general)
        self.steps += 1
        self.general_sequences += int(general_B.sum())
        keep_general_B1 = general_B.unsqueeze(1)
        return torch.where(keep_general_B1, gx_BT, dx_BT), torch.where(keep_general_B1, gy_BT, dy_BT)

    def start_next_epoch(self) -> None:
        """Nothing to do: each side rolls over to its next epoch inside `next_batch`."""

    @property
    def actual_ratio(self) -> float:
        return self.general_sequences / max(self.steps * self.batch_size, 1)

    def state_dict(self) -> dict[str, Any]:
        return {"manifest_digest": self.corpus.digest, "kind": "replay", "ratio": self.ratio, "sampler_seed": self.sampler_seed,
                "steps": self.steps, "general_sequences": self.general_sequences, "seq_len": self.seq_len, "batch_size": self.batch_size,
                "domain": self.domain.state_dict(), "general": self.general.state_dict()}
