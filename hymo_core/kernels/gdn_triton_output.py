"""Gated DeltaNet output pass and its backward, every chunk in parallel.

With h the state entering a chunk (stored by the state pass), P = scale (exp(G_t - G_s))_{s<=t} (q k^T):
    o = scale exp(G) (q h) + P v_new
`output_kernel` computes it per (value block, chunk, batch x head). The backward:
- `dv_local_kernel`: P^T do, the part of dv_new that does not need the state gradient.
- `dqkwg_kernel` (per key block, chunk, batch x head; loops over value blocks): dq, the output
  pass's share of dk, dw = -dv_new h^T, and the gate gradient from P, from exp(G) q h and from
  the state update's exp(G_L - G) and exp(G_L) (written per key block, summed in the WY pass).
"""

from __future__ import annotations

import triton
import triton.language as tl

from hymo_core.kernels.gdn_triton_tiles import causal_decay, chunk_rows, load_rows, mm, state_offsets, store_rows
from hymo_core.kernels.tuning import autotuned

OUTPUT_CONFIGS = [triton.Config({"BV": bv}, num_warps=4) for bv in (32, 64)]


@autotuned(OUTPUT_CONFIGS, key=["K", "V"])
@triton.jit
def output_kernel(q_ptr, k_ptr, G_ptr, hs_ptr, vnew_ptr, o_ptr, scale, T, H, K, V, NT,
                  C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    i_v, i_n, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    DT = q_ptr.dtype.element_ty
    rows, mask, _ = chunk_rows(i_n, i_b, i_h, T, H, C)
    ov = i_v * BV + tl.arange(0, BV)
    qh = tl.zeros([C, BV], dtype=tl.float32)
    qk = tl.zeros([C, C], dtype=tl.float32)
    for kk in range(0, K, BK):
        ok = kk + tl.arange(0, BK)
        q = load_rows(q_ptr, rows, mask, ok, K)
        k = load_rows(k_ptr, rows, mask, ok, K)
        h = tl.load(hs_ptr + state_offsets(i_bh, i_n, NT, K, V, ok, ov), mask=(ok < K)[:, None] & (ov < V)[None, :],
                    other=0.0)
        qh += mm(q, h, DT)
        qk += mm(q, tl.trans(k), DT)
    G = tl.load(G_ptr + rows, mask=mask, other=0.0)
    P = qk * causal_decay(G, True)
    o = scale * (tl.exp(G)[:, None] * qh + mm(P, load_rows(vnew_ptr, rows, mask, ov, V), DT))
    store_rows(o_ptr, rows, mask, ov, V, o)


@autotuned([triton.Config({}, num_warps=w) for w in (4, 8)], key=["K", "V"])
@triton.jit
def dv_local_kernel(q_ptr, k_ptr, G_ptr, do_ptr, dv_local_ptr, scale, T, H, K, V,
                    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    i_n, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    DT = q_ptr.dtype.element_ty
    rows, mask, _ = chunk_rows(i_n, i_b, i_h, T, H, C)
    qk = tl.zeros([C, C], dtype=tl.float32)
    for kk in range(0, K, BK):
        ok = kk + tl.arange(0, BK)
        qk += mm(load_rows(q_ptr, rows, mask, ok, K), tl.trans(load_rows(k_ptr, rows, mask, ok, K)), DT)
    G = tl.load(G_ptr + rows, mask=mask, other=0.0)
    Pt = tl.trans(scale * qk * causal_decay(G, True))
    for vv in range(0, V, BV):
        ov = vv + tl.arange(0, BV)
        store_rows(dv_local_ptr, rows, mask, ov, V, mm(Pt, load_rows(do_ptr, rows, mask, ov, V), DT))


DQKWG_CONFIGS = [triton.Config({"BK": bk}, num_warps=w) for bk, w in ((16, 2), (32, 4), (64, 4), (64, 8))]


def key_block_fits(config: triton.Config, meta: dict) -> bool:
    """A key block no wider than the padded key dim, and 16 only where nothing wider fits."""
    return config.kwargs["BK"] <= meta["KP"] and (config.kwargs["BK"] > 16 or meta["KP"] == 16)


@autotuned(DQKWG_CONFIGS, key=["K", "V"], keep=key_block_fits)
@triton.jit
def dqkwg_kernel(q_ptr, k_ptr, G_ptr, hs_ptr, dhs_ptr, vnew_ptr, do_ptr, dvnew_ptr,
                 dq_ptr, dk_part_ptr, dw_ptr, dG_part_ptr, scale, B, T, H, K, V, NT,
                 C: tl.constexpr, KP: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    i_k, i_n, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    DT = q_ptr.dtype.element_ty
    rows, mask, last_row = chunk_rows(i_n, i_b, i_h, T, H, C)
    ok = i_k * BK + tl.arange(0, BK)
    do_h = tl.zeros([C, BK], dtype=tl.float32)  # do h^T
    dkd = tl.zeros([C, BK], dtype=tl.float32)  # v_new dh^T: the gradient of k exp(G_L - G)
    dw = tl.zeros([C, BK], dtype=tl.float32)
    dP = tl.zeros([C, C], dtype=tl.float32)
    h_dh = 0.0
    for vv in range(0, V, BV):
        ov = vv + tl.arange(0, BV)
        state = state_offsets(i_bh, i_n, NT, K, V, ok, ov)
        state_mask = (ok < K)[:, None] & (ov < V)[None, :]
        h = tl.load(hs_ptr + state, mask=state_mask, other=0.0)
        dh = tl.load(dhs_ptr + state, mask=state_mask, other=0.0)
        do = load_rows(do_ptr, rows, mask, ov, V)
        v_new = load_rows(vnew_ptr, rows, mask, ov, V)
        dv_new = load_rows(dvnew_ptr, rows, mask, ov, V)
        do_h += mm(do, tl.trans(h), DT)
        dkd += mm(v_new, tl.trans(dh), DT)
        dw -= mm(dv_new, tl.trans(h), DT)
        dP += mm(do, tl.trans(v_new), DT)
        h_dh += tl.sum(tl.sum(h.to(tl.float32) * dh.to(tl.float32), 1), 0)
    q = load_rows(q_ptr, rows, mask, ok, K)
    k = load_rows(k_ptr, rows, mask, ok, K)
    G = tl.load(G_ptr + rows, mask=mask, other=0.0)
    G_last = tl.load(G_ptr + last_row)
    eG = tl.exp(G)
    E = causal_decay(G, True)
    dQK = scale * dP * E  # P = scale E (q k^T); E is 0 above the diagonal
    P = scale * E * mm(q, tl.trans(k), DT)  # this key block's share of P
    to_end = tl.exp(G_last - G)
    dq = scale * eG[:, None] * do_h + mm(dQK, k, DT)
    dk = mm(tl.trans(dQK), q, DT) + to_end[:, None] * dkd
    dPP = dP * P
    kdkd = tl.sum(k.to(tl.float32) * to_end[:, None] * dkd, 1)
    dG = tl.sum(dPP, 1) - tl.sum(dPP, 0) + scale * eG * tl.sum(q.to(tl.float32) * do_h, 1) - kdkd
    dG_last = tl.sum(kdkd, 0) + tl.exp(G_last) * h_dh
    dG += tl.where(rows == last_row, dG_last, 0.0)
    store_rows(dq_ptr, rows, mask, ok, K, dq)
    store_rows(dk_part_ptr, rows, mask, ok, K, dk)
    store_rows(dw_ptr, rows, mask, ok, K, dw)
    tl.store(dG_part_ptr + i_k * B * T * H + rows, dG, mask=mask)
