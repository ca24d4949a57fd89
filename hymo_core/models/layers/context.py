"""What a mixer needs besides its input: RoPE tables, position(s), and its cache."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from hymo_core import kernels


@dataclass(frozen=True)
class RowPositions:
    """One new token per row, each row at its own absolute position (batched decoding of ragged prompts).

    Row b's token sits at `positions_B[b]` of its own cache; it is rotated by that position's RoPE
    angle and sees that row's keys 0 .. positions_B[b] only (`visible_B11S`). `end` is the largest
    position + 1, so caches return keys 0 .. end - 1 and every shorter row masks its tail.
    """

    positions_B: torch.Tensor  # long
    rows_B: torch.Tensor  # 0 .. B - 1, to index a cache's rows beside positions_B
    end: int
    cos_BD2: torch.Tensor
    sin_BD2: torch.Tensor
    visible_B11S: torch.Tensor  # bool, broadcasts over (batch, heads, 1 query, keys)

    @classmethod
    def of(cls, positions: list[int], cos_TD2: torch.Tensor, sin_TD2: torch.Tensor) -> "RowPositions":
        positions_B = torch.tensor(positions, dtype=torch.long, device=cos_TD2.device)
        end = max(positions) + 1
        visible_BS = torch.arange(end, device=cos_TD2.device)[None, :] <= positions_B[:, None]
        rows_B = torch.arange(len(positions), device=cos_TD2.device)
        return cls(positions_B, rows_B, end, cos_TD2.index_select(0, positions_B), sin_TD2.index_select(0, positions_B),
                   visible_BS[:, None, None, :])


@dataclass
class MixerContext:
    """Per-forward inputs shared by every mixer of a stack.

    `cos_TD2` / `sin_TD2` are the model's full RoPE tables; `start` is the
    absolute position of x's first token (non-zero only when continuing from a
    cache); `cache` is this layer's cache object or None (training). `rows`,
    with a cache only: each row's own position for its single new token
    (then `start` is unused).
    """

    cos_TD2: torch.Tensor
    sin_TD2: torch.Tensor
    start: int = 0
    cache: Any = None
    rows: RowPositions | None = None

    def rope(self, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The table rows of positions start .. start + T - 1."""
        if self.start == 0:
            return self.cos_TD2, self.sin_TD2  # kernels slice [:T] themselves
        end = self.start + T
        if end > self.cos_TD2.shape[0]:
            raise ValueError(f"position {end - 1} exceeds the RoPE table ({self.cos_TD2.shape[0]} positions)")
        return self.cos_TD2[self.start:end], self.sin_TD2[self.start:end]

    def rotate(self, x_BTHD: torch.Tensor, backend: str | None = None, rotated_heads: int | None = None) -> torch.Tensor:
        """RoPE of this forward's queries or keys at their positions: start + t, or each row's own position.

        `rotated_heads` R: only heads 0 .. R - 1 are rotated, the rest copied (see kernels.apply_rope)."""
        if self.rows is None:
            return kernels.apply_rope(x_BTHD, *self.rope(x_BTHD.shape[1]), backend=backend, rotated_heads=rotated_heads)
        B, _, H, D = x_BTHD.shape  # one token per row: the rows become the time axis of one rotation
        rotated = kernels.apply_rope(x_BTHD.reshape(1, B, H, D), self.rows.cos_BD2, self.rows.sin_BD2, backend=backend,
                                     rotated_heads=rotated_heads)
        return rotated.view(B, 1, H, D)

    def key_end(self, T: int) -> int:
        """Key positions a cache returns after this forward's T tokens are written: 0 .. key_end - 1."""
        return self.rows.end if self.rows is not None else self.start + T

    def causal_mask(self, T: int, device: torch.device) -> torch.Tensor | None:
        """Boolean (T, start + T) visibility for queries that continue a cache; None when plain causal."""
        if self.start == 0:
            return None
        q_T1 = torch.arange(self.start, self.start + T, device=device)[:, None]
        k_1S = torch.arange(self.start + T, device=device)[None, :]
        return k_1S <= q_T1
