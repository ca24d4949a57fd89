"""Gated delta rule in Triton, flash-linear-attention's chunk-parallel decomposition (math: gdn_chunk.py).

Forward, per call (NT = ceil(T / 64) chunks):
  1. gate_inverse_kernel  (chunk, batch x head)       G = in-chunk cumsum of g; Tinv = (I + A)^-1  [stored]
  2. wu_kernel            (chunk, batch x head)       w = Tinv (b e^G k), u = Tinv (b v)
  3. state_forward_kernel (value block, batch x head) sequential over chunks: chunk states h, v_new, final state
  4. output_kernel        (value block, chunk, batch x head)  o
Backward: stored from the forward are q, k, v, beta, the initial state, G and Tinv (fp32, C numbers
per token and head). Recomputed: w, u (step 2) and the chunk states and v_new (step 3): one more
chunk-sized pass each, instead of keeping (K + 2V) numbers per token and K x V per chunk alive
between forward and backward. Then
  5. dv_local_kernel      (chunk, batch x head)       P^T do
  6. state_backward_kernel (value block, batch x head) sequential, reverse: dh per chunk, dv_new, dh0
  7. dqkwg_kernel         (key block, chunk, batch x head)  dq, dk (part), dw, dg (part)
  8. wy_backward_kernel   (chunk, batch x head)       dk, dv, dbeta, dg (reverse in-chunk cumsum)
Only 3 and 6 walk the chunks in order. No atomics: every gradient is written once (per key block
for dg, summed in step 8), so results are deterministic. The kernels whose best config depends on
the problem size (3, 4, 6, 7) take it for their autotune key (tuning.SIZE_KEY).
"""

from __future__ import annotations

import torch
import triton

from hymo_core.kernels.gdn_chunk import CHUNK  # 64: the inverse kernel is written for four 16-row blocks
from hymo_core.kernels.gdn_triton_intra import gate_inverse_kernel, wu_kernel, wy_backward_kernel
from hymo_core.kernels.gdn_triton_output import dqkwg_kernel, dv_local_kernel, output_kernel
from hymo_core.kernels.gdn_triton_state import state_backward_kernel, state_forward_kernel
from hymo_core.kernels.tuning import launch, size_buckets

assert CHUNK == 64, "gate_inverse_kernel inverts exactly four 16 x 16 diagonal blocks"
MAX_KEY_DIM = 256


def block_sizes(T: int, H: int, K: int, V: int) -> dict[str, int]:
    """KP: the key dimension padded to a power of two (the state tile); BK, BV: loop blocks."""
    if K > MAX_KEY_DIM:
        raise ValueError(f"gated_delta_rule (triton): key head dim {K} > {MAX_KEY_DIM} is not supported")
    KP = max(16, triton.next_power_of_2(K))
    if T * H * max(K, V, CHUNK) >= 2**31:
        raise ValueError(f"gated_delta_rule (triton): T {T} x H {H} x head dim {max(K, V)} >= 2**31 "
                         "overflows the kernels' in-sequence offsets")
    return dict(KP=KP, BK=min(64, KP), BV=min(64, max(16, triton.next_power_of_2(V))))


def _wu(k, v, beta, G, Tinv, sizes):
    B, T, H, K = k.shape
    V = v.shape[-1]
    w, u = torch.empty_like(k), torch.empty_like(v)
    launch(wu_kernel, lambda meta: (triton.cdiv(T, CHUNK), B * H), k, v, beta, G, Tinv, w, u, T, H, K, V,
           C=CHUNK, BK=sizes["BK"], BV=sizes["BV"])
    return w, u


def _states(k, w, u, G, h0, sizes, final: bool):
    """Chunk states (B H, NT, K, V) in k's dtype, v_new, and the final state (fp32) if `final`."""
    B, T, H, K = k.shape
    V, NT = u.shape[-1], triton.cdiv(T, CHUNK)
    hs = k.new_empty(B * H, NT, K, V)
    v_new = torch.empty_like(u)
    ht = torch.empty(B, H, K, V, device=k.device, dtype=torch.float32) if final else hs
    launch(state_forward_kernel, lambda meta: (triton.cdiv(V, meta["BV"]), B * H),
           k, w, u, G, h0 if h0 is not None else hs, hs, v_new, ht, T, H, K, V, NT, *size_buckets(B * H, T),
           C=CHUNK, KP=sizes["KP"], HAS_H0=h0 is not None, STORE_FINAL=final)
    return hs, v_new, ht


def gdn_forward(q, k, v, g, beta, scale: float, h0):
    """(o, final state fp32, G fp32 (B, T, H), Tinv fp32 (B, T, H, 64)); inputs contiguous (B, T, H, .)."""
    B, T, H, K = k.shape
    V, NT = v.shape[-1], triton.cdiv(T, CHUNK)
    sizes = block_sizes(T, H, K, V)
    G = torch.empty(B, T, H, device=k.device, dtype=torch.float32)
    Tinv = torch.empty(B, T, H, CHUNK, device=k.device, dtype=torch.float32)
    launch(gate_inverse_kernel, lambda meta: (NT, B * H), k, g, beta, G, Tinv, T, H, K, C=CHUNK, BK=sizes["BK"])
    w, u = _wu(k, v, beta, G, Tinv, sizes)
    hs, v_new, ht = _states(k, w, u, G, h0, sizes, final=True)
    o = torch.empty_like(v)
    launch(output_kernel, lambda meta: (triton.cdiv(V, meta["BV"]), NT, B * H), q, k, G, hs, v_new, o, scale,
           T, H, K, V, NT, *size_buckets(B * H, T), C=CHUNK, BK=sizes["BK"])
    return o, ht, G, Tinv


def gdn_backward(q, k, v, beta, G, Tinv, h0, do, dht, scale: float):
    """(dq, dk, dv, dg, dbeta, dh0) in fp32 (dv in v's dtype); dht may be None (no gradient on the final state)."""
    B, T, H, K = k.shape
    V, NT = v.shape[-1], triton.cdiv(T, CHUNK)
    sizes = block_sizes(T, H, K, V)
    w, u = _wu(k, v, beta, G, Tinv, sizes)
    hs, v_new, _ = _states(k, w, u, G, h0, sizes, final=False)
    dv_local = torch.empty_like(v)
    launch(dv_local_kernel, lambda meta: (NT, B * H), q, k, G, do, dv_local, scale, T, H, K, V,
           C=CHUNK, BK=sizes["BK"], BV=sizes["BV"])
    dhs = torch.empty_like(hs)
    dv_new = torch.empty_like(v)
    dh0 = torch.empty(B, H, K, V, device=k.device, dtype=torch.float32)
    launch(state_backward_kernel, lambda meta: (triton.cdiv(V, meta["BV"]), B * H),
           q, k, w, G, do, dv_local, dht if dht is not None else dh0, dhs, dv_new, dh0, scale, T, H, K, V, NT,
           *size_buckets(B * H, T),
           C=CHUNK, KP=sizes["KP"], HAS_DHT=dht is not None)
    dq = torch.empty(B, T, H, K, device=k.device, dtype=torch.float32)
    dk_part, dw = torch.empty_like(dq), torch.empty_like(dq)
    max_nk = triton.cdiv(K, 16)  # one slice per 16 keys (the smallest BK), each written by every config
    dG_part = torch.empty(max_nk, B, T, H, device=k.device, dtype=torch.float32)
    launch(dqkwg_kernel, lambda meta: (triton.cdiv(K, meta["BK"]), NT, B * H),
           q, k, G, hs, dhs, v_new, do, dv_new, dq, dk_part, dw, dG_part, scale, B, T, H, K, V, NT,
           *size_buckets(B * H, T),
           C=CHUNK, KP=sizes["KP"], BV=sizes["BV"])
    dk = torch.empty_like(dq)
    dv = torch.empty_like(v)
    dbeta = torch.empty(B, T, H, device=k.device, dtype=torch.float32)
    dg = torch.empty_like(dbeta)
    launch(wy_backward_kernel, lambda meta: (NT, B * H),
           k, v, beta, G, Tinv, dw, dv_new, dk_part, dG_part, dk, dv, dbeta, dg, B, T, H, K, V, max_nk,
           C=CHUNK, BK=min(32, sizes["BK"]), BV=min(32, sizes["BV"]))  # 64-wide blocks spill on sm_80
    return dq, dk, dv, dg, dbeta, dh0
