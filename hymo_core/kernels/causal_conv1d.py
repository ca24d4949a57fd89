"""Gated DeltaNet's short convolution: causal depthwise conv + SiLU, q and k L2-normalised per head, in one pass.

    q, k, v = causal_conv1d_qkv(x, q_weight, k_weight, v_weight, head_dim)     # x (B, T, 2 H K + H V)

Each channel c of x (the q | k | v projection's output, read in place through its strides) is
convolved causally with its own `W`-tap filter (nn.Conv1d's (C, 1, W) weights, the three
convolutions' weights passed as they are), then SiLU; q and k are then L2-normalised over each
head's `head_dim` channels (F.normalize, eps 1e-12), in fp32, and cast to x's dtype. A cache's
tail (B, C, W - 1), the last W - 1 inputs of the previous call, continues the convolution
across calls (decoding); no tail means zeros before the first token.

Eager PyTorch ran this as ten kernels forward and eighteen backward at hymo-750m (a transpose
and a zero tail `cat`ed in front of the input, the weights `cat`ed, `conv1d`, `silu`, an fp32
`normalize` of q and k with its casts; `convolution_backward` for the depthwise filter is far off
its roofline), writing the pre-activation, the activation and the fp32 normalised copy.
As in causal-conv1d (Mamba) and flash-linear-attention, the Triton forward reads x once and
writes q, k and v once, each contiguous (B, T, heads x head width) as the GDN op takes them;
nothing is saved but the input. The backward recomputes the convolution, SiLU and the norm
from x for each of the W shifted rows a gradient row needs (W**2 loads of a row, all from
cache), so it reads x and the three upstream gradients once and writes dx once; the weight
gradients are summed per program in fp32 and reduced once at the end (no atomics,
deterministic). Registered as `hymo::causal_conv1d_qkv` (+ `_backward`): one launch each way
on the meta device. It stays one opaque op under torch.compile too: Inductor cannot generate
the depthwise convolution itself (it calls the same cuDNN conv and its backward as eager), so
tracing the reference would give back the kernels this fuses.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from hymo_core.kernels.backend import HAVE_TRITON, reference_vjp, resolve_backend

NORM_EPS = 1e-12  # F.normalize's default
FORWARD_TILE = 4096  # elements of one program's (BLOCK_T x BLOCK_C) tile
BACKWARD_TILE = 1024  # the backward holds several tiles at once (x taps, activation, gradient, dpre, dx): 2048 spills
MAX_BLOCK_T = 64
WEIGHT_PARTIALS = 64  # backward programs along time (all batches together): rows of fp32 weight-gradient partials


def causal_conv1d_qkv_reference(x_BTC: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                                v_weight: torch.Tensor, tail_BCW: torch.Tensor | None, head_dim: int,
                                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Plain PyTorch (F.conv1d, SiLU, F.normalize of q and k in fp32): the CPU body and the tests' oracle."""
    B, T, C = x_BTC.shape
    W = q_weight.shape[-1]
    x_BCT = x_BTC.transpose(1, 2)
    tail_BCW = x_BCT.new_zeros(B, C, W - 1) if tail_BCW is None else tail_BCW.to(x_BCT.dtype)
    w_C1W = torch.cat((q_weight, k_weight, v_weight)).to(x_BTC.dtype)
    y_BTC = F.silu(F.conv1d(torch.cat((tail_BCW, x_BCT), dim=2), w_C1W, groups=C)).transpose(1, 2)
    QK = q_weight.shape[0] + k_weight.shape[0]
    qk_BTX, v_BTX = y_BTC.split((QK, C - QK), dim=-1)
    qk_BTX = F.normalize(qk_BTX.reshape(B, T, QK // head_dim, head_dim).float(), dim=-1).to(x_BTC.dtype)
    q_BTX, k_BTX = qk_BTX.reshape(B, T, QK).split((q_weight.shape[0], k_weight.shape[0]), dim=-1)
    return _own(q_BTX), _own(k_BTX), _own(v_BTX)


def _own(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor with its own storage: a custom op's outputs may not alias each other (at T = 1 a
    split of one buffer is already contiguous, and `contiguous()` would hand the view back)."""
    t = t.contiguous()
    return t.clone() if t._is_view() else t


if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _channel_block(block, wq_ptr, wk_ptr, wv_ptr, q_ptr, k_ptr, v_ptr, HK, HV, K: tl.constexpr,
                       BLOCK_C: tl.constexpr):
        """Channel program `block`: a q head, a k head, or BLOCK_C of v's channels.

        Returns (its weights, its output (or output gradient), its first channel in x, its first weight row,
        which is also its first output column, the output's row width, its width, whether it is normalised)."""
        H = HK // K
        if block < H:
            w_ptr, out_ptr = wq_ptr, q_ptr
        elif block < 2 * H:
            w_ptr, out_ptr = wk_ptr, k_ptr
        else:
            w_ptr, out_ptr = wv_ptr, v_ptr
        is_v = block >= 2 * H
        v_first = (block - 2 * H) * BLOCK_C
        first = tl.where(is_v, 2 * HK + v_first, block * K)
        row = tl.where(is_v, v_first, tl.where(block < H, block * K, (block - H) * K))
        out_width = tl.where(is_v, HV, HK)
        width = tl.where(is_v, tl.minimum(BLOCK_C, HV - v_first), K)
        return w_ptr, out_ptr, first, row, out_width, width, block < 2 * H

    @triton.jit
    def _tap_input(x_ptr, tail_ptr, b, src, cols, cmask, T, first, stride_xb, stride_xt, stride_tb, stride_tc,
                   stride_tw, W: tl.constexpr, HAS_TAIL: tl.constexpr):
        """x[src, first + cols] in fp32: the tail's columns for -(W - 1) <= src < 0, zeros before and past T."""
        x_row = x_ptr + b.to(tl.int64) * stride_xb + first + cols
        x = tl.load(x_row[None, :] + src.to(tl.int64)[:, None] * stride_xt,
                    mask=((src >= 0) & (src < T))[:, None] & cmask[None, :], other=0.0).to(tl.float32)
        if HAS_TAIL:
            before = (src < 0) & (src >= -(W - 1))
            tail = tail_ptr + b.to(tl.int64) * stride_tb + (first + cols)[None, :] * stride_tc \
                + (src + W - 1)[:, None] * stride_tw
            x += tl.load(tail, mask=before[:, None] & cmask[None, :], other=0.0).to(tl.float32)
        return x

    @triton.jit
    def _pre_activation(x_ptr, tail_ptr, w_ptr, w_row, b, t, cols, cmask, T, first, stride_xb, stride_xt,
                        stride_tb, stride_tc, stride_tw, W: tl.constexpr, HAS_TAIL: tl.constexpr,
                        BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
        """conv(x)[t, cols] in fp32: sum over taps j of w[c, j] * x[t - (W - 1) + j, c], the tail before t = 0."""
        acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
        for j in tl.static_range(W):
            w_j = tl.load(w_ptr + (w_row + cols) * W + j, mask=cmask, other=0.0).to(tl.float32)
            x_j = _tap_input(x_ptr, tail_ptr, b, t - (W - 1) + j, cols, cmask, T, first, stride_xb, stride_xt,
                             stride_tb, stride_tc, stride_tw, W, HAS_TAIL)
            acc += x_j * w_j[None, :]
        return acc

    @triton.jit
    def _causal_conv1d_forward_kernel(
        x_ptr, tail_ptr, wq_ptr, wk_ptr, wv_ptr, q_ptr, k_ptr, v_ptr, T, HK, HV,
        stride_xb, stride_xt, stride_tb, stride_tc, stride_tw, eps,
        W: tl.constexpr, K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, HAS_TAIL: tl.constexpr,
    ):
        """Program (time tile, batch, channel block): BLOCK_T tokens of one q / k head or of BLOCK_C v channels."""
        b = tl.program_id(1)
        w_ptr, out_ptr, first, row, out_width, width, normalised = _channel_block(
            tl.program_id(2), wq_ptr, wk_ptr, wv_ptr, q_ptr, k_ptr, v_ptr, HK, HV, K, BLOCK_C)
        t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        cols = tl.arange(0, BLOCK_C)
        cmask = cols < width
        pre = _pre_activation(x_ptr, tail_ptr, w_ptr, row, b, t, cols, cmask, T, first, stride_xb, stride_xt,
                              stride_tb, stride_tc, stride_tw, W, HAS_TAIL, BLOCK_T, BLOCK_C)
        y = pre * tl.sigmoid(pre)
        if normalised:
            norm = tl.sqrt(tl.sum(y * y, axis=1))
            y = y / tl.maximum(norm, eps)[:, None]
        rows = (b.to(tl.int64) * T + t) * out_width + row
        tl.store(out_ptr + rows[:, None] + cols[None, :], y.to(out_ptr.dtype.element_ty),
                 mask=(t < T)[:, None] & cmask[None, :])

    @triton.jit
    def _causal_conv1d_backward_kernel(
        x_ptr, tail_ptr, wq_ptr, wk_ptr, wv_ptr, dq_ptr, dk_ptr, dv_ptr, dx_ptr, dw_partial_ptr,
        T, HK, HV, C, TILES, stride_xb, stride_xt, stride_tb, stride_tc, stride_tw, eps,
        W: tl.constexpr, W_POW2: tl.constexpr, K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
        HAS_TAIL: tl.constexpr,
    ):
        """Program (time run, batch, channel block): TILES tiles of BLOCK_T tokens from tile i * TILES.

        dpre[r] = silu'(pre[r]) * dnorm(dy[r]); dx[t] = sum_s w[W - 1 - s] * dpre[t + s] (each shifted dpre
        recomputed from x); dw[j] = sum_t dpre[t] * x[t - (W - 1) + j], one fp32 partial per program."""
        b = tl.program_id(1)
        w_ptr, dout_ptr, first, row, out_width, width, normalised = _channel_block(
            tl.program_id(2), wq_ptr, wk_ptr, wv_ptr, dq_ptr, dk_ptr, dv_ptr, HK, HV, K, BLOCK_C)
        cols = tl.arange(0, BLOCK_C)
        cmask = cols < width
        taps = tl.arange(0, W_POW2)
        dw = tl.zeros([BLOCK_C, W_POW2], dtype=tl.float32)
        for tile in range(0, TILES):
            t = (tl.program_id(0) * TILES + tile) * BLOCK_T + tl.arange(0, BLOCK_T)
            dx = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
            for s in tl.static_range(W):
                r = t + s  # the rows whose tap W - 1 - s reads x[t]
                pre = _pre_activation(x_ptr, tail_ptr, w_ptr, row, b, r, cols, cmask, T, first, stride_xb,
                                      stride_xt, stride_tb, stride_tc, stride_tw, W, HAS_TAIL, BLOCK_T, BLOCK_C)
                sig = tl.sigmoid(pre)
                act = pre * sig
                dy = tl.load(dout_ptr + ((b.to(tl.int64) * T + r) * out_width + row)[:, None] + cols[None, :],
                             mask=(r < T)[:, None] & cmask[None, :], other=0.0).to(tl.float32)
                if normalised:
                    norm = tl.sqrt(tl.sum(act * act, axis=1))
                    inv = 1.0 / tl.maximum(norm, eps)
                    y = act * inv[:, None]
                    along = tl.where(norm >= eps, tl.sum(y * dy, axis=1), 0.0)  # a clamped norm is a constant
                    dy = (dy - y * along[:, None]) * inv[:, None]
                dpre = dy * sig * (1.0 + pre * (1.0 - sig))
                w_tap = tl.load(w_ptr + (row + cols) * W + (W - 1 - s), mask=cmask, other=0.0).to(tl.float32)
                dx += dpre * w_tap[None, :]
                if s == 0:  # r == t: this tile's own dpre, against each tap's input
                    for j in tl.static_range(W):
                        x_j = _tap_input(x_ptr, tail_ptr, b, t - (W - 1) + j, cols, cmask, T, first, stride_xb,
                                         stride_xt, stride_tb, stride_tc, stride_tw, W, HAS_TAIL)
                        dw += tl.where(taps[None, :] == j, tl.sum(dpre * x_j, axis=0)[:, None], 0.0)
            tl.store(dx_ptr + ((b.to(tl.int64) * T + t) * C + first)[:, None] + cols[None, :],
                     dx.to(dx_ptr.dtype.element_ty), mask=(t < T)[:, None] & cmask[None, :])
        program = b * tl.num_programs(0) + tl.program_id(0)
        tl.store(dw_partial_ptr + (program.to(tl.int64) * C + first + cols)[:, None] * W + taps[None, :], dw,
                 mask=cmask[:, None] & (taps < W)[None, :])


def channel_blocks(head_dim: int, qk_channels: int, v_channels: int) -> tuple[int, int]:
    """(BLOCK_C, channel programs): one per q or k head, and v in BLOCK_C-wide blocks."""
    block_c = triton.next_power_of_2(head_dim)
    return block_c, qk_channels // head_dim + triton.cdiv(v_channels, block_c)


def block_t(tile: int, block_c: int) -> int:
    return max(1, min(MAX_BLOCK_T, tile // block_c))


def backward_grid(batch: int, seq_len: int, bt: int) -> tuple[int, int]:
    """(tiles per program, time programs per batch): about WEIGHT_PARTIALS programs along time in all, each
    looping over its tiles, so the fp32 weight-gradient partials stay a few MB."""
    tiles = triton.cdiv(seq_len, bt)
    programs = max(1, min(tiles, WEIGHT_PARTIALS // batch))
    per_program = triton.cdiv(tiles, programs)
    return per_program, triton.cdiv(tiles, per_program)


def _layout(x: torch.Tensor, tail: torch.Tensor | None):
    if x.stride(-1) != 1:
        x = x.contiguous()
    strides = (tail.stride(0), tail.stride(1), tail.stride(2)) if tail is not None else (0, 0, 0)
    return x, (tail if tail is not None else x), strides


def causal_conv1d_qkv_forward_triton(x, q_weight, k_weight, v_weight, tail, head_dim):
    x, tail_arg, tail_strides = _layout(x, tail)
    B, T, C = x.shape
    HK, W = q_weight.shape[0], q_weight.shape[-1]
    HV = C - 2 * HK
    q, k, v = x.new_empty(B, T, HK), x.new_empty(B, T, HK), x.new_empty(B, T, HV)
    block_c, blocks = channel_blocks(head_dim, 2 * HK, HV)
    bt = block_t(FORWARD_TILE, block_c)
    _causal_conv1d_forward_kernel[(triton.cdiv(T, bt), B, blocks)](
        x, tail_arg, q_weight.contiguous(), k_weight.contiguous(), v_weight.contiguous(), q, k, v, T, HK, HV,
        x.stride(0), x.stride(1), *tail_strides, NORM_EPS,
        W=W, K=head_dim, BLOCK_T=bt, BLOCK_C=block_c, HAS_TAIL=tail is not None)
    return q, k, v


def causal_conv1d_qkv_backward_triton(dq, dk, dv, x, q_weight, k_weight, v_weight, tail, head_dim):
    x, tail_arg, tail_strides = _layout(x, tail)
    B, T, C = x.shape
    HK, W = q_weight.shape[0], q_weight.shape[-1]
    HV = C - 2 * HK
    dx = torch.empty(B, T, C, device=x.device, dtype=x.dtype)
    block_c, blocks = channel_blocks(head_dim, 2 * HK, HV)
    bt = block_t(BACKWARD_TILE, block_c)
    per_program, programs = backward_grid(B, T, bt)
    dw_partial = torch.empty(B * programs, C, W, device=x.device, dtype=torch.float32)
    _causal_conv1d_backward_kernel[(programs, B, blocks)](
        x, tail_arg, q_weight.contiguous(), k_weight.contiguous(), v_weight.contiguous(), dq.contiguous(),
        dk.contiguous(), dv.contiguous(), dx, dw_partial, T, HK, HV, C, per_program,
        x.stride(0), x.stride(1), *tail_strides, NORM_EPS,
        W=W, W_POW2=triton.next_power_of_2(W), K=head_dim, BLOCK_T=bt, BLOCK_C=block_c, HAS_TAIL=tail is not None)
    dwq, dwk, dwv = (part.sum(0).unsqueeze(1).to(w.dtype)  # three sums: grads that alias one another are refused
                     for part, w in zip(dw_partial.split((HK, HK, HV), dim=1), (q_weight, k_weight, v_weight)))
    return dx, dwq, dwk, dwv


@torch.library.custom_op("hymo::causal_conv1d_qkv", mutates_args=())
def causal_conv1d_qkv_op(x: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, v_weight: torch.Tensor,
                         tail: Optional[torch.Tensor], head_dim: int, backend: str,
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if backend == "triton":
        return causal_conv1d_qkv_forward_triton(x, q_weight, k_weight, v_weight, tail, head_dim)
    return causal_conv1d_qkv_reference(x, q_weight, k_weight, v_weight, tail, head_dim)


@causal_conv1d_qkv_op.register_fake
def _(x, q_weight, k_weight, v_weight, tail, head_dim, backend):
    B, T, C = x.shape
    HK = q_weight.shape[0]
    return x.new_empty(B, T, HK), x.new_empty(B, T, HK), x.new_empty(B, T, C - 2 * HK)


@torch.library.custom_op("hymo::causal_conv1d_qkv_backward", mutates_args=())
def causal_conv1d_qkv_backward_op(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, x: torch.Tensor,
                                  q_weight: torch.Tensor, k_weight: torch.Tensor, v_weight: torch.Tensor,
                                  tail: Optional[torch.Tensor], head_dim: int, backend: str,
                                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dq_weight, dk_weight, dv_weight); the tail (a cache's, detached) gets no gradient."""
    if backend == "triton":
        return causal_conv1d_qkv_backward_triton(dq, dk, dv, x, q_weight, k_weight, v_weight, tail, head_dim)
    grads = reference_vjp(lambda x, wq, wk, wv: causal_conv1d_qkv_reference(x, wq, wk, wv, tail, head_dim),
                          [x, q_weight, k_weight, v_weight], [dq, dk, dv])
    return tuple(_own(grad) for grad in grads)  # the weights' gradients are slices of one


@causal_conv1d_qkv_backward_op.register_fake
def _(dq, dk, dv, x, q_weight, k_weight, v_weight, tail, head_dim, backend):
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (x, q_weight, k_weight, v_weight))


def _setup(ctx, inputs, output):
    x, q_weight, k_weight, v_weight, tail, head_dim, backend = inputs
    ctx.save_for_backward(x, q_weight, k_weight, v_weight, tail)
    ctx.head_dim, ctx.backend = head_dim, backend


def _backward(ctx, dq, dk, dv):
    x, q_weight, k_weight, v_weight, tail = ctx.saved_tensors
    B, T, _ = x.shape
    dq, dk = [torch.zeros(B, T, q_weight.shape[0], device=x.device, dtype=x.dtype) if d is None else d for d in (dq, dk)]
    if dv is None:
        dv = torch.zeros(B, T, v_weight.shape[0], device=x.device, dtype=x.dtype)
    dx, dwq, dwk, dwv = causal_conv1d_qkv_backward_op(dq, dk, dv, x, q_weight, k_weight, v_weight, tail,
                                                      ctx.head_dim, ctx.backend)
    return dx, dwq, dwk, dwv, None, None, None


causal_conv1d_qkv_op.register_autograd(_backward, setup_context=_setup)


def causal_conv1d_qkv(x_BTC: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, v_weight: torch.Tensor,
                      head_dim: int, tail_BCW: torch.Tensor | None = None, backend: str | None = None,
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, k, v), each (B, T, channels) contiguous in x's dtype: the op `hymo::causal_conv1d_qkv`.

    Weights are nn.Conv1d's depthwise (channels, 1, W); q and k have the same channels, a multiple of head_dim.
    """
    B, T, C = x_BTC.shape
    W = q_weight.shape[-1]
    shapes_agree = (q_weight.shape == k_weight.shape and q_weight.shape[1] == 1 and v_weight.shape[1:] == (1, W)
                    and q_weight.shape[0] % head_dim == 0 and C == 2 * q_weight.shape[0] + v_weight.shape[0])
    if x_BTC.ndim != 3 or not shapes_agree:
        raise ValueError(f"causal_conv1d_qkv: x {tuple(x_BTC.shape)} and weights {tuple(q_weight.shape)}, "
                         f"{tuple(k_weight.shape)}, {tuple(v_weight.shape)} (head_dim {head_dim}) disagree")
    if tail_BCW is not None and tuple(tail_BCW.shape) != (B, C, W - 1):
        raise ValueError(f"causal_conv1d_qkv: tail {tuple(tail_BCW.shape)} != {(B, C, W - 1)}")
    return causal_conv1d_qkv_op(x_BTC, q_weight, k_weight, v_weight, tail_BCW, head_dim,
                                resolve_backend(x_BTC, backend))
