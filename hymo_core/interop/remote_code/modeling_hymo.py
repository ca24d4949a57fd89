"""The HyMo hybrid for transformers: plain-PyTorch inference, shipped inside each export.

Loaded with `AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)`. It needs only
torch and transformers; the math is HyMo's (hymo_core/models/layers), written out here for
inference alone:

    x = x + mixer(attn_norm(x));  x = x + ffn(ffn_norm(x))      per layer, pre-RMSNorm
    mixer "A": GQA softmax attention with RoPE (optional per-head QK-norm before RoPE)
    mixer "G": Gated DeltaNet in fp32 (state K x V per head), short causal conv: a prompt in chunks of
               CHUNK tokens (matmuls inside a chunk, the state walked once per chunk: `gated_delta_chunk`),
               one generated token as the recurrent step
    mixer "M": Multi-head Latent Attention (DeepSeek-V2), decoupled shared RoPE key
    ffn: SwiGLU, or DeepSeekMoE (routed + shared experts; the gate bias picks experts only)

Multi-token prediction is training-only and not exported. Generation keeps a cache per layer
(keys/values, MLA latents, conv tail + recurrent state), so each new token costs one step.
Left padding is exact: padded positions feed zeros into Gated DeltaNet (its state stays 0),
are masked out of attention, and RoPE positions count real tokens only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

try:
    from .configuration_hymo import HymoConfig
except ImportError:  # loaded as a plain module, beside its config
    from configuration_hymo import HymoConfig


CHUNK = 64  # tokens per Gated DeltaNet chunk


def gated_delta_chunk(q_BHCK: torch.Tensor, k_BHCK: torch.Tensor, v_BHCV: torch.Tensor, g_BHC: torch.Tensor, beta_BHC: torch.Tensor,
                      h_BHKV: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk of the gated delta rule (fp32; q already scaled, g the log decays), the WY/UT form HyMo
    trains with. With G the cumulative log decay inside the chunk and Gamma = exp G, the per-token updates
    u_t = b_t (v_t - a_t h_{t-1}^T k_t) solve (I + A) U = diag(b) V - diag(b Gamma) K h0, where
    A_ts = b_t Gamma_t / Gamma_s k_t.k_s for s < t; then O = diag(Gamma) Q h0 + (Gamma_t / Gamma_s Q K^T, s <= t) U
    and h1 = Gamma_C h0 + (diag(Gamma_C / Gamma) K)^T U. Returns (o (B, H, C, V), h1)."""
    C = k_BHCK.shape[-2]
    G_BHC = g_BHC.cumsum(-1)
    causal_CC = torch.ones(C, C, dtype=torch.bool, device=k_BHCK.device).tril()
    decay_BHCC = (G_BHC[..., :, None] - G_BHC[..., None, :]).masked_fill(~causal_CC, float("-inf")).exp()
    strict_CC = torch.ones(C, C, dtype=k_BHCK.dtype, device=k_BHCK.device).tril(-1)
    A_BHCC = beta_BHC[..., :, None] * strict_CC * decay_BHCC * (k_BHCK @ k_BHCK.transpose(-1, -2))
    eye_CC = torch.eye(C, dtype=k_BHCK.dtype, device=k_BHCK.device)
    Gamma_BHC = G_BHC.exp()
    rhs = beta_BHC[..., None] * (v_BHCV - Gamma_BHC[..., None] * (k_BHCK @ h_BHKV))
    U_BHCV = torch.linalg.solve_triangular(eye_CC + A_BHCC, rhs, upper=False, unitriangular=True)
    o_BHCV = (q_BHCK * Gamma_BHC[..., None]) @ h_BHKV + (decay_BHCC * (q_BHCK @ k_BHCK.transpose(-1, -2))) @ U_BHCV
    k_decayed_BHCK = k_BHCK * (G_BHC[..., -1:] - G_BHC).exp()[..., None]
    h_BHKV = Gamma_BHC[..., -1, None, None] * h_BHKV + k_decayed_BHCK.transpose(-1, -2) @ U_BHCV
    return o_BHCV, h_BHKV


def gated_delta_rule(q_BTHK: torch.Tensor, k_BTHK: torch.Tensor, v_BTHV: torch.Tensor, g_BTH: torch.Tensor, beta_BTH: torch.Tensor,
                     h_BHKV: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """o_t = h_t^T q_t after h_t = a_t h_{t-1} + k_t b_t (v_t - a_t h_{t-1}^T k_t), over T tokens in chunks of CHUNK
    (a ragged tail padded with k = v = 0, b = 0, g = 0, which leaves the state as it is). fp32 in, fp32 out."""
    B, T, H, _ = k_BTHK.shape
    pad = -T % CHUNK

    def heads_first(x: torch.Tensor) -> torch.Tensor:
        x = x.transpose(1, 2)
        return F.pad(x, (0, 0) * (x.ndim - 3) + (0, pad)) if pad else x

    q, k, v, g, beta = (heads_first(x) for x in (q_BTHK, k_BTHK, v_BTHV, g_BTH, beta_BTH))
    outputs = []
    for start in range(0, T + pad, CHUNK):
        window = slice(start, start + CHUNK)
        o_BHCV, h_BHKV = gated_delta_chunk(q[:, :, window], k[:, :, window], v[:, :, window], g[:, :, window], beta[:, :, window], h_BHKV)
        outputs.append(o_BHCV)
    return torch.cat(outputs, dim=2)[:, :, :T].transpose(1, 2), h_BHKV


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rotate(x_BTHD: torch.Tensor, cos_BTD2: torch.Tensor, sin_BTD2: torch.Tensor) -> torch.Tensor:
    """Half-split RoPE (GPT-NeoX / Llama layout) in fp32, per-row positions already gathered."""
    half = x_BTHD.shape[-1] // 2
    x = x_BTHD.float()
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos_BTD2[:, :, None, :], sin_BTD2[:, :, None, :]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x_BTHD.dtype)


@dataclass
class Step:
    """What every mixer of one forward shares: positions, masks, and the layer caches."""

    cos_BTD2: torch.Tensor
    sin_BTD2: torch.Tensor
    positions_BT: torch.Tensor
    token_mask_BT: torch.Tensor | None  # True = real token (None: no padding)
    key_mask_BS: torch.Tensor | None  # over every position so far, cached ones included
    past: int  # positions (padded) already in the cache
    cache: "HymoCache | None"
    rope_cos: torch.Tensor = None
    rope_sin: torch.Tensor = None


class HymoCache:
    """Per-layer decode state; `seen` counts (padded) positions consumed, as generate expects."""

    is_compileable = False

    def __init__(self, n_layers: int):
        self.layers: list[dict[str, Any]] = [{} for _ in range(n_layers)]
        self.seen = 0

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen


def attend(q_BHTD, k_BHSD, v_BHSD, step: Step, gqa: bool) -> torch.Tensor:
    T, S = q_BHTD.shape[2], k_BHSD.shape[2]
    if step.key_mask_BS is None and step.past == 0:
        return F.scaled_dot_product_attention(q_BHTD, k_BHSD, v_BHSD, is_causal=True, enable_gqa=gqa)
    query_index_T1 = torch.arange(S - T, S, device=q_BHTD.device)[:, None]
    key_index_1S = torch.arange(S, device=q_BHTD.device)[None, :]
    mask_BTS = (key_index_1S <= query_index_T1)[None].expand(q_BHTD.shape[0], T, S)
    if step.key_mask_BS is not None:
        # a padded query sees only itself, so its (unused) row stays finite
        mask_BTS = (mask_BTS & step.key_mask_BS[:, None, :]) | (key_index_1S == query_index_T1)[None]
    return F.scaled_dot_product_attention(q_BHTD, k_BHSD, v_BHSD, attn_mask=mask_BTS[:, None], enable_gqa=gqa)


def append(entry: dict[str, Any], **tensors: torch.Tensor) -> dict[str, torch.Tensor]:
    """Concatenate new positions (dim 1) onto a layer's cached tensors; returns the full tensors."""
    for name, value in tensors.items():
        entry[name] = value if name not in entry else torch.cat((entry[name], value), dim=1)
    return {name: entry[name] for name in tensors}


class Attention(nn.Module):
    """Mixer "A"."""

    def __init__(self, config: HymoConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.n_heads, self.n_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        d = config.hidden_size
        self.q_proj = nn.Linear(d, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d, self.n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, self.n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, d, bias=False)
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x_BTD: torch.Tensor, step: Step) -> torch.Tensor:
        B, T, _ = x_BTD.shape
        q = self.q_proj(x_BTD).view(B, T, self.n_heads, self.head_dim)
        k = self.k_proj(x_BTD).view(B, T, self.n_kv_heads, self.head_dim)
        v = self.v_proj(x_BTD).view(B, T, self.n_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotate(q, step.cos_BTD2, step.sin_BTD2), rotate(k, step.cos_BTD2, step.sin_BTD2)
        if step.cache is not None:
            full = append(step.cache.layers[self.layer], k=k, v=v)
            k, v = full["k"], full["v"]
        y = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), step, self.n_kv_heads != self.n_heads)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class GatedDeltaNet(nn.Module):
    """Mixer "G": o = gated_delta_rule(q, k, v, log a, b); y = o_proj(RMSNorm(o) * silu(g_proj x))."""

    def __init__(self, config: HymoConfig, layer: int):
        super().__init__()
        self.layer = layer
        gdn = config.gdn
        self.n_heads, self.head_k_dim, self.head_v_dim = gdn["heads"], gdn["key_head_dim"], gdn["value_head_dim"]
        self.conv_size = gdn["conv_size"]
        d, H = config.hidden_size, self.n_heads
        key_dim, value_dim = H * self.head_k_dim, H * self.head_v_dim
        self.q_proj = nn.Linear(d, key_dim, bias=False)
        self.k_proj = nn.Linear(d, key_dim, bias=False)
        self.v_proj = nn.Linear(d, value_dim, bias=False)
        self.a_proj = nn.Linear(d, H, bias=False)
        self.b_proj = nn.Linear(d, H, bias=False)
        self.g_proj = nn.Linear(d, value_dim, bias=False)
        self.o_proj = nn.Linear(value_dim, d, bias=False)
        self.q_conv1d = nn.Conv1d(key_dim, key_dim, self.conv_size, groups=key_dim, bias=False)
        self.k_conv1d = nn.Conv1d(key_dim, key_dim, self.conv_size, groups=key_dim, bias=False)
        self.v_conv1d = nn.Conv1d(value_dim, value_dim, self.conv_size, groups=value_dim, bias=False)
        self.A_log = nn.Parameter(torch.zeros(H))
        self.dt_bias = nn.Parameter(torch.zeros(H))
        self.o_norm = RMSNorm(self.head_v_dim, config.rms_norm_eps)

    def short_conv(self, qkv_BTC: torch.Tensor, entry: dict | None) -> torch.Tensor:
        x_BCT = qkv_BTC.transpose(1, 2)
        W = self.conv_size - 1
        tail = entry.get("conv_tail") if entry is not None else None
        if tail is None:
            tail = x_BCT.new_zeros(*x_BCT.shape[:2], W)
        x_BCT = torch.cat((tail.to(x_BCT.dtype), x_BCT), dim=2)
        if entry is not None:
            entry["conv_tail"] = x_BCT[:, :, x_BCT.shape[2] - W:]
        w_C1W = torch.cat((self.q_conv1d.weight, self.k_conv1d.weight, self.v_conv1d.weight))
        return F.silu(F.conv1d(x_BCT, w_C1W, groups=w_C1W.shape[0])).transpose(1, 2)

    def forward(self, x_BTD: torch.Tensor, step: Step) -> torch.Tensor:
        B, T, _ = x_BTD.shape
        H, K, V = self.n_heads, self.head_k_dim, self.head_v_dim
        if step.token_mask_BT is not None:  # padded positions feed zeros: the state stays untouched
            x_BTD = x_BTD * step.token_mask_BT[..., None].to(x_BTD.dtype)
        entry = step.cache.layers[self.layer] if step.cache is not None else None
        qkv = torch.cat((self.q_proj(x_BTD), self.k_proj(x_BTD), self.v_proj(x_BTD)), dim=-1)
        q, k, v = self.short_conv(qkv, entry).split((H * K, H * K, H * V), dim=-1)
        q = F.normalize(q.reshape(B, T, H, K).float(), dim=-1).to(v.dtype).float()
        k = F.normalize(k.reshape(B, T, H, K).float(), dim=-1).to(v.dtype).float()
        v_BTHV = v.reshape(B, T, H, V)
        g_BTH = -self.A_log.float().exp() * F.softplus(self.a_proj(x_BTD).float() + self.dt_bias.float())  # log decay
        beta_BTH = torch.sigmoid(self.b_proj(x_BTD).float())
        state = entry.get("state") if entry is not None else None
        h_BHKV = state if state is not None else q.new_zeros(B, H, K, V)
        scale = K ** -0.5
        vf = v_BTHV.float()
        if T == 1:  # one generated token: the recurrent step  h <- a h;  u = b (v - h^T k);  h <- h + k u^T;  o = h^T (scale q)
            h_BHKV = h_BHKV * g_BTH[:, 0, :, None, None].exp()
            u_BHV = beta_BTH[:, 0, :, None] * (vf[:, 0] - torch.einsum("bhkv,bhk->bhv", h_BHKV, k[:, 0]))
            h_BHKV = h_BHKV + k[:, 0, :, :, None] * u_BHV[:, :, None, :]
            o_BTHV = torch.einsum("bhkv,bhk->bhv", h_BHKV, q[:, 0] * scale)[:, None]
        else:
            o_BTHV, h_BHKV = gated_delta_rule(q * scale, k, vf, g_BTH, beta_BTH, h_BHKV)
        if entry is not None:
            entry["state"] = h_BHKV
        o_BTHV = o_BTHV.to(v_BTHV.dtype)
        gate_BTHV = self.g_proj(x_BTD).view(B, T, H, V)
        y = (F.silu(gate_BTHV.float()) * self.o_norm(o_BTHV).float()).to(x_BTD.dtype)
        return self.o_proj(y.reshape(B, T, H * V))


class MultiHeadLatentAttention(nn.Module):
    """Mixer "M": keys and values rebuilt from a cached latent; one rotary key shared by all heads."""

    def __init__(self, config: HymoConfig, layer: int):
        super().__init__()
        self.layer = layer
        mla = config.mla
        self.n_heads = config.num_attention_heads
        self.nope_dim, self.rope_dim, self.v_dim = mla["nope_dim"], mla["rope_dim"], mla["v_dim"]
        self.qk_dim, self.kv_rank = self.nope_dim + self.rope_dim, mla["kv_rank"]
        d, H, eps = config.hidden_size, self.n_heads, config.rms_norm_eps
        self.q_a_proj = nn.Linear(d, mla["q_rank"], bias=False)
        self.q_a_norm = RMSNorm(mla["q_rank"], eps)
        self.q_b_proj = nn.Linear(mla["q_rank"], H * self.qk_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(d, self.kv_rank + self.rope_dim, bias=False)
        self.kv_a_norm = RMSNorm(self.kv_rank, eps)
        self.kv_b_proj = nn.Linear(self.kv_rank, H * (self.nope_dim + self.v_dim), bias=False)
        self.wo = nn.Linear(H * self.v_dim, d, bias=False)
        if config.qk_norm:
            self.q_norm, self.k_norm = RMSNorm(self.qk_dim, eps), RMSNorm(self.qk_dim, eps)
        else:
            self.q_norm = self.k_norm = None

    def rotate_tail(self, x_BTHX: torch.Tensor, cos_BTD2: torch.Tensor, sin_BTD2: torch.Tensor) -> torch.Tensor:
        nope, rope = x_BTHX.split((self.nope_dim, self.rope_dim), dim=-1)
        return torch.cat((nope, rotate(rope, cos_BTD2, sin_BTD2)), dim=-1)

    def forward(self, x_BTD: torch.Tensor, step: Step) -> torch.Tensor:
        B, T, _ = x_BTD.shape
        H = self.n_heads
        q = self.q_b_proj(self.q_a_norm(self.q_a_proj(x_BTD))).view(B, T, H, self.qk_dim)
        latent, k_rope = self.kv_a_proj_with_mqa(x_BTD).split((self.kv_rank, self.rope_dim), dim=-1)
        latent = self.kv_a_norm(latent)
        positions = step.positions_BT
        if step.cache is not None:
            full = append(step.cache.layers[self.layer], latent=latent, k_rope=k_rope, positions=positions)
            latent, k_rope, positions = full["latent"], full["k_rope"], full["positions"]
        S = latent.shape[1]
        k_nope, v = self.kv_b_proj(latent).view(B, S, H, self.nope_dim + self.v_dim).split((self.nope_dim, self.v_dim), dim=-1)
        k = torch.cat((k_nope, k_rope[:, :, None, :].expand(B, S, H, self.rope_dim)), dim=-1)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = self.rotate_tail(q, step.cos_BTD2, step.sin_BTD2)
        k = self.rotate_tail(k, step.rope_cos[positions], step.rope_sin[positions])
        y = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), step, False)
        return self.wo(y.transpose(1, 2).reshape(B, T, H * self.v_dim))


class FeedForward(nn.Module):
    def __init__(self, config: HymoConfig):
        super().__init__()
        d, f = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj((F.silu(self.gate_proj(x).float()) * self.up_proj(x).float()).to(x.dtype))


class StackedWeight(nn.Module):
    def __init__(self, n_experts: int, out_features: int, in_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_experts, out_features, in_features))


class RoutedExperts(nn.Module):
    def __init__(self, n_experts: int, d_model: int, expert_dim: int):
        super().__init__()
        self.w1 = StackedWeight(n_experts, expert_dim, d_model)
        self.w2 = StackedWeight(n_experts, d_model, expert_dim)
        self.w3 = StackedWeight(n_experts, expert_dim, d_model)


class SharedExpert(nn.Module):
    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(d_model, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d_model, bias=False)
        self.w3 = nn.Linear(d_model, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MoE(nn.Module):
    """DeepSeekMoE: top-k of (scores + bias) choose, unbiased scores weigh; a shared expert always on."""

    def __init__(self, config: HymoConfig):
        super().__init__()
        moe = config.moe
        self.n_experts, self.top_k = moe["routed"], moe["activated"]
        self.score_function, self.route_scale = moe["score_function"], moe["route_scale"]
        self.capacity_factor = moe["capacity_factor"]
        d = config.hidden_size
        self.gate = nn.Linear(d, self.n_experts, bias=False)
        self.experts = RoutedExperts(self.n_experts, d, moe["expert_dim"])
        self.shared_expert = SharedExpert(d, moe["shared"] * moe["expert_dim"]) if moe["shared"] else None
        self.register_buffer("expert_bias", torch.zeros(self.n_experts))

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        B, T, D = x_BTD.shape
        E, K = self.n_experts, self.top_k
        x_ND = x_BTD.reshape(B * T, D)
        scores = self.gate(x_ND).float()
        scores = scores.sigmoid() if self.score_function == "sigmoid" else scores.softmax(dim=-1)
        _, experts_NK = (scores + self.expert_bias).topk(K, dim=-1)
        weights_NK = scores.gather(1, experts_NK)
        if self.score_function == "sigmoid" and K > 1:
            weights_NK = weights_NK / weights_NK.sum(dim=-1, keepdim=True)
        weights_NK = weights_NK * self.route_scale
        flat = experts_NK.reshape(-1)
        order = torch.argsort(flat, stable=True)
        if self.capacity_factor > 0:  # each expert keeps its first ceil(cf * N * k / E) assignments
            counts = torch.bincount(flat, minlength=E)
            capacity = math.ceil(self.capacity_factor * order.numel() / E)
            expert_of_sorted = torch.repeat_interleave(torch.arange(E, device=x_ND.device), counts)
            rank = torch.arange(order.numel(), device=x_ND.device) - (torch.cumsum(counts, 0) - counts)[expert_of_sorted]
            order = order[torch.nonzero(rank < capacity).squeeze(1)]
        token_of = order // K
        sorted_counts = torch.bincount(flat[order], minlength=E).tolist()
        outputs = []
        for e, x_sD in enumerate(x_ND[token_of].split(sorted_counts)):
            if x_sD.shape[0]:
                w = self.experts
                outputs.append((F.silu(x_sD @ w.w1.weight[e].T) * (x_sD @ w.w3.weight[e].T)) @ w.w2.weight[e].T)
        y = torch.cat(outputs) if outputs else x_ND.new_zeros(0, D)
        y = y * weights_NK.reshape(-1)[order].unsqueeze(1).to(y.dtype)
        out = x_ND.new_zeros(B * T * K, D).index_copy(0, order, y.to(x_ND.dtype)).view(B * T, K, D).sum(dim=1)
        if self.shared_expert is not None:
            out = out + self.shared_expert(x_ND)
        return out.reshape(B, T, D)


MIXERS = {"A": Attention, "G": GatedDeltaNet, "M": MultiHeadLatentAttention}


class Block(nn.Module):
    def __init__(self, config: HymoConfig, layer: int):
        super().__init__()
        kind = config.layer_kinds[layer]
        self.attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn = MIXERS[kind](config, layer)
        self.ffn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.ffn = MoE(config) if kind in config.moe_kinds else FeedForward(config)

    def forward(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), step)
        return x + self.ffn(self.ffn_norm(x))


class HymoPreTrainedModel(PreTrainedModel):
    config_class = HymoConfig
    base_model_prefix = "model"
    _no_split_modules = ["Block"]

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Weights come from the export; fresh models (from_config) get HyMo's plain init."""
        if isinstance(module, (nn.Linear, nn.Embedding, nn.Conv1d)):
            nn.init.normal_(module.weight, std=0.02)
        elif isinstance(module, StackedWeight):
            nn.init.normal_(module.weight, std=0.02)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)
        elif isinstance(module, MoE):
            module.expert_bias.zero_()
        elif isinstance(module, GatedDeltaNet):
            module.A_log.zero_()
            module.dt_bias.zero_()


class HymoModel(HymoPreTrainedModel):
    def __init__(self, config: HymoConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self._rope: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self.post_init()

    def rope_tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 (cos, sin) of angle t * theta^(-2i / rope_dim), computed in fp64 as HyMo does; not weights,
        so built on first use (a from_pretrained model starts on the meta device)."""
        if device not in self._rope:
            dim = self.config.rope_dim
            inv_freq = self.config.rope_theta ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim)
            angles = torch.outer(torch.arange(self.config.max_position_embeddings, dtype=torch.float64, device=device), inv_freq)
            self._rope[device] = (angles.cos().float(), angles.sin().float())
        return self._rope[device]

    def forward(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None,
                cache: HymoCache | None = None, use_cache: bool = False) -> tuple[torch.Tensor, HymoCache | None]:
        B, T = input_ids.shape
        if cache is None and use_cache:
            cache = HymoCache(len(self.layers))
        past = cache.seen if cache is not None else 0
        token_mask = key_mask = None
        if attention_mask is not None and not bool(attention_mask.all()):
            key_mask = attention_mask[:, : past + T].bool()
            token_mask = key_mask[:, past:]
            positions = (key_mask.long().cumsum(-1) - 1).clamp(min=0)[:, past:]
        else:
            positions = torch.arange(past, past + T, device=input_ids.device).expand(B, T)
        rope_cos, rope_sin = self.rope_tables(input_ids.device)
        if int(positions.max()) >= rope_cos.shape[0]:
            raise ValueError(f"position {int(positions.max())} exceeds max_position_embeddings {rope_cos.shape[0]}")
        step = Step(rope_cos[positions], rope_sin[positions], positions, token_mask, key_mask, past, cache, rope_cos, rope_sin)
        x = self.embed_tokens(input_ids)
        for block in self.layers:
            x = block(x, step)
        if cache is not None:
            cache.seen += T
        return self.norm(x), cache


class HymoForCausalLM(HymoPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: HymoConfig):
        super().__init__(config)
        self.model = HymoModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model keeps its own HymoCache (recurrent state and latents are no KV pairs)

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def forward(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None,
                cache: HymoCache | None = None, past_key_values: HymoCache | None = None,
                use_cache: bool | None = None, labels: torch.LongTensor | None = None, **kwargs) -> CausalLMOutputWithPast:
        cache = cache if cache is not None else past_key_values
        hidden, cache = self.model(input_ids, attention_mask, cache, bool(use_cache))
        logits = self.lm_head(hidden)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1),
                                   ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache)

    def prepare_inputs_for_generation(self, input_ids: torch.LongTensor, cache: HymoCache | None = None,
                                      past_key_values: HymoCache | None = None, attention_mask: torch.Tensor | None = None,
                                      use_cache: bool | None = True, **kwargs) -> dict[str, Any]:
        cache = cache if cache is not None else past_key_values
        if cache is not None and cache.seen:
            input_ids = input_ids[:, cache.seen:]
        return {"input_ids": input_ids, "attention_mask": attention_mask, "cache": cache, "use_cache": use_cache}
