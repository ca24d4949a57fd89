"""Multi-head Latent Attention (kind "M"; DeepSeek-V2), with its latent cache, logit probe and QK-Clip.

    q            = q_b_proj(q_a_norm(q_a_proj(x)))                -> per head [q_nope | q_rope]
    [c_kv | k_r] = kv_a_proj_with_mqa(x);  c_kv <- kv_a_norm(c_kv)   (the latent, kv_lora_rank wide)
    [k_nope | v] = kv_b_proj(c_kv)                                 -> per head
    k            = [k_nope | RoPE(k_r)], the rotated part shared by every head
    y            = wo(SDPA(q, k, v, causal))

MLA's heads are nope + rope wide (192 at hymo-750m) for q and k and v_dim (128) for v. The attention
runs at those widths (`attention_layout`): on the CPU and the meta device SDPA takes them as they are,
and on CUDA its cuDNN backend does (sm_90: qk 192 / v 128, a flash-attention kernel) when
`can_use_cudnn_attention` says so. Only where it does not does the call fall back to the FlashAttention
backend, which wants one head dim for q, k and v (a multiple of 8, at most 256): v is zero-padded to the
shared width (q and k too when that is not a multiple of 8) and the output sliced back. Zero value
columns give zero output columns and zero q/k columns add nothing to a score, so the result is the
unpadded one, at (qk + qk) / (qk + v) = 1.2x the attention FLOPs the planner counts (hymo-750m) plus
the pad and slice copies; the softmax scale is passed as 1 / sqrt(nope + rope) explicitly.

RoPE runs on the shared rotary key (B, S, 1, rope) before it is expanded over the heads, not on the
expanded keys (H times the work), except with QK-norm, which normalises whole expanded keys first.

The cache stores only c_kv and the unrotated k_r per position (kv_lora_rank +
qk_rope_head_dim numbers per token and layer, whatever the head count). Cached
decoding never rebuilds keys and values from it: kv_b_proj is absorbed into the
query and output sides (`decode_absorbed`), except with QK-norm, whose per-head
norm of the expanded key does not commute with the absorption. QK-Clip (Kimi K2's MuonClip for MLA):
shrinking head h's logits by gamma scales its q_nope and k_nope rows by
sqrt(gamma) and its q_rope rows by gamma; the shared rotary key is left alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from hymo_core import kernels
from hymo_core.models.configs import ModelConfig
from hymo_core.kernels.logit_probe import scale_rows_
from hymo_core.models.layers.attention import attend, causal_max_logits
from hymo_core.models.layers.context import MixerContext
from hymo_core.models.layers.norm import RMSNorm


FLASH_MAX_HEAD_DIM = 256  # SDPA's flash backend: one head dim for q, k, v, a multiple of 8, at most this


def flash_head_dim(qk_dim: int, v_dim: int) -> int | None:
    """The head dim q, k and v are padded to so the flash backend applies; None when no padding can make it."""
    width = -(-max(qk_dim, v_dim) // 8) * 8
    return width if width <= FLASH_MAX_HEAD_DIM else None


def attend_padded(q_BHTX: torch.Tensor, k_BHSX: torch.Tensor, v_BHSV: torch.Tensor, ctx: MixerContext) -> torch.Tensor:
    """Causal SDPA with the head dims padded to `flash_head_dim`, scaled by the real qk dim, sliced back to v's."""
    qk_dim, v_dim = q_BHTX.shape[-1], v_BHSV.shape[-1]
    width = flash_head_dim(qk_dim, v_dim)
    if width is None:
        return attend(q_BHTX, k_BHSX, v_BHSV, ctx, scale=1.0 / math.sqrt(qk_dim))
    q_BHTX, k_BHSX = (F.pad(t, (0, width - qk_dim)) if width > qk_dim else t for t in (q_BHTX, k_BHSX))
    v_BHSV = F.pad(v_BHSV, (0, width - v_dim)) if width > v_dim else v_BHSV
    return attend(q_BHTX, k_BHSX, v_BHSV, ctx, scale=1.0 / math.sqrt(qk_dim))[..., :v_dim]


def cudnn_takes(q_BHTX: torch.Tensor, k_BHSX: torch.Tensor, v_BHSV: torch.Tensor) -> bool:
    """Whether SDPA's cuDNN backend runs this causal, maskless call at its own head widths (CUDA only)."""
    if not q_BHTX.is_cuda:
        return False
    from torch.backends.cuda import SDPAParams, can_use_cudnn_attention

    return bool(can_use_cudnn_attention(SDPAParams(q_BHTX, k_BHSX, v_BHSV, None, 0.0, True, False)))


def attention_layout(q_BHTX: torch.Tensor, k_BHSX: torch.Tensor, v_BHSV: torch.Tensor, ctx: MixerContext) -> str:
    """"unpadded" (any backend takes the widths: equal, or not CUDA), "cudnn" (CUDA, cuDNN takes them) or "padded"."""
    if q_BHTX.shape[-1] == v_BHSV.shape[-1] or not q_BHTX.is_cuda:
        return "unpadded"
    if ctx.start == 0 and ctx.rows is None and cudnn_takes(q_BHTX, k_BHSX, v_BHSV):
        return "cudnn"
    return "padded"


def attend_mla(q_BHTX: torch.Tensor, k_BHSX: torch.Tensor, v_BHSV: torch.Tensor, ctx: MixerContext) -> torch.Tensor:
    """Causal SDPA of MLA's heads at their true widths where a fast backend takes them, else `attend_padded`."""
    layout = attention_layout(q_BHTX, k_BHSX, v_BHSV, ctx)
    scale = 1.0 / math.sqrt(q_BHTX.shape[-1])
    if layout == "unpadded":
        return attend(q_BHTX, k_BHSX, v_BHSV, ctx, scale=scale)
    if layout == "cudnn":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return attend(q_BHTX, k_BHSX, v_BHSV, ctx, scale=scale)
    return attend_padded(q_BHTX, k_BHSX, v_BHSV, ctx)


@dataclass
class LatentCache:
    latent_BSR: torch.Tensor  # normalised c_kv
    k_rope_BSD: torch.Tensor  # before RoPE (and before QK-norm, when that is on)

    def append(self, ctx: MixerContext, latent_BTR: torch.Tensor, k_rope_BTD: torch.Tensor):
        """Write this forward's positions (start .. start+T-1, or each row's own); return positions 0 .. key_end-1."""
        end = ctx.key_end(latent_BTR.shape[1])
        if end > self.latent_BSR.shape[1]:
            raise ValueError(f"latent cache holds {self.latent_BSR.shape[1]} positions, asked for {end}")
        if ctx.rows is None:
            self.latent_BSR[:, ctx.start:end] = latent_BTR
            self.k_rope_BSD[:, ctx.start:end] = k_rope_BTD
        else:
            self.latent_BSR[ctx.rows.rows_B, ctx.rows.positions_B] = latent_BTR[:, 0]
            self.k_rope_BSD[ctx.rows.rows_B, ctx.rows.positions_B] = k_rope_BTD[:, 0]
        return self.latent_BSR[:, :end], self.k_rope_BSD[:, :end]


class MultiHeadLatentAttention(nn.Module):
    def __init__(self, config: ModelConfig, kernel_backend: str | None = None):
        super().__init__()
        self.n_heads = config.n_heads
        self.nope_dim, self.rope_dim, self.v_dim = config.mla_nope_dim, config.mla_rope_dim, config.mla_v_dim
        self.qk_dim = self.nope_dim + self.rope_dim
        self.kv_rank = config.mla_kv_rank
        self.max_seq_len = config.max_seq_len
        self.kernel_backend = kernel_backend
        d, H = config.d_model, self.n_heads
        self.q_a_proj = nn.Linear(d, config.mla_q_rank, bias=False)
        self.q_a_norm = RMSNorm(config.mla_q_rank, config.norm_eps, kernel_backend)
        self.q_b_proj = nn.Linear(config.mla_q_rank, H * self.qk_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(d, self.kv_rank + self.rope_dim, bias=False)
        self.kv_a_norm = RMSNorm(self.kv_rank, config.norm_eps, kernel_backend)
        self.kv_b_proj = nn.Linear(self.kv_rank, H * (self.nope_dim + self.v_dim), bias=False)
        self.wo = nn.Linear(H * self.v_dim, d, bias=False)
        if config.qk_norm:  # per head over the whole q/k head, before RoPE (as in Attention)
            self.q_norm = RMSNorm(self.qk_dim, config.norm_eps, kernel_backend)
            self.k_norm = RMSNorm(self.qk_dim, config.norm_eps, kernel_backend)
        else:
            self.q_norm = self.k_norm = None
        self.probe = False
        self.probe_skip_below: float | None = None  # QK-Clip's threshold on steps that only clip (logit_probe.py)
        self.max_logit_H: torch.Tensor | None = None

    def residual_weights(self) -> list[nn.Parameter]:
        return [self.wo.weight]

    def new_cache(self, batch_size: int, device: torch.device, dtype: torch.dtype) -> LatentCache:
        return LatentCache(torch.zeros(batch_size, self.max_seq_len, self.kv_rank, device=device, dtype=dtype),
                           torch.zeros(batch_size, self.max_seq_len, self.rope_dim, device=device, dtype=dtype))

    def rotate(self, x_BTHX: torch.Tensor, ctx: MixerContext, from_zero: bool = False) -> torch.Tensor:
        """RoPE on the last rope_dim features of each head, after the optional QK-norm: at this forward's
        positions (queries), or `from_zero` for keys laid out from position 0 (the whole cache)."""
        nope, rope = x_BTHX.split((self.nope_dim, self.rope_dim), dim=-1)
        rope = self.rotate_from_zero(rope, ctx) if from_zero else ctx.rotate(rope, self.kernel_backend)
        return torch.cat((nope, rope), dim=-1)

    def rotate_from_zero(self, x_BSHD: torch.Tensor, ctx: MixerContext) -> torch.Tensor:
        return kernels.apply_rope(x_BSHD, ctx.cos_TD2, ctx.sin_TD2, backend=self.kernel_backend)

    def forward(self, x_BTD: torch.Tensor, ctx: MixerContext) -> torch.Tensor:
        B, T, _ = x_BTD.shape
        H = self.n_heads
        q_BTHX = self.q_b_proj(self.q_a_norm(self.q_a_proj(x_BTD))).view(B, T, H, self.qk_dim)
        latent_BTR, k_rope_BTD = self.kv_a_proj_with_mqa(x_BTD).split((self.kv_rank, self.rope_dim), dim=-1)
        latent_BTR = self.kv_a_norm(latent_BTR)
        if ctx.cache is not None:
            latent_BTR, k_rope_BTD = ctx.cache.append(ctx, latent_BTR, k_rope_BTD)
            if self.q_norm is None:  # QK-norm normalises whole expanded keys: nothing to absorb then
                return self.decode_absorbed(q_BTHX, latent_BTR, k_rope_BTD, ctx)
        S = latent_BTR.shape[1]  # key positions: 0 .. start + T - 1
        k_nope_BSHN, v_BSHV = self.kv_b_proj(latent_BTR).view(B, S, H, self.nope_dim + self.v_dim).split(
            (self.nope_dim, self.v_dim), dim=-1)
        if self.q_norm is None:  # RoPE once on the shared rotary key, then expanded over the heads (keys start at 0)
            k_rope_BS1D = self.rotate_from_zero(k_rope_BTD[:, :, None, :], ctx)
            k_BSHX = torch.cat((k_nope_BSHN, k_rope_BS1D.expand(B, S, H, self.rope_dim)), dim=-1)
        else:  # QK-norm normalises whole expanded keys before RoPE
            k_BSHX = torch.cat((k_nope_BSHN, k_rope_BTD[:, :, None, :].expand(B, S, H, self.rope_dim)), dim=-1)
            q_BTHX, k_BSHX = self.q_norm(q_BTHX), self.k_norm(k_BSHX)
            k_BSHX = self.rotate(k_BSHX, ctx, from_zero=True)
        q_BTHX = self.rotate(q_BTHX, ctx)
        q_BHTX, k_BHSX, v_BHSV = (t.transpose(1, 2) for t in (q_BTHX, k_BSHX, v_BSHV))
        if ctx.cache is None and self.probe:
            self.max_logit_H = causal_max_logits(q_BHTX, k_BHSX, math.sqrt(self.qk_dim), skip_below=self.probe_skip_below)
        y_BHTV = attend_mla(q_BHTX, k_BHSX, v_BHSV, ctx)
        return self.wo(y_BHTV.transpose(1, 2).reshape(B, T, H * self.v_dim))

    def decode_absorbed(self, q_BTHX: torch.Tensor, latent_BSR: torch.Tensor, k_rope_BSD: torch.Tensor,
                        ctx: MixerContext) -> torch.Tensor:
        """Cached attention in the latent space (DeepSeek-V2's weight absorption).

        kv_b_proj = [W_uk; W_uv] per head is folded into the query (q_nope W_uk: the query in latent
        coordinates, scored against c_kv directly) and into the output (the latent-space context times
        W_uv, then wo), so no step re-expands keys or values over the whole cache: a step costs
        O(S (kv_rank + rope_dim)) per head instead of O(S kv_rank (nope + v)) for the expansion.
        """
        B, T, H, _ = q_BTHX.shape
        S = latent_BSR.shape[1]
        w_HXR = self.kv_b_proj.weight.view(H, self.nope_dim + self.v_dim, self.kv_rank)
        w_uk_HNR, w_uv_HVR = w_HXR.split((self.nope_dim, self.v_dim), dim=1)
        q_nope_BTHN, q_rope_BTHD = q_BTHX.split((self.nope_dim, self.rope_dim), dim=-1)
        q_latent_BTHR = torch.einsum("bthn,hnr->bthr", q_nope_BTHN, w_uk_HNR.to(q_nope_BTHN.dtype))
        q_rope_BTHD = ctx.rotate(q_rope_BTHD, self.kernel_backend)
        k_rope_BS1D = self.rotate_from_zero(k_rope_BSD[:, :, None, :], ctx)
        scores_BHTS = (torch.einsum("bthr,bsr->bhts", q_latent_BTHR, latent_BSR.to(q_latent_BTHR.dtype))
                       + torch.einsum("bthd,bsd->bhts", q_rope_BTHD, k_rope_BS1D[:, :, 0].to(q_rope_BTHD.dtype)))
        if ctx.rows is not None:  # one query per row at its own position
            visible = ctx.rows.visible_B11S
        else:
            visible = (torch.arange(S, device=q_BTHX.device)[None, :]
                       <= torch.arange(ctx.start, ctx.start + T, device=q_BTHX.device)[:, None])
        scores_BHTS = (scores_BHTS.float() / math.sqrt(self.qk_dim)).masked_fill(~visible, float("-inf"))
        p_BHTS = scores_BHTS.softmax(dim=-1).to(latent_BSR.dtype)
        context_BTHR = torch.einsum("bhts,bsr->bthr", p_BHTS, latent_BSR)
        y_BTHV = torch.einsum("bthr,hvr->bthv", context_BTHR, w_uv_HVR.to(context_BTHR.dtype))
        return self.wo(y_BTHV.reshape(B, T, H * self.v_dim))

    @torch.no_grad()
    def qk_clip_(self, scale_H) -> None:
        """Shrink head h's logits by scale_H[h] (<= 1): q_nope, k_nope by sqrt, q_rope by the full scale."""
        self.qk_clip_all_([self], torch.as_tensor(scale_H, dtype=torch.float32).reshape(1, -1))

    @staticmethod
    @torch.no_grad()
    def qk_clip_all_(mixers: list["MultiHeadLatentAttention"], scale_LH: torch.Tensor) -> None:
        """`qk_clip_` for L mixers of one shape at once: every row factor built in four launches, then one multiply
        per projection (2 L + 4 launches, whether or not a head is clipped: no host read decides it; FSDP2 shards too)."""
        first = mixers[0]
        L, H = scale_LH.shape
        scale_LH1 = scale_LH.to(torch.float32).unsqueeze(2)
        root_LHN = scale_LH1.sqrt().expand(L, H, first.nope_dim)
        q_factor_LR = torch.cat((root_LHN, scale_LH1.expand(L, H, first.rope_dim)), dim=2).reshape(L, -1)
        ones_LHV = scale_LH1.new_ones(()).expand(L, H, first.v_dim)
        kv_factor_LR = torch.cat((root_LHN, ones_LHV), dim=2).reshape(L, -1)
        for mixer, q_factor_R, kv_factor_R in zip(mixers, q_factor_LR, kv_factor_LR):
            scale_rows_(mixer.q_b_proj.weight, q_factor_R)
            scale_rows_(mixer.kv_b_proj.weight, kv_factor_R)
