"""Gated DeltaNet inter-chunk state recurrence, forward and backward: the only sequential pass.

A program owns one (batch, head) and one BV-wide block of the value dimension and walks the
chunks in order, holding its (K x BV) slice of the state in fp32. Per chunk, with h the state
entering it, w, u from wu_kernel and G_L the gate of its last token:
    v_new = u - w h;   h <- exp(G_L) h + (k exp(G_L - G))^T v_new
The state is blocked over values only: v_new contracts h over the whole key dimension, so a
key block would need every other key block's partial product at every chunk. Autotune picks
BV in {16, 32, 64}, which gives batch x heads x V / BV programs (hymo-750m, batch 4: up to 448).

The backward walks the chunks in reverse with dh (the gradient of the state leaving the chunk):
    dv_new = dv_local + (k exp(G_L - G)) dh;   dh <- exp(G_L) dh + (scale exp(G) q)^T do - w^T dv_new
where dv_local = P^T do comes from the output pass (gdn_triton_output.py).
"""

from __future__ import annotations

import triton
import triton.language as tl

from hymo_core.kernels.gdn_triton_tiles import chunk_rows, load_rows, mm, state_offsets, store_rows
from hymo_core.kernels.tuning import autotuned

STATE_CONFIGS = [triton.Config({"BV": bv}, num_warps=w) for bv, w in ((16, 2), (32, 4), (64, 4), (64, 8))]


def state_fits(config: triton.Config, meta: dict) -> bool:
    """A (KP x BV) fp32 state tile of at most 8,192 numbers (32 KB of registers), as in fla."""
    return meta["KP"] * config.kwargs["BV"] <= 8192


@autotuned(STATE_CONFIGS, key=["K", "V"], keep=state_fits)
@triton.jit
def state_forward_kernel(k_ptr, w_ptr, u_ptr, G_ptr, h0_ptr, hs_ptr, vnew_ptr, ht_ptr, T, H, K, V, NT,
                         C: tl.constexpr, KP: tl.constexpr, BV: tl.constexpr, HAS_H0: tl.constexpr,
                         STORE_FINAL: tl.constexpr):
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    DT = k_ptr.dtype.element_ty
    ok = tl.arange(0, KP)
    ov = i_v * BV + tl.arange(0, BV)
    state_mask = (ok < K)[:, None] & (ov < V)[None, :]
    state = ((i_bh.to(tl.int64) * K + ok[:, None]) * V + ov[None, :])
    h = tl.zeros([KP, BV], dtype=tl.float32)
    if HAS_H0:
        h = tl.load(h0_ptr + state, mask=state_mask, other=0.0)
    for i_n in range(NT):
        tl.store(hs_ptr + state_offsets(i_bh, i_n, NT, K, V, ok, ov), h.to(hs_ptr.dtype.element_ty), mask=state_mask)
        rows, mask, last_row = chunk_rows(i_n, i_b, i_h, T, H, C)
        w = load_rows(w_ptr, rows, mask, ok, K)
        v_new = load_rows(u_ptr, rows, mask, ov, V).to(tl.float32) - mm(w, h, DT)
        store_rows(vnew_ptr, rows, mask, ov, V, v_new)
        G = tl.load(G_ptr + rows, mask=mask, other=0.0)
        G_last = tl.load(G_ptr + last_row)
        k = load_rows(k_ptr, rows, mask, ok, K).to(tl.float32)
        kd = k * tl.exp(G_last - G)[:, None]
        h = tl.exp(G_last) * h + mm(tl.trans(kd), v_new, DT)
    if STORE_FINAL:
        tl.store(ht_ptr + state, h, mask=state_mask)


@autotuned(STATE_CONFIGS, key=["K", "V"], keep=state_fits)
@triton.jit
def state_backward_kernel(q_ptr, k_ptr, w_ptr, G_ptr, do_ptr, dv_local_ptr, dht_ptr, dhs_ptr, dvnew_ptr, dh0_ptr,
                          scale, T, H, K, V, NT,
                          C: tl.constexpr, KP: tl.constexpr, BV: tl.constexpr, HAS_DHT: tl.constexpr):
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    DT = k_ptr.dtype.element_ty
    ok = tl.arange(0, KP)
    ov = i_v * BV + tl.arange(0, BV)
    state_mask = (ok < K)[:, None] & (ov < V)[None, :]
    state = ((i_bh.to(tl.int64) * K + ok[:, None]) * V + ov[None, :])
    dh = tl.zeros([KP, BV], dtype=tl.float32)
    if HAS_DHT:
        dh = tl.load(dht_ptr + state, mask=state_mask, other=0.0)
    for step in range(NT):
        i_n = NT - 1 - step
        tl.store(dhs_ptr + state_offsets(i_bh, i_n, NT, K, V, ok, ov), dh.to(dhs_ptr.dtype.element_ty), mask=state_mask)
        rows, mask, last_row = chunk_rows(i_n, i_b, i_h, T, H, C)
        G = tl.load(G_ptr + rows, mask=mask, other=0.0)
        G_last = tl.load(G_ptr + last_row)
        k = load_rows(k_ptr, rows, mask, ok, K).to(tl.float32)
        kd = k * tl.exp(G_last - G)[:, None]
        dv_new = load_rows(dv_local_ptr, rows, mask, ov, V).to(tl.float32) + mm(kd, dh, DT)
        store_rows(dvnew_ptr, rows, mask, ov, V, dv_new)
        q = load_rows(q_ptr, rows, mask, ok, K).to(tl.float32) * (scale * tl.exp(G))[:, None]
        do = load_rows(do_ptr, rows, mask, ov, V)
        w = load_rows(w_ptr, rows, mask, ok, K)
        dh = tl.exp(G_last) * dh + mm(tl.trans(q), do, DT) - mm(tl.trans(w), dv_new, DT)
    tl.store(dh0_ptr + state, dh, mask=state_mask)
