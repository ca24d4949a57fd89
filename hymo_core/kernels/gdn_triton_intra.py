"""Gated DeltaNet per-chunk kernels: gates and the UT inverse, the WY factors, and their backward.

Each program owns one chunk of 64 tokens of one (batch, head); all chunks run in parallel.
With G the in-chunk cumulative log decay and A_ts = b_t exp(G_t - G_s) k_t.k_s (s < t):

- `gate_inverse_kernel` stores G and Tinv = (I + A)^-1. A is built in 16 x 16 blocks; each
  diagonal block is inverted by forward substitution on 16 x 16 tiles (15 rank-1 row
  updates, no dots), the six blocks below the diagonal by block substitution
  Tinv_rc = -Tinv_rr sum_m A_rm Tinv_mc (ten 16^3 dots).
- `wu_kernel` stores w = Tinv (b exp(G) k) and u = Tinv (b v): run once in the forward and
  again in the backward (recomputing them costs two chunk-sized matmuls; storing them would
  cost (K + V) numbers per token).
- `wy_backward_kernel` takes dw, du (the gradients of w and u) and returns the contributions to
  dk, dv, dbeta, and finishes dg: it sums the gate gradient parts and reverse-cumsums them
  within the chunk (G = cumsum g).
"""

from __future__ import annotations

import triton
import triton.language as tl

from hymo_core.kernels.gdn_triton_tiles import (causal_decay, chunk_program, load_seq, load_seq_transposed, mm, mm32,
                                                store_seq, token_rows)
from hymo_core.kernels.tuning import autotuned, only_on

BT = 16  # sub-block of the chunk for the inverse


@triton.jit
def unit_lower_inverse16(A):
    """(I + A)^-1 for a strictly lower 16 x 16 A: row i = e_i - sum_{j<i} A_ij row_j."""
    s = tl.arange(0, 16)
    At = tl.trans(A)
    inv = tl.where(s[:, None] == s[None, :], 1.0, 0.0)
    for i in range(1, 16):
        a_j = tl.sum(tl.where(s[None, :] == i, At, 0.0), 1)  # a_j[j] = A[i, j]
        row = tl.where(s == i, 1.0, 0.0) - tl.sum(a_j[:, None] * inv, 0)
        inv = tl.where(s[:, None] == i, row[None, :], inv)
    return inv


@triton.jit
def _block_rows(i_n, r, i_b, i_h, T, H, C: tl.constexpr):
    return token_rows(i_b, i_h, i_n * C + r * 16 + tl.arange(0, 16), T, H)


@triton.jit
def _strict_block(b_r, G_r, G_c, KK, DIAGONAL: tl.constexpr):
    """A's block (r, c): b_t exp(G_t - G_s) (k k^T)_ts, strict lower on the diagonal blocks."""
    if DIAGONAL:
        return b_r[:, None] * causal_decay(G_r, False) * KK
    else:
        return b_r[:, None] * tl.exp(G_r[:, None] - G_c[None, :]) * KK


@triton.jit
def _store_block(ptr, i_b, i_h, T, H, i_n, r: tl.constexpr, c: tl.constexpr, C: tl.constexpr, tile):
    store_seq(ptr, i_b, i_h, T, H, C, i_n * C + r * 16, c * 16, tile)


@autotuned([only_on("hopper", triton.Config({}, num_warps=2, num_stages=2)),
            only_on("ampere", triton.Config({}, num_warps=4, num_stages=2))], key=["K"])
@triton.jit
def gate_inverse_kernel(k_ptr, g_ptr, beta_ptr, G_ptr, Tinv_ptr, T, H, K, C: tl.constexpr, BK: tl.constexpr):
    i_n, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    DT = k_ptr.dtype.element_ty
    r0, m0 = _block_rows(i_n, 0, i_b, i_h, T, H, C)
    r1, m1 = _block_rows(i_n, 1, i_b, i_h, T, H, C)
    r2, m2 = _block_rows(i_n, 2, i_b, i_h, T, H, C)
    r3, m3 = _block_rows(i_n, 3, i_b, i_h, T, H, C)
    g0 = tl.load(g_ptr + r0, mask=m0, other=0.0).to(tl.float32)
    g1 = tl.load(g_ptr + r1, mask=m1, other=0.0).to(tl.float32)
    g2 = tl.load(g_ptr + r2, mask=m2, other=0.0).to(tl.float32)
    g3 = tl.load(g_ptr + r3, mask=m3, other=0.0).to(tl.float32)
    G0 = tl.cumsum(g0, 0)
    G1 = tl.cumsum(g1, 0) + tl.sum(g0, 0)
    G2 = tl.cumsum(g2, 0) + tl.sum(g0, 0) + tl.sum(g1, 0)
    G3 = tl.cumsum(g3, 0) + tl.sum(g0, 0) + tl.sum(g1, 0) + tl.sum(g2, 0)
    tl.store(G_ptr + r0, G0, mask=m0)
    tl.store(G_ptr + r1, G1, mask=m1)
    tl.store(G_ptr + r2, G2, mask=m2)
    tl.store(G_ptr + r3, G3, mask=m3)
    b0 = tl.load(beta_ptr + r0, mask=m0, other=0.0).to(tl.float32)
    b1 = tl.load(beta_ptr + r1, mask=m1, other=0.0).to(tl.float32)
    b2 = tl.load(beta_ptr + r2, mask=m2, other=0.0).to(tl.float32)
    b3 = tl.load(beta_ptr + r3, mask=m3, other=0.0).to(tl.float32)
    z = tl.zeros([16, 16], dtype=tl.float32)
    KK00, KK10, KK11, KK20, KK21, KK22, KK30, KK31, KK32, KK33 = z, z, z, z, z, z, z, z, z, z
    for kk in range(0, K, BK):
        k0 = load_seq(k_ptr, i_b, i_h, T, H, K, i_n * C + 0, kk, 16, BK)
        k1 = load_seq(k_ptr, i_b, i_h, T, H, K, i_n * C + 16, kk, 16, BK)
        k2 = load_seq(k_ptr, i_b, i_h, T, H, K, i_n * C + 32, kk, 16, BK)
        k3 = load_seq(k_ptr, i_b, i_h, T, H, K, i_n * C + 48, kk, 16, BK)
        KK00 += mm(k0, tl.trans(k0), DT)
        KK10 += mm(k1, tl.trans(k0), DT)
        KK11 += mm(k1, tl.trans(k1), DT)
        KK20 += mm(k2, tl.trans(k0), DT)
        KK21 += mm(k2, tl.trans(k1), DT)
        KK22 += mm(k2, tl.trans(k2), DT)
        KK30 += mm(k3, tl.trans(k0), DT)
        KK31 += mm(k3, tl.trans(k1), DT)
        KK32 += mm(k3, tl.trans(k2), DT)
        KK33 += mm(k3, tl.trans(k3), DT)
    T00 = unit_lower_inverse16(_strict_block(b0, G0, G0, KK00, True))
    T11 = unit_lower_inverse16(_strict_block(b1, G1, G1, KK11, True))
    T22 = unit_lower_inverse16(_strict_block(b2, G2, G2, KK22, True))
    T33 = unit_lower_inverse16(_strict_block(b3, G3, G3, KK33, True))
    A10 = _strict_block(b1, G1, G0, KK10, False)
    A20 = _strict_block(b2, G2, G0, KK20, False)
    A21 = _strict_block(b2, G2, G1, KK21, False)
    A30 = _strict_block(b3, G3, G0, KK30, False)
    A31 = _strict_block(b3, G3, G1, KK31, False)
    A32 = _strict_block(b3, G3, G2, KK32, False)
    T10 = -mm32(T11, mm32(A10, T00, DT), DT)
    T21 = -mm32(T22, mm32(A21, T11, DT), DT)
    T20 = -mm32(T22, mm32(A20, T00, DT) + mm32(A21, T10, DT), DT)
    T32 = -mm32(T33, mm32(A32, T22, DT), DT)
    T31 = -mm32(T33, mm32(A31, T11, DT) + mm32(A32, T21, DT), DT)
    T30 = -mm32(T33, mm32(A30, T00, DT) + mm32(A31, T10, DT) + mm32(A32, T20, DT), DT)
    _store_block(Tinv_ptr, i_b, i_h, T, H, i_n, 0, 0, C, T00)
    _store_block(Tinv_ptr, i_b, i_h, T, H, i_n, 0, 1, C, z)
    _store_block(Tinv_ptr, i_b, i_h, T, H, i_n, 0, 2, C, z)
    _store_block(Tinv_ptr, i_b, i_h, T, H, i_n, 0, 3, C, z)
    _store_block(Tinv_ptr, i_b, i_h, T, H, i_n, 1, 0, C, T10)
    _store_block(Tinv_ptr, i_b, i_h, T, H, i_n, 1, 1, C, T11)
    _store_block(Tinv_ptr, i_b, i_h, T, H, i_n, 1, 2, C, z)
    _store_block(Tinv_ptr, i_b, i_h, T, H, i_n, 1, 3, C, z)
    _store_block(Tinv_ptr, i_b, i_h, T, H, i_n, 2, 0, C, T20)
    _store_block(Tinv_ptr, i_b, i_h, T, H, i_n, 2, 1, C, T21)
    _store_block(Tinv_ptr, i_b, i_h, T, H, i_n, 2, 2, C, T22)
    _store_block(Tinv_ptr, i_b, i_h, T, H, i_n, 2, 3, C, z)
    _store_block(Tinv_ptr, i_b, i_h, T, H, i_n, 3, 0, C, T30)
    _store_block(Tinv_ptr, i_b, i_h, T, H, i_n, 3, 1, C, T31)
    _store_block(Tinv_ptr, i_b, i_h, T, H, i_n, 3, 2, C, T32)
    _store_block(Tinv_ptr, i_b, i_h, T, H, i_n, 3, 3, C, T33)


@autotuned([triton.Config({}, num_warps=4, num_stages=2)], key=["K", "V"])
@triton.jit
def wu_kernel(k_ptr, v_ptr, beta_ptr, G_ptr, Tinv_ptr, w_ptr, u_ptr, T, H, K, V,
              C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    i_n, i_bh = tl.program_id(0), tl.program_id(1)
    DT = k_ptr.dtype.element_ty
    i_b, i_h, rows, mask, _, t0 = chunk_program(i_n, i_bh, T, H, C)
    Tinv = load_seq(Tinv_ptr, i_b, i_h, T, H, C, t0, 0, C, C)
    beta = tl.load(beta_ptr + rows, mask=mask, other=0.0).to(tl.float32)
    G = tl.load(G_ptr + rows, mask=mask, other=0.0)
    kscale = beta * tl.exp(G)
    for kk in range(0, K, BK):
        k = load_seq(k_ptr, i_b, i_h, T, H, K, t0, kk, C, BK).to(tl.float32)
        store_seq(w_ptr, i_b, i_h, T, H, K, t0, kk, mm(Tinv, k * kscale[:, None], DT))
    for vv in range(0, V, BV):
        v = load_seq(v_ptr, i_b, i_h, T, H, V, t0, vv, C, BV).to(tl.float32)
        store_seq(u_ptr, i_b, i_h, T, H, V, t0, vv, mm(Tinv, v * beta[:, None], DT))


@autotuned([triton.Config({}, num_warps=4, num_stages=2)], key=["K", "V"])
@triton.jit
def wy_backward_kernel(k_ptr, v_ptr, beta_ptr, G_ptr, Tinv_ptr, dw_ptr, du_ptr, dk_part_ptr, dG_part_ptr,
                       dk_ptr, dv_ptr, dbeta_ptr, dg_ptr, B, T, H, K, V, NK,
                       C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Through w = Tinv kb, u = Tinv vb, Tinv = (I + A)^-1 and A = strict(b E2 k k^T) to k, v, beta, g."""
    i_n, i_bh = tl.program_id(0), tl.program_id(1)
    DT = k_ptr.dtype.element_ty
    i_b, i_h, rows, mask, _, t0 = chunk_program(i_n, i_bh, T, H, C)
    cc = tl.arange(0, C)
    TinvT = load_seq_transposed(Tinv_ptr, i_b, i_h, T, H, C, t0, 0, C, C)  # only Tinv^T is used
    beta = tl.load(beta_ptr + rows, mask=mask, other=0.0).to(tl.float32)
    G = tl.load(G_ptr + rows, mask=mask, other=0.0)
    eG = tl.exp(G)
    kscale = beta * eG
    KK = tl.zeros([C, C], dtype=tl.float32)
    dTinv = tl.zeros([C, C], dtype=tl.float32)
    dbeta = tl.zeros([C], dtype=tl.float32)
    dG = tl.zeros([C], dtype=tl.float32)
    for kk in range(0, K, BK):
        k = load_seq(k_ptr, i_b, i_h, T, H, K, t0, kk, C, BK)
        dw = load_seq(dw_ptr, i_b, i_h, T, H, K, t0, kk, C, BK)
        KK += mm(k, tl.trans(k), DT)
        dTinv += mm(dw, tl.trans(k.to(tl.float32) * kscale[:, None]), DT)
        t_kb = tl.sum(k.to(tl.float32) * mm(TinvT, dw, DT), 1)  # k . dkb per row
        dbeta += eG * t_kb
        dG += kscale * t_kb
    for vv in range(0, V, BV):
        v = load_seq(v_ptr, i_b, i_h, T, H, V, t0, vv, C, BV).to(tl.float32)
        du = load_seq(du_ptr, i_b, i_h, T, H, V, t0, vv, C, BV)
        dTinv += mm(du, tl.trans(v * beta[:, None]), DT)
        dvb = mm(TinvT, du, DT)
        store_seq(dv_ptr, i_b, i_h, T, H, V, t0, vv, beta[:, None] * dvb)
        dbeta += tl.sum(v * dvb, 1)
    # Tinv = (I + A)^-1  =>  dA = -Tinv^T dTinv Tinv^T on the strict lower triangle
    dA = -mm32(mm32(TinvT, dTinv, DT), TinvT, DT)
    E2 = causal_decay(G, False)
    dA = tl.where(cc[:, None] > cc[None, :], dA, 0.0)
    dAE = dA * E2
    dbeta += tl.sum(dAE * KK, 1)
    dAA = dAE * KK * beta[:, None]
    dG += tl.sum(dAA, 1) - tl.sum(dAA, 0)
    dKK = dAE * beta[:, None]
    for kk in range(0, K, BK):
        k = load_seq(k_ptr, i_b, i_h, T, H, K, t0, kk, C, BK)
        dw = load_seq(dw_ptr, i_b, i_h, T, H, K, t0, kk, C, BK)
        dk = load_seq(dk_part_ptr, i_b, i_h, T, H, K, t0, kk, C, BK) + kscale[:, None] * mm(TinvT, dw, DT)
        dk += mm(dKK, k, DT) + mm(tl.trans(dKK), k, DT)
        store_seq(dk_ptr, i_b, i_h, T, H, K, t0, kk, dk)
    for i_k in range(0, NK):  # the output pass's per-key-block gate gradients
        dG += tl.load(dG_part_ptr + i_k * B * T * H + rows, mask=mask, other=0.0)
    tl.store(dbeta_ptr + rows, dbeta, mask=mask)
    tl.store(dg_ptr + rows, tl.sum(dG, 0) - tl.cumsum(dG, 0) + dG, mask=mask)  # G = cumsum(g) within the chunk
