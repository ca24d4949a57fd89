"""Gated DeltaNet's per-head gates from their projections, in one pass each way.

    g    = -exp(A_log) * softplus(a + dt_bias)      (log decay, <= 0)
    beta = sigmoid(b)

a and b (B, T, H) are the last columns of GDN's fused input projection, read in place through their
row stride; A_log and dt_bias are the (H,) parameters. Both results are fp32, as the GDN op takes them.
In eager PyTorch the GDN block ran this as 9 more launches forward (casts to fp32, exp, neg, add,
softplus, mul, sigmoid) and 11 more backward a layer (bench/block_budget.py), ~480 launches a step at
hymo-750m's 24 GDN layers, each for at most 0.5 MB of data. The Triton forward is one launch; the
backward recomputes softplus and both sigmoids from a and b (nothing saved but the inputs), writes da
and db, and sums the gradients of A_log and dt_bias over the tokens per program in fp32, each reduced
by one sum at the end (no atomics, deterministic).
Registered as `hymo::gdn_gates` (+ `_backward`). softplus is F.softplus's (linear above 20).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hymo_core.kernels.backend import HAVE_TRITON, program_count, reference_vjp, resolve_backend

BLOCK_N = 128  # tokens a program handles at once (256 puts the backward at 255 registers on sm_80)
SOFTPLUS_THRESHOLD = 20.0  # F.softplus's: above it softplus(x) is x in fp32


def gdn_gates_reference(a_BTH: torch.Tensor, b_BTH: torch.Tensor, A_log_H: torch.Tensor, dt_bias_H: torch.Tensor,
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain PyTorch in fp32: the CPU body and the tests' oracle."""
    g_BTH = -A_log_H.float().exp() * F.softplus(a_BTH.float() + dt_bias_H.float())
    return g_BTH, torch.sigmoid(b_BTH.float())


if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _softplus(x):
        """log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)), F.softplus's to a few ulps at every x (linear above 20).

        log1p(e) as log(u) * e / (u - 1) with u = 1 + e rounded (Goldberg's): the rounding error of u cancels, where
        log(1 + e) alone is off by ~6e-8 / e relative (1e-3 at x = -10) and is 0 below x ~ -17."""
        e = tl.exp(-tl.abs(x))
        u = 1.0 + e
        rounded_to_one = u == 1.0
        log1p = tl.where(rounded_to_one, e, tl.log(u) * (e / tl.where(rounded_to_one, 1.0, u - 1.0)))
        return tl.where(x > 20.0, x, tl.maximum(x, 0.0) + log1p)

    @triton.jit
    def _gdn_gates_forward_kernel(a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, g_ptr, beta_ptr, N, H, stride_a, stride_b,
                                  BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr):
        n = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
        h = tl.arange(0, BLOCK_H)
        mask = (n < N)[:, None] & (h < H)[None, :]
        a = tl.load(a_ptr + n[:, None] * stride_a + h[None, :], mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + n[:, None] * stride_b + h[None, :], mask=mask, other=0.0).to(tl.float32)
        A = tl.load(A_log_ptr + h, mask=h < H, other=0.0).to(tl.float32)
        dt = tl.load(dt_bias_ptr + h, mask=h < H, other=0.0).to(tl.float32)
        g = -tl.exp(A)[None, :] * _softplus(a + dt[None, :])
        out = n[:, None] * H + h[None, :]
        tl.store(g_ptr + out, g, mask=mask)
        tl.store(beta_ptr + out, tl.sigmoid(b), mask=mask)

    @triton.jit
    def _gdn_gates_backward_kernel(a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, dg_ptr, dbeta_ptr, da_ptr, db_ptr,
                                   dA_partial_ptr, ddt_partial_ptr, N, H, stride_a, stride_b, blocks_per_program,
                                   BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr):
        """Program p: blocks_per_program blocks of BLOCK_N tokens from block p * blocks_per_program; one fp32
        partial of dA_log and of ddt_bias per program."""
        h = tl.arange(0, BLOCK_H)
        A = tl.load(A_log_ptr + h, mask=h < H, other=0.0).to(tl.float32)
        dt = tl.load(dt_bias_ptr + h, mask=h < H, other=0.0).to(tl.float32)
        decay_rate = tl.exp(A)
        dA = tl.zeros([BLOCK_H], dtype=tl.float32)
        ddt = tl.zeros([BLOCK_H], dtype=tl.float32)
        for block in range(0, blocks_per_program):
            n = (tl.program_id(0).to(tl.int64) * blocks_per_program + block) * BLOCK_N + tl.arange(0, BLOCK_N)
            mask = (n < N)[:, None] & (h < H)[None, :]
            x = tl.load(a_ptr + n[:, None] * stride_a + h[None, :], mask=mask, other=0.0).to(tl.float32) + dt[None, :]
            b = tl.load(b_ptr + n[:, None] * stride_b + h[None, :], mask=mask, other=0.0).to(tl.float32)
            out = n[:, None] * H + h[None, :]
            dg = tl.load(dg_ptr + out, mask=mask, other=0.0).to(tl.float32)
            dbeta = tl.load(dbeta_ptr + out, mask=mask, other=0.0).to(tl.float32)
            # d softplus / dx = sigmoid(x) (F.softplus's backward passes the gradient through above the threshold)
            dsoftplus = tl.where(x > 20.0, 1.0, tl.sigmoid(x))
            da = -dg * decay_rate[None, :] * dsoftplus
            beta = tl.sigmoid(b)
            tl.store(da_ptr + out, da.to(da_ptr.dtype.element_ty), mask=mask)
            tl.store(db_ptr + out, (dbeta * beta * (1.0 - beta)).to(db_ptr.dtype.element_ty), mask=mask)
            ddt += tl.sum(da, axis=0)
            dA += tl.sum(-dg * decay_rate[None, :] * _softplus(x), axis=0)  # d g / d A_log = g
        tl.store(dA_partial_ptr + tl.program_id(0) * H + h, dA, mask=h < H)
        tl.store(ddt_partial_ptr + tl.program_id(0) * H + h, ddt, mask=h < H)


def _rows(x_BTH: torch.Tensor) -> tuple[torch.Tensor, int]:
    """x and the stride between its (B x T) rows, copied only where B and T do not merge into one row index
    (at T = 1 the rows are the batch's, a decoding step's last token of a longer projection included)."""
    B, T, H = x_BTH.shape
    if x_BTH.stride(-1) != 1 or (B > 1 and T > 1 and x_BTH.stride(0) != T * x_BTH.stride(1)):
        x_BTH = x_BTH.contiguous()
    return x_BTH, x_BTH.stride(1) if T > 1 else (x_BTH.stride(0) if B > 1 else H)


def gdn_gates_forward_triton(a, b, A_log, dt_bias):
    (a, stride_a), (b, stride_b) = _rows(a), _rows(b)
    B, T, H = a.shape
    g, beta = (torch.empty(B, T, H, device=a.device, dtype=torch.float32) for _ in range(2))
    _gdn_gates_forward_kernel[(triton.cdiv(B * T, BLOCK_N),)](
        a, b, A_log, dt_bias, g, beta, B * T, H, stride_a, stride_b, BLOCK_N=BLOCK_N,
        BLOCK_H=triton.next_power_of_2(H))
    return g, beta


def gdn_gates_backward_triton(dg, dbeta, a, b, A_log, dt_bias):
    (a_rows, stride_a), (b_rows, stride_b) = _rows(a), _rows(b)
    B, T, H = a.shape
    N = B * T
    da, db = torch.empty(B, T, H, device=a.device, dtype=a.dtype), torch.empty(B, T, H, device=b.device, dtype=b.dtype)
    blocks = triton.cdiv(N, BLOCK_N)
    programs = program_count(a.device, blocks)
    per_program = triton.cdiv(blocks, programs)
    programs = triton.cdiv(blocks, per_program)
    # Two partial buffers, not one (programs, 2, H) summed once: a custom op may not return two views of one tensor.
    dA_partial, ddt_partial = (torch.empty(programs, H, device=a.device, dtype=torch.float32) for _ in range(2))
    _gdn_gates_backward_kernel[(programs,)](
        a_rows, b_rows, A_log, dt_bias, dg.contiguous(), dbeta.contiguous(), da, db, dA_partial, ddt_partial, N, H,
        stride_a, stride_b, per_program, BLOCK_N=BLOCK_N, BLOCK_H=triton.next_power_of_2(H))
    return da, db, dA_partial.sum(0).to(A_log.dtype), ddt_partial.sum(0).to(dt_bias.dtype)


@torch.library.custom_op("hymo::gdn_gates", mutates_args=())
def gdn_gates_op(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, backend: str,
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    if backend == "triton":
        return gdn_gates_forward_triton(a, b, A_log, dt_bias)
    g, beta = gdn_gates_reference(a, b, A_log, dt_bias)
    return g.contiguous(), beta.contiguous()


@gdn_gates_op.register_fake
def _(a, b, A_log, dt_bias, backend):
    return (a.new_empty(a.shape, dtype=torch.float32), b.new_empty(b.shape, dtype=torch.float32))


@torch.library.custom_op("hymo::gdn_gates_backward", mutates_args=())
def gdn_gates_backward_op(dg: torch.Tensor, dbeta: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                          A_log: torch.Tensor, dt_bias: torch.Tensor, backend: str,
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(da, db, dA_log, ddt_bias) in the inputs' dtypes."""
    if backend == "triton":
        return gdn_gates_backward_triton(dg, dbeta, a, b, A_log, dt_bias)
    grads = reference_vjp(gdn_gates_reference, [a, b, A_log, dt_bias], [dg, dbeta])
    return tuple(grad.to(x.dtype).contiguous() for grad, x in zip(grads, (a, b, A_log, dt_bias)))


@gdn_gates_backward_op.register_fake
def _(dg, dbeta, a, b, A_log, dt_bias, backend):
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (a, b, A_log, dt_bias))


def _setup(ctx, inputs, output):
    a, b, A_log, dt_bias, backend = inputs
    ctx.save_for_backward(a, b, A_log, dt_bias)
    ctx.backend = backend


def _backward(ctx, dg, dbeta):
    a, b, A_log, dt_bias = ctx.saved_tensors
    da, db, dA_log, ddt_bias = gdn_gates_backward_op(dg, dbeta, a, b, A_log, dt_bias, ctx.backend)
    return da, db, dA_log, ddt_bias, None


gdn_gates_op.register_autograd(_backward, setup_context=_setup)


def gdn_gates(a_BTH: torch.Tensor, b_BTH: torch.Tensor, A_log_H: torch.Tensor, dt_bias_H: torch.Tensor,
              backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, beta), each (B, T, H) fp32: the op `hymo::gdn_gates`, its body per `resolve_backend`."""
    H = A_log_H.shape[0]
    if a_BTH.ndim != 3 or a_BTH.shape != b_BTH.shape or a_BTH.shape[-1] != H or dt_bias_H.shape != (H,):
        raise ValueError(f"gdn_gates: a {tuple(a_BTH.shape)}, b {tuple(b_BTH.shape)}, A_log {tuple(A_log_H.shape)} "
                         f"and dt_bias {tuple(dt_bias_H.shape)} disagree")
    return gdn_gates_op(a_BTH, b_BTH, A_log_H, dt_bias_H, resolve_backend(a_BTH, backend))
