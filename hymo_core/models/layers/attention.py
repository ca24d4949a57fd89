"""Grouped-query softmax attention with RoPE (mixer kind "A"), its KV cache and logit probe."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from hymo_core.models.configs import ModelConfig
from hymo_core.kernels.logit_probe import causal_max_logits, qk_clip_heads_  # noqa: F401  (the probe other mixers use too)
from hymo_core.models.layers.context import MixerContext
from hymo_core.models.layers.norm import RMSNorm


@dataclass
class KVCache:
    """Keys and values of every position so far, preallocated to max_seq_len."""

    k_BKSD: torch.Tensor
    v_BKSD: torch.Tensor

    def append(self, ctx: MixerContext, k_BKTD: torch.Tensor, v_BKTD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this forward's positions (start .. start+T-1, or each row's own); return keys and values 0 .. key_end-1."""
        end = ctx.key_end(k_BKTD.shape[2])
        if end > self.k_BKSD.shape[2]:
            raise ValueError(f"KV cache holds {self.k_BKSD.shape[2]} positions, asked for {end}")
        if ctx.rows is None:
            self.k_BKSD[:, :, ctx.start:end] = k_BKTD
            self.v_BKSD[:, :, ctx.start:end] = v_BKTD
        else:
            self.k_BKSD[ctx.rows.rows_B, :, ctx.rows.positions_B] = k_BKTD[:, :, 0]
            self.v_BKSD[ctx.rows.rows_B, :, ctx.rows.positions_B] = v_BKTD[:, :, 0]
        return self.k_BKSD[:, :, :end], self.v_BKSD[:, :, :end]


def attend(q_BHTD: torch.Tensor, k_BKSD: torch.Tensor, v_BKSD: torch.Tensor, ctx: MixerContext,
           scale: float | None = None) -> torch.Tensor:
    """Causal SDPA, also when the queries continue a cache (keys then start before them) or rows sit at their own positions."""
    T = q_BHTD.shape[2]
    gqa = k_BKSD.shape[1] != q_BHTD.shape[1]
    if ctx.rows is not None:  # one query per row, at its own position: each row masks the keys past it
        return F.scaled_dot_product_attention(q_BHTD, k_BKSD, v_BKSD, attn_mask=ctx.rows.visible_B11S, scale=scale, enable_gqa=gqa)
    if ctx.start == 0:
        return F.scaled_dot_product_attention(q_BHTD, k_BKSD, v_BKSD, is_causal=True, scale=scale, enable_gqa=gqa)
    mask_TS = None if T == 1 else ctx.causal_mask(T, q_BHTD.device)  # one new query sees every cached key
    return F.scaled_dot_product_attention(q_BHTD, k_BKSD, v_BKSD, attn_mask=mask_TS, scale=scale, enable_gqa=gqa)


class Attention(nn.Module):
    """Causal GQA through scaled_dot_product_attention, with an optional logit probe.

    The probe (set `probe = True`) records, per query head, the largest
    |q.k| / sqrt(head_dim) over causally visible pairs of the batch. It runs
    under no_grad on copies, so outputs and gradients are unchanged; QK-Clip
    reads it and calls `qk_clip_` to rescale the heads over its threshold.
    """

    def __init__(self, config: ModelConfig, kernel_backend: str | None = None):
        super().__init__()
        self.n_heads, self.n_kv_heads = config.n_heads, config.n_kv_heads
        self.head_dim = config.head_dim
        self.max_seq_len = config.max_seq_len
        self.kernel_backend = kernel_backend
        self.q_proj = nn.Linear(config.d_model, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.d_model, self.n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.d_model, self.n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, config.d_model, bias=False)
        if config.qk_norm:  # applied before RoPE, per head
            self.q_norm = RMSNorm(self.head_dim, config.norm_eps, kernel_backend)
            self.k_norm = RMSNorm(self.head_dim, config.norm_eps, kernel_backend)
        else:
            self.q_norm = self.k_norm = None
        self.probe = False
        self.probe_skip_below: float | None = None  # QK-Clip's threshold on steps that only clip (logit_probe.py)
        self.max_logit_H: torch.Tensor | None = None

    def residual_weights(self) -> list[nn.Parameter]:
        return [self.o_proj.weight]

    def new_cache(self, batch_size: int, device: torch.device, dtype: torch.dtype) -> KVCache:
        shape = (batch_size, self.n_kv_heads, self.max_seq_len, self.head_dim)
        return KVCache(torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype))

    def forward(self, x_BTD: torch.Tensor, ctx: MixerContext) -> torch.Tensor:
        B, T, _ = x_BTD.shape
        H, K = self.n_heads, self.n_kv_heads
        # q, k, v stay separate parameters (Muon orthogonalises each, QK-Clip rescales
        # q and k per head) but run as one matmul: concatenating the small weight is
        # cheaper than two extra activation-sized matmuls and gradient additions.
        w_qkv = torch.cat((self.q_proj.weight, self.k_proj.weight, self.v_proj.weight))
        qkv_BTXD = F.linear(x_BTD, w_qkv).view(B, T, H + 2 * K, self.head_dim)
        if self.q_norm is not None:
            q_BTHD, k_BTKD, v_BTKD = qkv_BTXD.split((H, K, K), dim=2)
            q_BTHD = ctx.rotate(self.q_norm(q_BTHD), self.kernel_backend)
            k_BTKD = ctx.rotate(self.k_norm(k_BTKD), self.kernel_backend)
        else:  # one call rotates queries and keys and passes values: one output, one gradient, no copies
            q_BTHD, k_BTKD, v_BTKD = ctx.rotate(qkv_BTXD, self.kernel_backend, rotated_heads=H + K).split((H, K, K), dim=2)
        q_BHTD, k_BKTD, v_BKTD = (t.transpose(1, 2) for t in (q_BTHD, k_BTKD, v_BTKD))
        if ctx.cache is not None:
            k_BKTD, v_BKTD = ctx.cache.append(ctx, k_BKTD, v_BKTD)
        elif self.probe:  # chunked, never a full B*H*T*T score tensor beside SDPA
            self.max_logit_H = causal_max_logits(q_BHTD, k_BKTD, math.sqrt(self.head_dim), skip_below=self.probe_skip_below)
        y_BHTD = attend(q_BHTD, k_BKTD, v_BKTD, ctx)
        return self.o_proj(y_BHTD.transpose(1, 2).reshape(B, T, -1))

    @torch.no_grad()
    def qk_clip_(self, scale_H: torch.Tensor) -> None:
        """Shrink head h's logits by scale_H[h] (<= 1) through its q/k projection rows, all heads in one multiply.

        With one key head per query head, both rows are scaled by sqrt(scale).
        Under GQA a key head is shared, so only the query rows are scaled: the
        other heads of the group keep their logits. Works on FSDP2 shards too.
        """
        qk_clip_heads_(self.q_proj.weight, self.k_proj.weight, torch.as_tensor(scale_H, dtype=torch.float32), self.n_kv_heads)
