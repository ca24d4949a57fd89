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

from hymo_core.kernels.gdn_triton_tiles import causal_decay, chunk_program, load_seq, load_state, mm, store_seq
from hymo_core.kernels.tuning import SIZE_KEY, autotuned, only_on

OUTPUT_CONFIGS = [triton.Config({"BV": bv}, num_warps=4, num_stages=2) for bv in (32, 64)]


@autotuned(OUTPUT_CONFIGS, key=["K", "V", *SIZE_KEY])
@triton.jit(do_not_specialize=SIZE_KEY)
def output_kernel(q_ptr, k_ptr, G_ptr, hs_ptr, vnew_ptr, o_ptr, scale, T, H, K, V, NT, BH_BUCKET, T_BUCKET,
                  C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    i_v, i_n, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    DT = q_ptr.dtype.element_ty
    i_b, i_h, rows, mask, _, t0 = chunk_program(i_n, i_bh, T, H, C)
    v0 = i_v * BV
    qh = tl.zeros([C, BV], dtype=tl.float32)
    qk = tl.zeros([C, C], dtype=tl.float32)
    for kk in range(0, K, BK):
        q = load_seq(q_ptr, i_b, i_h, T, H, K, t0, kk, C, BK)
        k = load_seq(k_ptr, i_b, i_h, T, H, K, t0, kk, C, BK)
        qh += mm(q, load_state(hs_ptr, i_bh, i_n, NT, K, V, kk, v0, BK, BV), DT)
        qk += mm(q, tl.trans(k), DT)
    G = tl.load(G_ptr + rows, mask=mask, other=0.0)
    P = qk * causal_decay(G, True)
    o = scale * (tl.exp(G)[:, None] * qh + mm(P, load_seq(vnew_ptr, i_b, i_h, T, H, V, t0, v0, C, BV), DT))
    store_seq(o_ptr, i_b, i_h, T, H, V, t0, v0, o)


@autotuned([triton.Config({}, num_warps=4, num_stages=2)], key=["K", "V"])
@triton.jit
def dv_local_kernel(q_ptr, k_ptr, G_ptr, do_ptr, dv_local_ptr, scale, T, H, K, V,
                    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    i_n, i_bh = tl.program_id(0), tl.program_id(1)
    DT = q_ptr.dtype.element_ty
    i_b, i_h, rows, mask, _, t0 = chunk_program(i_n, i_bh, T, H, C)
    qk = tl.zeros([C, C], dtype=tl.float32)
    for kk in range(0, K, BK):
        q = load_seq(q_ptr, i_b, i_h, T, H, K, t0, kk, C, BK)
        qk += mm(q, tl.trans(load_seq(k_ptr, i_b, i_h, T, H, K, t0, kk, C, BK)), DT)
    G = tl.load(G_ptr + rows, mask=mask, other=0.0)
    Pt = tl.trans(scale * qk * causal_decay(G, True))
    for vv in range(0, V, BV):
        store_seq(dv_local_ptr, i_b, i_h, T, H, V, t0, vv, mm(Pt, load_seq(do_ptr, i_b, i_h, T, H, V, t0, vv, C, BV), DT))


DQKWG_CONFIGS = [only_on(arch, triton.Config({"BK": bk}, num_warps=w, num_stages=2))
                 for arch, bk, w in (("hopper", 16, 2), ("hopper", 32, 4), ("hopper", 64, 8),
                                     ("ampere", 16, 2), ("ampere", 16, 4), ("ampere", 32, 8))]


def key_block_fits(config: triton.Config, meta: dict) -> bool:
    """A key block no wider than the padded key dim, and 16 only where nothing wider fits."""
    narrow = config.kwargs["BK"] == 16 and config.num_warps == 2
    return config.kwargs["BK"] <= meta["KP"] and narrow == (meta["KP"] == 16)


@autotuned(DQKWG_CONFIGS, key=["K", "V", *SIZE_KEY], keep=key_block_fits)
@triton.jit(do_not_specialize=SIZE_KEY)
def dqkwg_kernel(q_ptr, k_ptr, G_ptr, hs_ptr, dhs_ptr, vnew_ptr, do_ptr, dvnew_ptr,
                 dq_ptr, dk_part_ptr, dw_ptr, dG_part_ptr, scale, B, T, H, K, V, NT, BH_BUCKET, T_BUCKET,
                 C: tl.constexpr, KP: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """dG_part has one (B, T, H) slice per 16 keys (the narrowest key block), ceil(K / 16) in all. Key
    block i_k covers slices i_k BK/16 .. (i_k + 1) BK/16 - 1: its gate gradient goes to the first, zeros
    to the others. So every config writes every slice, and what the autotuner's timed runs of a
    narrower block wrote cannot reach the WY pass (which sums them all)."""
    i_k, i_n, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    DT = q_ptr.dtype.element_ty
    i_b, i_h, rows, mask, last_row, t0 = chunk_program(i_n, i_bh, T, H, C)
    k0 = i_k * BK
    SLICES: tl.constexpr = BK // 16
    # the zeros first, while no tile is live: written at the end they made dqkwg spill on sm_80
    for j in range(1, tl.minimum(SLICES, tl.cdiv(K, 16) - i_k * SLICES)):
        tl.store(dG_part_ptr + (i_k * SLICES + j).to(tl.int64) * B * T * H + rows, tl.zeros([C], tl.float32),
                 mask=mask)
    do_h = tl.zeros([C, BK], dtype=tl.float32)  # do h^T
    dkd = tl.zeros([C, BK], dtype=tl.float32)  # v_new dh^T: the gradient of k exp(G_L - G)
    dw = tl.zeros([C, BK], dtype=tl.float32)
    dP = tl.zeros([C, C], dtype=tl.float32)
    h_dh = 0.0
    for vv in range(0, V, BV):
        h = load_state(hs_ptr, i_bh, i_n, NT, K, V, k0, vv, BK, BV)
        dh = load_state(dhs_ptr, i_bh, i_n, NT, K, V, k0, vv, BK, BV)
        do = load_seq(do_ptr, i_b, i_h, T, H, V, t0, vv, C, BV)
        v_new = load_seq(vnew_ptr, i_b, i_h, T, H, V, t0, vv, C, BV)
        dv_new = load_seq(dvnew_ptr, i_b, i_h, T, H, V, t0, vv, C, BV)
        do_h += mm(do, tl.trans(h), DT)
        dkd += mm(v_new, tl.trans(dh), DT)
        dw -= mm(dv_new, tl.trans(h), DT)
        dP += mm(do, tl.trans(v_new), DT)
        h_dh += tl.sum(tl.sum(h.to(tl.float32) * dh.to(tl.float32), 1), 0)
    q = load_seq(q_ptr, i_b, i_h, T, H, K, t0, k0, C, BK)
    k = load_seq(k_ptr, i_b, i_h, T, H, K, t0, k0, C, BK)
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
    store_seq(dq_ptr, i_b, i_h, T, H, K, t0, k0, dq)
    store_seq(dk_part_ptr, i_b, i_h, T, H, K, t0, k0, dk)
    store_seq(dw_ptr, i_b, i_h, T, H, K, t0, k0, dw)
    tl.store(dG_part_ptr + (i_k * SLICES).to(tl.int64) * B * T * H + rows, dG, mask=mask)
