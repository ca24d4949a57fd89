"""Gated DeltaNet mixer (kind "G"; Yang, Kautz & Hatamizadeh 2024), named as in flash-linear-attention.

    q, k, v = silu(short_conv(x W_q/k/v));  q, k L2-normalised per head   (one op: kernels/causal_conv1d.py)
    log a_t = -exp(A_log) * softplus(x W_a + dt_bias)       (per head, a_t in (0, 1); kernels/gdn_gates.py)
    b_t     = sigmoid(x W_b)
    o       = gated_delta_rule(q, k, v, log a, b)           (hymo_core/kernels/gdn.py)
    y       = W_o (RMSNorm(o) * silu(x W_g))                 (gated RMSNorm, per head)

A_log and dt_bias are 1-D, so the optimizer's rules put them on AdamW without
decay (seed 000 lists `.A_log` / `.dt_bias` there by name). The cache is the
conv's last (conv_size - 1) inputs plus the recurrent state: constant size,
whatever the context length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from hymo_core import kernels
from hymo_core.models.configs import ModelConfig
from hymo_core.kernels.causal_conv1d import causal_conv1d_qkv
from hymo_core.kernels.gdn import gated_delta_rule
from hymo_core.kernels.gdn_gates import gdn_gates
from hymo_core.models.layers.context import MixerContext
from hymo_core.models.layers.norm import RMSNorm


@dataclass
class GDNCache:
    conv_tail_BCW: torch.Tensor  # last conv_size - 1 pre-conv q|k|v inputs
    state_BHKV: torch.Tensor  # fp32


class GatedDeltaNet(nn.Module):
    def __init__(self, config: ModelConfig, kernel_backend: str | None = None):
        super().__init__()
        self.n_heads = config.gdn_heads
        self.head_k_dim = config.gdn_key_head_dim
        self.head_v_dim = config.gdn_value_head_dim
        self.conv_size = config.gdn_conv_size
        self.kernel_backend = kernel_backend
        d, H = config.d_model, self.n_heads
        key_dim, value_dim = H * self.head_k_dim, H * self.head_v_dim
        self.q_proj = nn.Linear(d, key_dim, bias=False)
        self.k_proj = nn.Linear(d, key_dim, bias=False)
        self.v_proj = nn.Linear(d, value_dim, bias=False)
        self.a_proj = nn.Linear(d, H, bias=False)
        self.b_proj = nn.Linear(d, H, bias=False)
        self.g_proj = nn.Linear(d, value_dim, bias=False)
        self.o_proj = nn.Linear(value_dim, d, bias=False)
        # depthwise causal convolutions, (channels, 1, width) weights
        self.q_conv1d = nn.Conv1d(key_dim, key_dim, self.conv_size, groups=key_dim, bias=False)
        self.k_conv1d = nn.Conv1d(key_dim, key_dim, self.conv_size, groups=key_dim, bias=False)
        self.v_conv1d = nn.Conv1d(value_dim, value_dim, self.conv_size, groups=value_dim, bias=False)
        self.A_log = nn.Parameter(torch.zeros(H))
        self.dt_bias = nn.Parameter(torch.zeros(H))
        self.o_norm = RMSNorm(self.head_v_dim, config.norm_eps, kernel_backend)
        self.init_extra_parameters()

    def residual_weights(self) -> list[nn.Parameter]:
        return [self.o_proj.weight]

    @torch.no_grad()
    def init_extra_parameters(self, generator: torch.Generator | None = None) -> None:
        """Mamba-2 / GDN init: decay rates A ~ U(0, 16), time steps dt log-uniform in [1e-3, 0.1];
        the convolutions as nn.Conv1d initialises them (kaiming-uniform, a = sqrt(5))."""
        for conv in (self.q_conv1d, self.k_conv1d, self.v_conv1d):
            nn.init.kaiming_uniform_(conv.weight, a=math.sqrt(5), generator=generator)
        self.A_log.copy_(torch.empty_like(self.A_log).uniform_(0, 16, generator=generator).clamp(min=1e-4).log())
        rand_H = torch.rand(self.dt_bias.shape, generator=generator, dtype=self.dt_bias.dtype, device=self.dt_bias.device)
        dt_H = (rand_H * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)).exp().clamp(min=1e-4)
        self.dt_bias.copy_(dt_H + torch.log(-torch.expm1(-dt_H)))  # inverse softplus

    def new_cache(self, batch_size: int, device: torch.device, dtype: torch.dtype) -> GDNCache:
        channels = self.q_conv1d.in_channels * 2 + self.v_conv1d.in_channels
        return GDNCache(torch.zeros(batch_size, channels, self.conv_size - 1, device=device, dtype=dtype),
                        torch.zeros(batch_size, self.n_heads, self.head_k_dim, self.head_v_dim, device=device,
                                    dtype=torch.float32))

    def short_conv(self, qkv_BTC: torch.Tensor, cache: GDNCache | None,
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q, k, v): causal depthwise conv of q|k|v continuing the cache's tail, SiLU, q and k L2-normalised per
        head in fp32; one op (kernels/causal_conv1d.py) that reads the projection's output in place."""
        q_BTX, k_BTX, v_BTX = causal_conv1d_qkv(qkv_BTC, self.q_conv1d.weight, self.k_conv1d.weight,
                                                self.v_conv1d.weight, self.head_k_dim,
                                                cache.conv_tail_BCW if cache is not None else None,
                                                backend=self.kernel_backend)
        if cache is not None:  # the last conv_size - 1 inputs, the tail included while T is shorter than that
            x_BCT = torch.cat((cache.conv_tail_BCW.to(qkv_BTC.dtype), qkv_BTC.transpose(1, 2)), dim=2)
            cache.conv_tail_BCW = x_BCT[:, :, x_BCT.shape[2] - (self.conv_size - 1):].detach()
        return q_BTX, k_BTX, v_BTX

    def forward(self, x_BTD: torch.Tensor, ctx: MixerContext) -> torch.Tensor:
        B, T, _ = x_BTD.shape
        H, K, V = self.n_heads, self.head_k_dim, self.head_v_dim
        w_in = torch.cat((self.q_proj.weight, self.k_proj.weight, self.v_proj.weight, self.g_proj.weight,
                          self.a_proj.weight, self.b_proj.weight))
        qkv_BTC, gate_BTX, a_BTH, b_BTH = F.linear(x_BTD, w_in).split((2 * H * K + H * V, H * V, H, H), dim=-1)
        q_BTX, k_BTX, v_BTX = self.short_conv(qkv_BTC, ctx.cache)
        q_BTHK, k_BTHK, v_BTHV = q_BTX.view(B, T, H, K), k_BTX.view(B, T, H, K), v_BTX.view(B, T, H, V)
        g_BTH, beta_BTH = gdn_gates(a_BTH, b_BTH, self.A_log, self.dt_bias, backend=self.kernel_backend)
        initial = ctx.cache.state_BHKV if ctx.cache is not None else None
        # One new token (decoding): the recurrent step itself, not a chunked pass padded to a whole chunk.
        backend = "recurrent" if ctx.cache is not None and T == 1 else self.kernel_backend
        o_BTHV, state_BHKV = gated_delta_rule(q_BTHK, k_BTHK, v_BTHV, g_BTH,
                                              beta_BTH, initial_state_BHKV=initial, backend=backend)
        if ctx.cache is not None:
            ctx.cache.state_BHKV = state_BHKV.detach()
        gate_BTHV = gate_BTX.view(B, T, H, V)
        y_BTHV = kernels.swiglu(gate_BTHV, self.o_norm(o_BTHV), backend=self.kernel_backend)  # norm(o) * silu(gate)
        return self.o_proj(y_BTHV.reshape(B, T, H * V))
