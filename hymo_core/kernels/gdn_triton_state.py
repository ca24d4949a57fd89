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

from hymo_core.kernels.gdn_triton_tiles import chunk_program, load_seq, load_state, mm, store_seq, store_state
from hymo_core.kernels.tuning import SIZE_KEY, autotuned, only_on

STATE_CONFIGS = [only_on(arch, triton.Config({"BV": bv}, num_warps=w, num_stages=2))
                 for arch, bv, w in (("hopper", 16, 4), ("hopper", 32, 4), ("hopper", 64, 8),
                                     ("ampere", 16, 4), ("ampere", 32, 8))]


def state_fits(config: triton.Config, meta: dict) -> bool:
    """At most 96 numbers per thread in the (64 x KP) chunk tiles plus the (KP x BV) state: above that
    ptxas spills (tests/hymo_core/test_kernel_resources.py checks every config kept here)."""
    per_thread = (64 * meta["KP"] + meta["KP"] * config.kwargs["BV"]) / (32 * config.num_warps)
    return per_thread <= 96


@autotuned(STATE_CONFIGS, key=["K", "V", *SIZE_KEY], keep=state_fits)
@triton.jit(do_not_specialize=SIZE_KEY)
def state_forward_kernel(k_ptr, w_ptr, u_ptr, G_ptr, h0_ptr, hs_ptr, vnew_ptr, ht_ptr, T, H, K, V, NT,
                         BH_BUCKET, T_BUCKET,
                         C: tl.constexpr, KP: tl.constexpr, BV: tl.constexpr, HAS_H0: tl.constexpr,
                         STORE_FINAL: tl.constexpr):
    i_bh, v0 = tl.program_id(1), tl.program_id(0) * BV
    DT = k_ptr.dtype.element_ty
    h = tl.zeros([KP, BV], dtype=tl.float32)
    if HAS_H0:
        h = load_state(h0_ptr, i_bh, 0, 1, K, V, 0, v0, KP, BV)
    for i_n in range(NT):
        store_state(hs_ptr, i_bh, i_n, NT, K, V, 0, v0, h)
        i_b, i_h, rows, mask, last_row, t0 = chunk_program(i_n, i_bh, T, H, C)
        w = load_seq(w_ptr, i_b, i_h, T, H, K, t0, 0, C, KP)
        v_new = load_seq(u_ptr, i_b, i_h, T, H, V, t0, v0, C, BV).to(tl.float32) - mm(w, h, DT)
        store_seq(vnew_ptr, i_b, i_h, T, H, V, t0, v0, v_new)
        G = tl.load(G_ptr + rows, mask=mask, other=0.0)
        G_last = tl.load(G_ptr + last_row)
        k = load_seq(k_ptr, i_b, i_h, T, H, K, t0, 0, C, KP).to(tl.float32)
        kd = k * tl.exp(G_last - G)[:, None]
        h = tl.exp(G_last) * h + mm(tl.trans(kd), v_new, DT)
    if STORE_FINAL:
        store_state(ht_ptr, i_bh, 0, 1, K, V, 0, v0, h)


@autotuned(STATE_CONFIGS, key=["K", "V", *SIZE_KEY], keep=state_fits)
@triton.jit(do_not_specialize=SIZE_KEY)
def state_backward_kernel(q_ptr, k_ptr, w_ptr, G_ptr, do_ptr, dv_local_ptr, dht_ptr, dhs_ptr, dvnew_ptr, dh0_ptr,
                          scale, T, H, K, V, NT, BH_BUCKET, T_BUCKET,
                          C: tl.constexpr, KP: tl.constexpr, BV: tl.constexpr, HAS_DHT: tl.constexpr):
    i_bh, v0 = tl.program_id(1), tl.program_id(0) * BV
    DT = k_ptr.dtype.element_ty
    dh = tl.zeros([KP, BV], dtype=tl.float32)
    if HAS_DHT:
        dh = load_state(dht_ptr, i_bh, 0, 1, K, V, 0, v0, KP, BV)
    for step in range(NT):
        i_n = NT - 1 - step
        store_state(dhs_ptr, i_bh, i_n, NT, K, V, 0, v0, dh)
        i_b, i_h, rows, mask, last_row, t0 = chunk_program(i_n, i_bh, T, H, C)
        G = tl.load(G_ptr + rows, mask=mask, other=0.0)
        G_last = tl.load(G_ptr + last_row)
        k = load_seq(k_ptr, i_b, i_h, T, H, K, t0, 0, C, KP).to(tl.float32)
        kd = k * tl.exp(G_last - G)[:, None]
        dv_new = load_seq(dv_local_ptr, i_b, i_h, T, H, V, t0, v0, C, BV).to(tl.float32) + mm(kd, dh, DT)
        store_seq(dvnew_ptr, i_b, i_h, T, H, V, t0, v0, dv_new)
        q = load_seq(q_ptr, i_b, i_h, T, H, K, t0, 0, C, KP).to(tl.float32) * (scale * tl.exp(G))[:, None]
        do = load_seq(do_ptr, i_b, i_h, T, H, V, t0, v0, C, BV)
        w = load_seq(w_ptr, i_b, i_h, T, H, K, t0, 0, C, KP)
        dh = tl.exp(G_last) * dh + mm(tl.trans(q), do, DT) - mm(tl.trans(w), dv_new, DT)
    store_state(dh0_ptr, i_bh, 0, 1, K, V, 0, v0, dh)
