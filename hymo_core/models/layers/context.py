"""What a mixer needs besides its input: RoPE tables, position, and its cache."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class MixerContext:
    """Per-forward inputs shared by every mixer of a stack.

    `cos_TD2` / `sin_TD2` are the model's full RoPE tables; `start` is the
    absolute position of x's first token (non-zero only when continuing from a
    cache); `cache` is this layer's cache object or None (training).
    """

    cos_TD2: torch.Tensor
    sin_TD2: torch.Tensor
    start: int = 0
    cache: Any = None

    def rope(self, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The table rows of positions start .. start + T - 1."""
        if self.start == 0:
            return self.cos_TD2, self.sin_TD2  # kernels slice [:T] themselves
        end = self.start + T
        if end > self.cos_TD2.shape[0]:
            raise ValueError(f"position {end - 1} exceeds the RoPE table ({self.cos_TD2.shape[0]} positions)")
        return self.cos_TD2[self.start:end], self.sin_TD2[self.start:end]

    def causal_mask(self, T: int, device: torch.device) -> torch.Tensor | None:
        """Boolean (T, start + T) visibility for queries that continue a cache; None when plain causal."""
        if self.start == 0:
            return None
        q_T1 = torch.arange(self.start, self.start + T, device=device)[:, None]
        k_1S = torch.arange(self.start + T, device=device)[None, :]
        return k_1S <= q_T1
