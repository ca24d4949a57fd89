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
    """Rows of chunk i_n, their mask, and the row of the chunk's last real token."""
    t = i_n * C + tl.arange(0, C)
    rows, mask = token_rows(i_b, i_h, t, T, H)
    last = tl.minimum(T, i_n * C + C) - 1
    return rows, mask, (i_b.to(tl.int64) * T + last) * H + i_h


@triton.jit
def load_rows(ptr, rows, mask, cols, width):
    """(len(rows), len(cols)) tile of a (B, T, H, width) tensor; out-of-range entries are 0."""
    return tl.load(ptr + rows[:, None] * width + cols[None, :], mask=mask[:, None] & (cols < width)[None, :], other=0.0)


@triton.jit
def store_rows(ptr, rows, mask, cols, width, tile):
    tl.store(ptr + rows[:, None] * width + cols[None, :], tile.to(ptr.dtype.element_ty),
             mask=mask[:, None] & (cols < width)[None, :])


@triton.jit
def state_offsets(i_bh, i_n, NT, K, V, ok, ov):
    """Offsets of a (len(ok), len(ov)) tile of chunk i_n's state in a (B H, NT, K, V) tensor."""
    return ((i_bh.to(tl.int64) * NT + i_n) * K + ok[:, None]) * V + ov[None, :]


@triton.jit
def causal_decay(G, INCLUSIVE: tl.constexpr):
    """exp(G_t - G_s) for s <= t (s < t unless INCLUSIVE), 0 elsewhere; the exponent is masked first."""
    i = tl.arange(0, G.shape[0])
    if INCLUSIVE:
        keep = i[:, None] >= i[None, :]
    else:
        keep = i[:, None] > i[None, :]
    return tl.exp(tl.where(keep, G[:, None] - G[None, :], float("-inf")))
