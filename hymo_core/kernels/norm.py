"""RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight, statistics in fp32.

The Triton forward stores one fp32 reciprocal RMS per row so the backward
never recomputes the reduction; the weight gradient is summed per program
into an fp32 buffer and reduced once at the end (no atomics, deterministic).
Registered as the torch.library op `hymo::rms_norm` (+ `hymo::rms_norm_backward`);
on the reference backend the backward recomputes the forward under torch.func.vjp.

Under torch.compile with the `auto` backend it traces as plain PyTorch
(backend.inductor_generates): Inductor then emits the residual add and the norm as
one persistent-reduction kernel (what llm.c and Liger hand-fuse as a residual-add +
RMSNorm), which no custom op or `triton_op` could join, since Inductor never fuses
into a kernel it did not generate. In eager mode the hand kernel stays: one launch
and one read of x, against F.rms_norm's several in fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hymo_core.kernels.backend import HAVE_TRITON, inductor_generates, program_count, reference_vjp, resolve_backend

if HAVE_TRITON:
    from hymo_core.kernels.backend import wide_offset


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Plain PyTorch: normalise in fp32, scale by the fp32 gain, cast back."""
    return F.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps).to(x.dtype)


if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _rms_norm_forward_kernel(
        x_ptr, weight_ptr, y_ptr, rstd_ptr, row_stride, D, eps, BLOCK_D: tl.constexpr
    ):
        row = tl.program_id(0)
        start = wide_offset(row, row_stride)
        cols = tl.arange(0, BLOCK_D)
        mask = cols < D
        x_D = tl.load(x_ptr + start + cols, mask=mask, other=0.0).to(tl.float32)
        w_D = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x_D * x_D, axis=0) / D + eps)
        tl.store(rstd_ptr + row, rstd)
        y_D = x_D * rstd * w_D
        tl.store(y_ptr + start + cols, y_D.to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _rms_norm_backward_kernel(
        dy_ptr, x_ptr, weight_ptr, rstd_ptr, dx_ptr, dweight_partial_ptr,
        row_stride, N, D, rows_per_program, BLOCK_D: tl.constexpr,
    ):
        program = tl.program_id(0)
        cols = tl.arange(0, BLOCK_D)
        mask = cols < D
        w_D = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        dweight_D = tl.zeros([BLOCK_D], dtype=tl.float32)
        first = wide_offset(program, rows_per_program)
        last = tl.minimum(first + rows_per_program, N)
        for row in range(first, last):
            start = row * row_stride  # row is int64: it counts from `first`
            x_D = tl.load(x_ptr + start + cols, mask=mask, other=0.0).to(tl.float32)
            dy_D = tl.load(dy_ptr + start + cols, mask=mask, other=0.0).to(tl.float32)
            rstd = tl.load(rstd_ptr + row)
            xhat_D = x_D * rstd
            wdy_D = w_D * dy_D
            # d/dx of x*rstd projects out the component along xhat.
            c = tl.sum(xhat_D * wdy_D, axis=0) / D
            dx_D = (wdy_D - xhat_D * c) * rstd
            tl.store(dx_ptr + start + cols, dx_D.to(dx_ptr.dtype.element_ty), mask=mask)
            dweight_D += dy_D * xhat_D
        tl.store(dweight_partial_ptr + wide_offset(program, D) + cols, dweight_D, mask=mask)


def rms_norm_forward_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, fp32 reciprocal RMS per row)."""
    x_ND = x.reshape(-1, x.shape[-1]).contiguous()
    N, D = x_ND.shape
    y_ND = torch.empty_like(x_ND)
    rstd_N = torch.empty(N, device=x.device, dtype=torch.float32)
    _rms_norm_forward_kernel[(N,)](x_ND, weight, y_ND, rstd_N, D, D, eps, BLOCK_D=triton.next_power_of_2(D))
    return y_ND.view(x.shape), rstd_N


def rms_norm_backward_triton(dy, x, weight, rstd_N) -> tuple[torch.Tensor, torch.Tensor]:
    x_ND = x.reshape(-1, x.shape[-1]).contiguous()
    N, D = x_ND.shape
    dy_ND = dy.reshape(N, D).contiguous()
    dx_ND = torch.empty_like(x_ND)
    programs = program_count(x_ND.device, N)
    rows_per_program = triton.cdiv(N, programs)
    dweight_partial_PD = torch.empty(programs, D, device=x_ND.device, dtype=torch.float32)
    _rms_norm_backward_kernel[(programs,)](
        dy_ND, x_ND, weight, rstd_N, dx_ND, dweight_partial_PD,
        D, N, D, rows_per_program, BLOCK_D=triton.next_power_of_2(D),
    )
    return dx_ND.view(x.shape), dweight_partial_PD.sum(0).to(weight.dtype)


def _rms_norm_with_rstd(x, weight, eps):
    rstd = torch.rsqrt(x.float().square().mean(-1) + eps).reshape(-1)
    return rms_norm_reference(x, weight, eps), rstd


@torch.library.custom_op("hymo::rms_norm", mutates_args=())
def rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, rstd): the Triton backward reads rstd; the reference backward recomputes."""
    if backend == "triton":
        return rms_norm_forward_triton(x, weight, eps)
    return _rms_norm_with_rstd(x, weight, eps)


@rms_norm_op.register_fake
def _(x, weight, eps, backend):
    return torch.empty_like(x, memory_format=torch.contiguous_format), x.new_empty(x.numel() // x.shape[-1], dtype=torch.float32)


@torch.library.custom_op("hymo::rms_norm_backward", mutates_args=())
def rms_norm_backward_op(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor, eps: float,
                         backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    if backend == "triton":
        return rms_norm_backward_triton(dy, x, weight, rstd)
    dx, dweight = reference_vjp(lambda x, w: (rms_norm_reference(x, w, eps),), [x, weight], [dy])
    return dx, dweight


@rms_norm_backward_op.register_fake
def _(dy, x, weight, rstd, eps, backend):
    return torch.empty_like(x, memory_format=torch.contiguous_format), torch.empty_like(weight, memory_format=torch.contiguous_format)


def _setup_rms_norm(ctx, inputs, output):
    x, weight, eps, backend = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.eps, ctx.backend = eps, backend
    ctx.set_materialize_grads(False)  # rstd is never differentiated: no zero-filled gradient for it


def _rms_norm_backward(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    if dy is None:
        dy = torch.zeros_like(x)
    dx, dweight = rms_norm_backward_op(dy, x, weight, rstd, ctx.eps, ctx.backend)
    return dx, dweight, None, None


rms_norm_op.register_autograd(_rms_norm_backward, setup_context=_setup_rms_norm)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5, backend: str | None = None
) -> torch.Tensor:
    """RMSNorm over the last dimension of `x`: the op `hymo::rms_norm`, its body per `resolve_backend`."""
    if inductor_generates(backend):
        return rms_norm_reference(x, weight, eps)
    return rms_norm_op(x, weight, eps, resolve_backend(x, backend))[0]
