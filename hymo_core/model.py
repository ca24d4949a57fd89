"""Decoder-only transformer: pre-RMSNorm, RoPE, grouped-query attention, SwiGLU.

The shape of module 8, Lab 2 (seed 001) generalised to GQA: no biases, a
final norm, optional tied embeddings, optional QK-norm, residual output
projections initialised with std / sqrt(2 L) so the residual stream's
variance does not grow with depth. The hot elementwise paths go through
`hymo_core.kernels` (Triton on CUDA, PyTorch elsewhere).

`forward(tokens, targets)` returns `(logits, loss)`, the contract the trainer
relies on (seed 002). With `z_loss > 0` the loss is the regularised
objective; the plain cross-entropy of the last forward is in `model.last_ce`.
Nothing here assumes a single process: no global state, no `.item()` in the
forward, and every parameter is an ordinary module attribute that FSDP2 can
shard.
"""

from __future__ import annotations

import math
import torch
import torch.nn as nn
import torch.nn.functional as F

from hymo_core import kernels, planner
from hymo_core.configs import ModelConfig  # defined torch-free there; part of this module's API
from hymo_core.kernels.logit_probe import causal_max_logits, qk_clip_heads_


def count_parameters(config: ModelConfig) -> int:
    """Parameter count from the config alone; equals the built model's count."""
    return planner.count_parameters(config.shape()).total


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, kernel_backend: str | None = None):
        super().__init__()
        self.eps = eps
        self.kernel_backend = kernel_backend
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.rms_norm(x, self.weight, self.eps, backend=self.kernel_backend)


class Attention(nn.Module):
    """Causal GQA through scaled_dot_product_attention, with an optional logit probe.

    The probe (set `probe = True`) records, per query head, the largest
    |q.k| / sqrt(head_dim) over causally visible pairs of the batch. It runs
    under no_grad on copies, so outputs and gradients are unchanged; QK-Clip
    reads it to decide which heads to rescale.
    """

    def __init__(self, config: ModelConfig, kernel_backend: str | None = None):
        super().__init__()
        self.n_heads, self.n_kv_heads = config.n_heads, config.n_kv_heads
        self.head_dim = config.head_dim
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
        self.max_logit_H: torch.Tensor | None = None

    def forward(self, x_BTD: torch.Tensor, cos_TD2: torch.Tensor, sin_TD2: torch.Tensor) -> torch.Tensor:
        B, T, _ = x_BTD.shape
        H, K = self.n_heads, self.n_kv_heads
        # q, k, v stay separate parameters (Muon orthogonalises each, QK-Clip rescales
        # q and k per head) but run as one matmul: concatenating the small weight is
        # cheaper than two extra activation-sized matmuls and gradient additions.
        w_qkv = torch.cat((self.q_proj.weight, self.k_proj.weight, self.v_proj.weight))
        qkv_BTXD = F.linear(x_BTD, w_qkv).view(B, T, H + 2 * K, self.head_dim)
        if self.q_norm is not None:
            q_BTHD, k_BTKD, v_BTKD = qkv_BTXD.split((H, K, K), dim=2)
            q_BTHD = kernels.apply_rope(self.q_norm(q_BTHD), cos_TD2, sin_TD2, backend=self.kernel_backend)
            k_BTKD = kernels.apply_rope(self.k_norm(k_BTKD), cos_TD2, sin_TD2, backend=self.kernel_backend)
        else:  # one rotation call for queries and keys together
            qk_BTXD = kernels.apply_rope(qkv_BTXD[:, :, : H + K], cos_TD2, sin_TD2, backend=self.kernel_backend)
            q_BTHD, k_BTKD = qk_BTXD.split((H, K), dim=2)
            v_BTKD = qkv_BTXD[:, :, H + K :]
        q_BHTD, k_BKTD, v_BKTD = (t.transpose(1, 2) for t in (q_BTHD, k_BTKD, v_BTKD))
        if self.probe:
            self.max_logit_H = causal_max_logits(q_BHTD, k_BKTD, math.sqrt(self.head_dim))
        y_BHTD = F.scaled_dot_product_attention(q_BHTD, k_BKTD, v_BKTD, is_causal=True, enable_gqa=K != H)
        return self.o_proj(y_BHTD.transpose(1, 2).reshape(B, T, -1))

    @torch.no_grad()
    def qk_clip_(self, scale_H: torch.Tensor) -> None:
        """Shrink head h's logits by scale_H[h] (<= 1) through its q/k projection rows, all heads at once."""
        qk_clip_heads_(self.q_proj.weight, self.k_proj.weight, scale_H, self.n_kv_heads)


class FeedForward(nn.Module):
    def __init__(self, config: ModelConfig, kernel_backend: str | None = None):
        super().__init__()
        self.kernel_backend = kernel_backend
        self.gate_proj = nn.Linear(config.d_model, config.ffn_dim, bias=False)
        self.up_proj = nn.Linear(config.d_model, config.ffn_dim, bias=False)
        self.down_proj = nn.Linear(config.ffn_dim, config.d_model, bias=False)

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        # One matmul for both input projections, as in Attention.
        w_gate_up = torch.cat((self.gate_proj.weight, self.up_proj.weight))
        gate_BTF, up_BTF = F.linear(x_BTD, w_gate_up).chunk(2, dim=-1)
        return self.down_proj(kernels.swiglu(gate_BTF, up_BTF, backend=self.kernel_backend))


class Block(nn.Module):
    def __init__(self, config: ModelConfig, kernel_backend: str | None = None):
        super().__init__()
        self.attn_norm = RMSNorm(config.d_model, config.norm_eps, kernel_backend)
        self.attn = Attention(config, kernel_backend)
        self.ffn_norm = RMSNorm(config.d_model, config.norm_eps, kernel_backend)
        self.ffn = FeedForward(config, kernel_backend)

    def forward(self, x_BTD: torch.Tensor, cos_TD2: torch.Tensor, sin_TD2: torch.Tensor) -> torch.Tensor:
        x_BTD = x_BTD + self.attn(self.attn_norm(x_BTD), cos_TD2, sin_TD2)
        return x_BTD + self.ffn(self.ffn_norm(x_BTD))


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig, kernel_backend: str | None = None):
        """`kernel_backend` is a runtime choice (see hymo_core.kernels), not part of the config."""
        super().__init__()
        self.config = config
        self.kernel_backend = kernel_backend
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(Block(config, kernel_backend) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps, kernel_backend)
        self.output = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        cos_TD2, sin_TD2 = kernels.rope_tables(config.max_seq_len, config.head_dim, config.rope_base)
        # Derived from the config, so not saved: a checkpoint holds only learned state.
        self.register_buffer("rope_cos_TD2", cos_TD2, persistent=False)
        self.register_buffer("rope_sin_TD2", sin_TD2, persistent=False)
        self.last_ce: torch.Tensor | None = None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        std = self.config.init_std
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=std)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)
        # Each layer adds two residual branches; scaling their output projections by
        # 1/sqrt(2L) keeps the stream's variance roughly depth-independent at init.
        residual_std = std / math.sqrt(2 * self.config.n_layers)
        for block in self.layers:
            nn.init.normal_(block.attn.o_proj.weight, std=residual_std)
            nn.init.normal_(block.ffn.down_proj.weight, std=residual_std)

    def forward(
        self, tokens_BT: torch.Tensor, targets_BT: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, T = tokens_BT.shape
        if T > self.config.max_seq_len:
            raise ValueError(f"sequence length {T} exceeds max_seq_len {self.config.max_seq_len}")
        x_BTD = self.tok_embeddings(tokens_BT)
        for block in self.layers:
            x_BTD = block(x_BTD, self.rope_cos_TD2, self.rope_sin_TD2)
        logits_BTV = self.output(self.norm(x_BTD))
        if targets_BT is None:
            return logits_BTV, None
        loss, ce = kernels.cross_entropy_loss(
            logits_BTV.reshape(B * T, -1),
            targets_BT.reshape(B * T),
            z_loss=self.config.z_loss,
            backend=self.kernel_backend,
        )
        self.last_ce = ce.detach()
        return logits_BTV, loss

    def set_attention_probe(self, enabled: bool) -> None:
        for block in self.layers:
            block.attn.probe = enabled
            if not enabled:
                block.attn.max_logit_H = None

    def attention_max_logits(self) -> torch.Tensor:
        """(n_layers, n_heads) maxima from the last probed forward."""
        maxima = [block.attn.max_logit_H for block in self.layers]
        if any(m is None for m in maxima):
            raise RuntimeError("no probe data: call set_attention_probe(True) and run a forward")
        return torch.stack(maxima)
