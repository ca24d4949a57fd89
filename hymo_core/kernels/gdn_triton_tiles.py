"""Jitted helpers shared by the Gated DeltaNet kernels: row offsets and the two kinds of dot.

Tensors are laid out (B, T, H, .) as in flash-linear-attention; row (b, t, h) starts at
((b T + t) H + h) * width, computed in int64. Chunk intermediates (w, u, v_new, the chunk
states) are stored in the input dtype, gates and the inverse in fp32.

Dot precision (the "why" is in docs/training.md, Gated DeltaNet kernels):
- `mm` multiplies data: q, k, v, w, u, the states and their gradients. Its operands are cast to
  the input dtype, so on bf16 inputs it is a bf16 tensor-core MMA with fp32 accumulation (the
  operands carry bf16 rounding already, fla does the same); on fp32 inputs it is an IEEE fp32 dot.
- `mm32` multiplies the fp32 triangular inverse and its gradient (16 x 16 blocks of the inverse,
  dA = -Tinv^T dTinv Tinv^T): errors there feed every row after them, so the operands stay fp32;
  tf32 on half inputs (a tenth of the chunk's flops), IEEE on fp32 inputs.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def mm(a, b, DT: tl.constexpr):
    if DT == tl.float32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a.to(DT), b.to(DT))


@triton.jit
def mm32(a, b, DT: tl.constexpr):
    if DT == tl.float32:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision="tf32")


@triton.jit
def token_rows(i_b, i_h, t, T, H):
    """int64 row index of tokens `t` of batch i_b, head i_h in a (B, T, H, .) tensor, and t < T."""
    return (i_b.to(tl.int64) * T + t) * H + i_h, t < T


@triton.jit
def chunk_rows(i_n, i_b, i_h, T, H, C: tl.constexpr):
    """Rows of chunk i_n (for the per-token vectors g, beta, G), their mask, and the row of its last real token."""
    t = i_n * C + tl.arange(0, C)
    rows, mask = token_rows(i_b, i_h, t, T, H)
    last = tl.minimum(T, i_n * C + C) - 1
    return rows, mask, (i_b.to(tl.int64) * T + last) * H + i_h


@triton.jit
def chunk_program(i_n, i_bh, T, H, C: tl.constexpr):
    """What a program on chunk i_n of batch x head i_bh needs: (i_b, i_h, the chunk's rows, their mask,
    the row of its last real token, its first token)."""
    i_b, i_h = i_bh // H, i_bh % H
    rows, mask, last_row = chunk_rows(i_n, i_b, i_h, T, H, C)
    return i_b, i_h, rows, mask, last_row, i_n * C


@triton.jit
def _seq_offsets(ptr, i_b, i_h, T, H, width, t0, c0, BR: tl.constexpr, BC: tl.constexpr):
    """Base pointer of (batch i_b, head i_h) in a (B, T, H, width) tensor, and the in-sequence offsets
    and mask of tokens t0 .. t0 + BR, columns c0 .. c0 + BC.

    The base is 64-bit, the offsets 32-bit (the launcher checks T H width < 2**31): a tile then
    needs no 64-bit integer per element.
    """
    base = ptr + (i_b.to(tl.int64) * T * H + i_h) * width
    t = t0 + tl.arange(0, BR)
    c = c0 + tl.arange(0, BC)
    return base, t[:, None] * (H * width) + c[None, :], (t < T)[:, None] & (c < width)[None, :]


@triton.jit
def load_seq(ptr, i_b, i_h, T, H, width, t0, c0, BR: tl.constexpr, BC: tl.constexpr):
    """(BR, BC) tile of a (B, T, H, width) tensor; entries past T or width read as 0."""
    base, offsets, mask = _seq_offsets(ptr, i_b, i_h, T, H, width, t0, c0, BR, BC)
    return tl.load(base + offsets, mask=mask, other=0.0)


@triton.jit
def load_seq_transposed(ptr, i_b, i_h, T, H, width, t0, c0, BR: tl.constexpr, BC: tl.constexpr):
    """The (BC, BR) transpose of load_seq's tile, read transposed from memory (no register shuffle)."""
    base, offsets, mask = _seq_offsets(ptr, i_b, i_h, T, H, width, t0, c0, BR, BC)
    return tl.load(base + tl.trans(offsets), mask=tl.trans(mask), other=0.0)


@triton.jit
def store_seq(ptr, i_b, i_h, T, H, width, t0, c0, tile):
    base, offsets, mask = _seq_offsets(ptr, i_b, i_h, T, H, width, t0, c0, tile.shape[0], tile.shape[1])
    tl.store(base + offsets, tile.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _state_offsets(ptr, i_bh, i_n, NT, K, V, k0, v0, BK: tl.constexpr, BV: tl.constexpr):
    """Chunk i_n's (K, V) state in a (B H, NT, K, V) tensor (NT = 1, i_n = 0: a (B, H, K, V) state)."""
    base = ptr + (i_bh.to(tl.int64) * NT + i_n) * K * V
    k = k0 + tl.arange(0, BK)
    v = v0 + tl.arange(0, BV)
    return base, k[:, None] * V + v[None, :], (k < K)[:, None] & (v < V)[None, :]


@triton.jit
def load_state(ptr, i_bh, i_n, NT, K, V, k0, v0, BK: tl.constexpr, BV: tl.constexpr):
    base, offsets, mask = _state_offsets(ptr, i_bh, i_n, NT, K, V, k0, v0, BK, BV)
    return tl.load(base + offsets, mask=mask, other=0.0)


@triton.jit
def store_state(ptr, i_bh, i_n, NT, K, V, k0, v0, tile):
    base, offsets, mask = _state_offsets(ptr, i_bh, i_n, NT, K, V, k0, v0, tile.shape[0], tile.shape[1])
    tl.store(base + offsets, tile.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def causal_decay(G, INCLUSIVE: tl.constexpr):
    """exp(G_t - G_s) for s <= t (s < t unless INCLUSIVE), 0 elsewhere; the exponent is masked, then clamped at 0.

    With g <= 0 the exponent of a real pair is <= 0 already. The clamp is for the padded rows of a ragged
    last chunk: their gate is read as 0, so against a real token whose in-chunk gate is below -88.7 the
    exp would overflow to inf, and inf x 0 (the row's zero q, k, beta or dA) is NaN, which the next dot
    spreads into the real rows. fla's `safe_exp` does the same job by sending a positive exponent to
    -inf; a clamp costs the (C, C) tile no extra predicate registers (dqkwg and wy_backward sit at 255
    on sm_80), and gives a padded row a finite factor that its zeros then cancel.
    """
    i = tl.arange(0, G.shape[0])
    if INCLUSIVE:
        keep = i[:, None] >= i[None, :]
    else:
        keep = i[:, None] > i[None, :]
    return tl.exp(tl.where(keep, tl.minimum(G[:, None] - G[None, :], 0.0), float("-inf")))
