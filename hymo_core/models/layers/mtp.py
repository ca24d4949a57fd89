"""Multi-token prediction (DeepSeek-V3 §2.2): D sequential modules, each one token further ahead.

Depth k (1-based) at position i combines the previous depth's hidden state h^{k-1}_i (h^0 is the
main trunk's last hidden state, before the final norm) with the embedding of token t_{i+k}:

    h'_i = proj([hidden_norm(h^{k-1}_i); embed_norm(Emb(t_{i+k}))])      (2d -> d)
    h^k  = block(h'),   logits = head(out_norm(h^k))  -> predicts t_{i+k+1}

The embedding and the output head are the main model's (shared, as in DeepSeek-V3); each depth
has its own norms, projection and one transformer block. With window tokens x (inputs) and y
(targets, y_i = x_{i+1}), depth k sees positions i < T - k: embeddings of y[:, k-1 : T-1] and
targets y[:, k:]. The model adds sum_k w_k CE_k to its loss in training only: MTP is dropped for
generation and evaluation.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn


class MTPDepth(nn.Module):
    def __init__(self, d_model: int, block: nn.Module, make_norm: Callable[[], nn.Module]):
        super().__init__()
        self.hidden_norm = make_norm()
        self.embed_norm = make_norm()
        self.proj = nn.Linear(2 * d_model, d_model, bias=False)
        self.block = block
        self.out_norm = make_norm()

    def forward(self, hidden_BTD: torch.Tensor, embedded_BTD: torch.Tensor, run_block: Callable) -> torch.Tensor:
        combined_BTD = self.proj(torch.cat((self.hidden_norm(hidden_BTD), self.embed_norm(embedded_BTD)), dim=-1))
        return run_block(self.block, combined_BTD)


class MultiTokenPrediction(nn.Module):
    def __init__(self, d_model: int, loss_weights: tuple[float, ...], make_block: Callable[[], nn.Module],
                 make_norm: Callable[[], nn.Module]):
        super().__init__()
        if not loss_weights:
            raise ValueError("MultiTokenPrediction needs at least one depth (one loss weight)")
        self.loss_weights = tuple(float(w) for w in loss_weights)
        self.depths = nn.ModuleList(MTPDepth(d_model, make_block(), make_norm) for _ in self.loss_weights)

    def forward(self, hidden_BTD: torch.Tensor, targets_BT: torch.Tensor, embed: nn.Module, head_loss: Callable,
                run_block: Callable) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(sum_k w_k CE_k, [CE_1, ..., CE_D]); `head_loss` maps (normed hidden_ND, targets_N) to the head's mean CE
        (the model's chunked head loss: no depth materialises its full logits), `run_block(block, x_BTD)` runs one block."""
        T = targets_BT.shape[1]
        if T <= len(self.depths):
            raise ValueError(f"sequence length {T} leaves no position for MTP depth {len(self.depths)}")
        weighted, per_depth = hidden_BTD.new_zeros(()), []
        for k, (depth, weight) in enumerate(zip(self.depths, self.loss_weights), start=1):
            embedded_BTD = embed(targets_BT[:, k - 1: T - 1])
            hidden_BTD = depth(hidden_BTD[:, : T - k], embedded_BTD, run_block)
            normed_BTD = depth.out_norm(hidden_BTD)
            ce = head_loss(normed_BTD.reshape(-1, normed_BTD.shape[-1]), targets_BT[:, k:].reshape(-1))
            per_depth.append(ce)
            weighted = weighted + weight * ce
        return weighted, per_depth
