"""Gated delta rule as a chunked Triton kernel (the math of gdn_chunk.py), forward and backward.

One program owns one (batch, head) and one BV-wide slice of the value dimension and
walks the chunks in order, keeping its (K x BV) slice of the state in fp32 registers;
everything inside a chunk (decays, the UT system's inverse by forward substitution,
W, U, the masked QK^T) is recomputed from q, k, v, g, beta, so nothing but the output
and the final state is stored. The backward first replays the forward to store each
chunk's incoming state, then walks the chunks in reverse carrying dL/dstate and
differentiates every line of the chunk by hand (derivation in docs/training.md).
Gradients of q, k, g and beta get contributions from every value slice; they are
written per slice and summed afterwards (deterministic, no atomics). Offsets into
the (B, T, H, .) tensors are 64-bit. fp32 inputs use IEEE dots; half inputs tf32.
"""

from __future__ import annotations

import torch

from hymo_core.kernels.backend import HAVE_TRITON
from hymo_core.kernels.gdn_chunk import CHUNK  # a multiple of 16 with C / 16 <= 4 (the inverse's series stops at N^3)

if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _chunk_intra(k, v, g, beta, rows, cols, C: tl.constexpr, PREC: tl.constexpr):
        """G (cumsum of log decay), the strict decays E2, A, Tinv = (I + A)^-1, W and Ũ of one chunk."""
        G = tl.cumsum(g, 0)
        D = G[:, None] - G[None, :]
        strict = rows[:, None] > cols[None, :]
        E2 = tl.exp(tl.where(strict, D, float("-inf")))
        KK = tl.dot(k, tl.trans(k), input_precision=PREC)
        A = beta[:, None] * E2 * KK
        # (I + A)^-1 in two stages. The 16 x 16 diagonal blocks by forward substitution, all four
        # at once (row i of each block needs only that block's earlier rows): Tbd. Then, with
        # L = the strictly block-lower rest of A, (I + A) = (I + A_bd)(I + N), N = Tbd L, and N
        # is nilpotent of order C / 16, so (I + N)^-1 = I - N + N^2 - N^3 exactly.
        eye = tl.where(rows[:, None] == cols[None, :], 1.0, 0.0)
        same_block = (rows[:, None] // 16) == (cols[None, :] // 16)
        A_bd = tl.where(same_block, A, 0.0)
        Tbd = eye
        for i in range(1, 16):
            Tbd = tl.where((rows % 16 == i)[:, None], eye - tl.dot(A_bd, Tbd, input_precision=PREC), Tbd)
        N = tl.dot(Tbd, tl.where(same_block, 0.0, A), input_precision=PREC)
        N2 = tl.dot(N, N, input_precision=PREC)
        Tinv = tl.dot(eye - N + N2 - tl.dot(N2, N, input_precision=PREC), Tbd, input_precision=PREC)
        kb = k * (beta * tl.exp(G))[:, None]
        vb = v * beta[:, None]
        W = tl.dot(Tinv, kb, input_precision=PREC)
        Ut = tl.dot(Tinv, vb, input_precision=PREC)
        return G, D, E2, KK, A, Tinv, kb, vb, W, Ut

    @triton.jit
    def _program_tiles(H, K, V, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
        """This program's (value slice, batch x head), its index vectors and masks, and its state offsets."""
        i_v, i_bh = tl.program_id(0), tl.program_id(1)
        rows = tl.arange(0, C)
        ok = tl.arange(0, BK)
        ov = i_v * BV + tl.arange(0, BV)
        state_off = i_bh.to(tl.int64) * K * V + ok[:, None] * V + ov[None, :]
        return i_v, i_bh, i_bh // H, i_bh % H, rows, rows, ok, ov, ok < K, ov < V, state_off

    @triton.jit
    def _load_chunk(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, tok, mt, ok, ov, mk, mv, scale, K, V):
        """One chunk's rows (`tok`, masked by `mt`) of scaled q, k, this program's v slice, g and beta, in fp32."""
        q = tl.load(q_ptr + tok[:, None] * K + ok[None, :], mask=mt[:, None] & mk[None, :], other=0.0).to(tl.float32) * scale
        k = tl.load(k_ptr + tok[:, None] * K + ok[None, :], mask=mt[:, None] & mk[None, :], other=0.0).to(tl.float32)
        v = tl.load(v_ptr + tok[:, None] * V + ov[None, :], mask=mt[:, None] & mv[None, :], other=0.0).to(tl.float32)
        g = tl.load(g_ptr + tok, mask=mt, other=0.0).to(tl.float32)
        beta = tl.load(beta_ptr + tok, mask=mt, other=0.0).to(tl.float32)
        return q, k, v, g, beta

    @triton.jit
    def _gdn_forward_kernel(
        q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, h0_ptr, o_ptr, ht_ptr, hs_ptr, scale, T, H, K, V,
        C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, HAS_H0: tl.constexpr, STORE_STATES: tl.constexpr,
        WRITE_O: tl.constexpr, PREC: tl.constexpr,
    ):
        i_v, i_bh, i_b, i_h, rows, cols, ok, ov, mk, mv, state_off = _program_tiles(H, K, V, C, BK, BV)
        h = tl.zeros([BK, BV], dtype=tl.float32)
        if HAS_H0:
            h = tl.load(h0_ptr + state_off, mask=mk[:, None] & mv[None, :], other=0.0)
        NT = tl.cdiv(T, C)
        for n in range(NT):
            t = n * C + rows
            mt = t < T
            tok = (i_b.to(tl.int64) * T + t) * H + i_h  # (C,) int64 row index into (B, T, H, .)
            if STORE_STATES:
                hs_off = (i_bh.to(tl.int64) * NT + n) * K * V + ok[:, None] * V + ov[None, :]
                tl.store(hs_ptr + hs_off, h, mask=mk[:, None] & mv[None, :])
            q, k, v, g, beta = _load_chunk(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, tok, mt, ok, ov, mk, mv, scale, K, V)
            G, D, E2, KK, A, Tinv, kb, vb, W, Ut = _chunk_intra(k, v, g, beta, rows, cols, C, PREC)
            U = Ut - tl.dot(W, h, input_precision=PREC)
            if WRITE_O:
                E = tl.exp(tl.where(rows[:, None] >= cols[None, :], D, float("-inf")))
                P = E * tl.dot(q, tl.trans(k), input_precision=PREC)
                o = tl.dot(q * tl.exp(G)[:, None], h, input_precision=PREC) + tl.dot(P, U, input_precision=PREC)
                tl.store(o_ptr + tok[:, None] * V + ov[None, :], o.to(o_ptr.dtype.element_ty), mask=mt[:, None] & mv[None, :])
            G_last = tl.sum(tl.where(rows == C - 1, G, 0.0), 0)
            kd = k * tl.exp(G_last - G)[:, None]
            h = tl.exp(G_last) * h + tl.dot(tl.trans(kd), U, input_precision=PREC)
        tl.store(ht_ptr + state_off, h, mask=mk[:, None] & mv[None, :])

    @triton.jit
    def _gdn_backward_kernel(
        q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, hs_ptr, do_ptr, dht_ptr,
        dq_ptr, dk_ptr, dv_ptr, dg_ptr, dbeta_ptr, dh0_ptr, scale, B, T, H, K, V,
        C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, HAS_DHT: tl.constexpr, PREC: tl.constexpr,
    ):
        i_v, i_bh, i_b, i_h, rows, cols, ok, ov, mk, mv, state_off = _program_tiles(H, K, V, C, BK, BV)
        dh = tl.zeros([BK, BV], dtype=tl.float32)
        if HAS_DHT:
            dh = tl.load(dht_ptr + state_off, mask=mk[:, None] & mv[None, :], other=0.0)
        # per-value-slice partial gradients live at slice i_v of (NV, B, T, H, .) buffers
        slice_tok = i_v.to(tl.int64) * B * T * H
        NT = tl.cdiv(T, C)
        for step in range(NT):
            n = NT - 1 - step
            t = n * C + rows
            mt = t < T
            tok = (i_b.to(tl.int64) * T + t) * H + i_h
            hs_off = (i_bh.to(tl.int64) * NT + n) * K * V + ok[:, None] * V + ov[None, :]
            h0 = tl.load(hs_ptr + hs_off, mask=mk[:, None] & mv[None, :], other=0.0)
            q, k, v, g, beta = _load_chunk(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, tok, mt, ok, ov, mk, mv, scale, K, V)
            do = tl.load(do_ptr + tok[:, None] * V + ov[None, :], mask=mt[:, None] & mv[None, :], other=0.0).to(tl.float32)
            G, D, E2, KK, A, Tinv, kb, vb, W, Ut = _chunk_intra(k, v, g, beta, rows, cols, C, PREC)
            eG = tl.exp(G)
            U = Ut - tl.dot(W, h0, input_precision=PREC)
            E = tl.exp(tl.where(rows[:, None] >= cols[None, :], D, float("-inf")))
            QK = tl.dot(q, tl.trans(k), input_precision=PREC)
            P = E * QK
            G_last = tl.sum(tl.where(rows == C - 1, G, 0.0), 0)
            decay_to_end = tl.exp(G_last - G)
            kd = k * decay_to_end[:, None]
            # o = diag(eG) q h0 + P U;  h1 = e^{G_last} h0 + kd^T U
            dU = tl.dot(tl.trans(P), do, input_precision=PREC) + tl.dot(kd, dh, input_precision=PREC)
            dP = tl.where(rows[:, None] >= cols[None, :], tl.dot(do, tl.trans(U), input_precision=PREC), 0.0)
            dQK = dP * E
            dq = eG[:, None] * tl.dot(do, tl.trans(h0), input_precision=PREC) + tl.dot(dQK, k, input_precision=PREC)
            dk = tl.dot(tl.trans(dQK), q, input_precision=PREC)
            dPP = dP * P
            dG = tl.sum(dPP, 1) - tl.sum(dPP, 0)
            dG += eG * tl.sum(tl.dot(q, h0, input_precision=PREC) * do, 1)
            dkd = tl.dot(U, tl.trans(dh), input_precision=PREC)
            dk += decay_to_end[:, None] * dkd
            t_kd = tl.sum(kd * dkd, 1)
            dG -= t_kd
            dG_last = tl.sum(t_kd, 0) + tl.exp(G_last) * tl.sum(tl.sum(h0 * dh, 1), 0)
            dh_prev = tl.exp(G_last) * dh + tl.dot(tl.trans(q * eG[:, None]), do, input_precision=PREC) \
                - tl.dot(tl.trans(W), dU, input_precision=PREC)
            # U = Ũ - W h0;  Ũ = Tinv vb;  W = Tinv kb;  Tinv = (I + A)^-1
            dW = -tl.dot(dU, tl.trans(h0), input_precision=PREC)
            dvb = tl.dot(tl.trans(Tinv), dU, input_precision=PREC)
            dkb = tl.dot(tl.trans(Tinv), dW, input_precision=PREC)
            dTinv = tl.dot(dU, tl.trans(vb), input_precision=PREC) + tl.dot(dW, tl.trans(kb), input_precision=PREC)
            dA = -tl.dot(tl.dot(tl.trans(Tinv), dTinv, input_precision=PREC), tl.trans(Tinv), input_precision=PREC)
            dA = tl.where(rows[:, None] > cols[None, :], dA, 0.0)
            dv = beta[:, None] * dvb
            dbeta = tl.sum(v * dvb, 1)
            dk += (beta * eG)[:, None] * dkb
            t_kb = tl.sum(k * dkb, 1)
            dbeta += eG * t_kb
            dG += beta * eG * t_kb
            # A = strict(beta_t E2_ts (k k^T)_ts)
            dAA = dA * A
            dG += tl.sum(dAA, 1) - tl.sum(dAA, 0)
            dbeta += tl.sum(dA * E2 * KK, 1)
            dKK = dA * beta[:, None] * E2
            dk += tl.dot(dKK, k, input_precision=PREC) + tl.dot(tl.trans(dKK), k, input_precision=PREC)
            dG += tl.where(rows == C - 1, dG_last, 0.0)
            dg = tl.sum(dG, 0) - tl.cumsum(dG, 0) + dG  # G = cumsum(g): reverse cumsum
            part = slice_tok + tok
            tl.store(dq_ptr + part[:, None] * K + ok[None, :], dq * scale, mask=mt[:, None] & mk[None, :])
            tl.store(dk_ptr + part[:, None] * K + ok[None, :], dk, mask=mt[:, None] & mk[None, :])
            tl.store(dv_ptr + tok[:, None] * V + ov[None, :], dv.to(dv_ptr.dtype.element_ty), mask=mt[:, None] & mv[None, :])
            tl.store(dg_ptr + part, dg, mask=mt)
            tl.store(dbeta_ptr + part, dbeta, mask=mt)
            dh = dh_prev
        tl.store(dh0_ptr + state_off, dh, mask=mk[:, None] & mv[None, :])


def _blocks(K: int, V: int) -> tuple[int, int]:
    BK = max(16, triton.next_power_of_2(K))
    if BK > 256:
        raise ValueError(f"gated_delta_rule (triton): key head dim {K} > 256 is not supported")
    return BK, max(16, min(64, triton.next_power_of_2(V)))


def _precision(x: torch.Tensor) -> str:
    return "ieee" if x.dtype == torch.float32 else "tf32"


# Each program holds several 64 x 64 and 64 x K fp32 tiles at once: more warps spread the
# registers, and no software pipelining of the chunk loop keeps shared memory to one chunk.
LAUNCH = dict(num_warps=8, num_stages=1)


class GatedDeltaRuleTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, scale: float, h0):
        q, k, v, g, beta = (t.contiguous() for t in (q, k, v, g, beta))
        B, T, H, K = q.shape
        V = v.shape[-1]
        BK, BV = _blocks(K, V)
        o = torch.empty_like(v)
        ht = torch.empty(B, H, K, V, device=q.device, dtype=torch.float32)
        h0c = h0.float().contiguous() if h0 is not None else ht  # ht is a placeholder when HAS_H0 is off
        grid = (triton.cdiv(V, BV), B * H)
        _gdn_forward_kernel[grid](q, k, v, g, beta, h0c, o, ht, ht, scale, T, H, K, V, C=CHUNK, BK=BK, BV=BV,
                                  HAS_H0=h0 is not None, STORE_STATES=False, WRITE_O=True, PREC=_precision(q), **LAUNCH)
        ctx.save_for_backward(q, k, v, g, beta, h0c if h0 is not None else None)
        ctx.scale, ctx.has_h0, ctx.h0_dtype = scale, h0 is not None, None if h0 is None else h0.dtype
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, g, beta, h0 = ctx.saved_tensors
        B, T, H, K = q.shape
        V = v.shape[-1]
        BK, BV = _blocks(K, V)
        NV, NT = triton.cdiv(V, BV), triton.cdiv(T, CHUNK)
        grid = (NV, B * H)
        hs = torch.empty(B * H, NT, K, V, device=q.device, dtype=torch.float32)
        scratch = torch.empty(B, H, K, V, device=q.device, dtype=torch.float32)
        _gdn_forward_kernel[grid](q, k, v, g, beta, h0 if h0 is not None else scratch, v, scratch, hs, ctx.scale,
                                  T, H, K, V, C=CHUNK, BK=BK, BV=BV, HAS_H0=ctx.has_h0, STORE_STATES=True,
                                  WRITE_O=False, PREC=_precision(q), **LAUNCH)
        do = do.contiguous()
        dq = torch.empty(NV, B, T, H, K, device=q.device, dtype=torch.float32)
        dk = torch.empty_like(dq)
        dg = torch.empty(NV, B, T, H, device=q.device, dtype=torch.float32)
        dbeta = torch.empty_like(dg)
        dv = torch.empty_like(v)
        dh0 = torch.empty(B, H, K, V, device=q.device, dtype=torch.float32)
        has_dht = dht is not None
        _gdn_backward_kernel[grid](q, k, v, g, beta, hs, do, dht.contiguous() if has_dht else dh0,
                                   dq, dk, dv, dg, dbeta, dh0, ctx.scale, B, T, H, K, V,
                                   C=CHUNK, BK=BK, BV=BV, HAS_DHT=has_dht, PREC=_precision(q), **LAUNCH)
        return (dq.sum(0).to(q.dtype), dk.sum(0).to(k.dtype), dv, dg.sum(0).to(g.dtype), dbeta.sum(0).to(beta.dtype),
                None, dh0.to(ctx.h0_dtype) if ctx.has_h0 else None)


def gated_delta_rule_triton(q, k, v, g, beta, scale: float, initial_state=None):
    """Same contract as gated_delta_rule_chunked."""
    return GatedDeltaRuleTriton.apply(q, k, v, g, beta, scale, initial_state)
