"""An output head's cross-entropy without its full logits: rows in chunks, each chunk's logits recomputed in backward.

hymo-750m's head maps 2 x 4096 rows to 64,256 logits: 1.05 GB in bf16 per head, kept for backward, and the model
has three heads (main + 2 MTP depths). Here the rows go through `head` and the loss `chunk_rows` at a time under
activation checkpointing: only one chunk's logits exist at once, forward or backward, at the price of the head
matmul run twice (the recompute). Means are over the non-ignored targets of all chunks (a chunk with none adds 0),
computed on the device (no host read). MTP's depths use it; the main head's path can call it the same way.

    objective, ce = chunked_head_loss(hidden_ND, model.head, targets_N, z_loss=0.0)
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from hymo_core.kernels.backend import resolve_backend
from hymo_core.kernels.cross_entropy import cross_entropy_rows

CHUNK_ROWS = 2048  # 2048 x 64,256 bf16 logits: 263 MB at once instead of 1.05 GB at 2 x 4096


def _chunk_sums(hidden_CD: torch.Tensor, targets_C: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor],
                z_loss: float, ignore_index: int, backend: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of the objective, sum of the cross-entropy) over the chunk's non-ignored rows."""
    logits_CV = head(hidden_CD)
    chosen = resolve_backend(logits_CV, backend)
    if chosen == "reference" and z_loss == 0.0:
        ce = F.cross_entropy(logits_CV.float(), targets_C, ignore_index=ignore_index, reduction="sum")
        return ce, ce
    ce_C, lse_C = cross_entropy_rows(logits_CV, targets_C, ignore_index, backend=chosen)
    ce = ce_C.sum()
    if z_loss == 0.0:
        return ce, ce
    return ce + z_loss * (lse_C.square() * (targets_C != ignore_index)).sum(), ce


def chunked_head_loss(hidden_ND: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor], targets_N: torch.Tensor,
                      z_loss: float = 0.0, ignore_index: int = -100, backend: str | None = None,
                      chunk_rows: int = CHUNK_ROWS) -> tuple[torch.Tensor, torch.Tensor]:
    """(objective, mean cross-entropy) of `head(hidden_ND)` against `targets_N`, as `kernels.cross_entropy_loss`
    of the full logits gives, with at most `chunk_rows` rows of logits alive at once."""
    if hidden_ND.shape[0] != targets_N.shape[0]:
        raise ValueError(f"chunked_head_loss: {hidden_ND.shape[0]} hidden rows but {targets_N.shape[0]} targets")
    n_valid = (targets_N != ignore_index).sum().clamp(min=1).float()
    objective = ce = None
    for start in range(0, hidden_ND.shape[0], chunk_rows):
        rows = slice(start, start + chunk_rows)
        if torch.is_grad_enabled():
            chunk = checkpoint(_chunk_sums, hidden_ND[rows], targets_N[rows], head, z_loss, ignore_index, backend,
                               use_reentrant=False)
        else:
            chunk = _chunk_sums(hidden_ND[rows], targets_N[rows], head, z_loss, ignore_index, backend)
        objective = chunk[0] if objective is None else objective + chunk[0]
        ce = chunk[1] if ce is None else ce + chunk[1]
    return objective / n_valid, ce / n_valid
