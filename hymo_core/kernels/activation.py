"""SwiGLU activation: h = silu(gate) * up, the elementwise core of the FFN.

Eager PyTorch writes silu(gate) to memory and reads it back for the product;
the Triton kernel does both in one pass in fp32 registers, and the backward
recomputes the sigmoid instead of saving it. Registered as the torch.library op
`hymo::swiglu` (+ `hymo::swiglu_backward`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hymo_core.kernels.backend import HAVE_TRITON, reference_vjp, resolve_backend

if HAVE_TRITON:
    from hymo_core.kernels.backend import wide_offset

BLOCK = 1024


def swiglu_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Plain PyTorch, computed in fp32 and cast back to the input dtype."""
    return (F.silu(gate.float()) * up.float()).to(gate.dtype)


if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _swiglu_forward_kernel(gate_ptr, up_ptr, h_ptr, n, BLOCK: tl.constexpr):
        offsets = wide_offset(tl.program_id(0), BLOCK) + tl.arange(0, BLOCK)
        mask = offsets < n
        g = tl.load(gate_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(up_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        h = g * tl.sigmoid(g) * u
        tl.store(h_ptr + offsets, h.to(h_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _swiglu_backward_kernel(dh_ptr, gate_ptr, up_ptr, dgate_ptr, dup_ptr, n, BLOCK: tl.constexpr):
        offsets = wide_offset(tl.program_id(0), BLOCK) + tl.arange(0, BLOCK)
        mask = offsets < n
        dh = tl.load(dh_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(gate_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(up_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        sig = tl.sigmoid(g)
        silu = g * sig
        # d silu / dg = sig * (1 + g * (1 - sig))
        dgate = dh * u * sig * (1.0 + g * (1.0 - sig))
        dup = dh * silu
        tl.store(dgate_ptr + offsets, dgate.to(dgate_ptr.dtype.element_ty), mask=mask)
        tl.store(dup_ptr + offsets, dup.to(dup_ptr.dtype.element_ty), mask=mask)


def swiglu_forward_triton(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    gate, up = gate.contiguous(), up.contiguous()
    h = torch.empty_like(gate)
    n = gate.numel()
    _swiglu_forward_kernel[(triton.cdiv(n, BLOCK),)](gate, up, h, n, BLOCK=BLOCK)
    return h


def swiglu_backward_triton(dh, gate, up) -> tuple[torch.Tensor, torch.Tensor]:
    gate, up, dh = gate.contiguous(), up.contiguous(), dh.contiguous()
    dgate, dup = torch.empty_like(gate), torch.empty_like(up)
    n = gate.numel()
    _swiglu_backward_kernel[(triton.cdiv(n, BLOCK),)](dh, gate, up, dgate, dup, n, BLOCK=BLOCK)
    return dgate, dup


@torch.library.custom_op("hymo::swiglu", mutates_args=())
def swiglu_op(gate: torch.Tensor, up: torch.Tensor, backend: str) -> torch.Tensor:
    if backend == "triton":
        return swiglu_forward_triton(gate, up)
    return swiglu_reference(gate, up).contiguous()  # the fake's layout, whatever the inputs' strides


@swiglu_op.register_fake
def _(gate, up, backend):
    return torch.empty_like(gate, memory_format=torch.contiguous_format)


@torch.library.custom_op("hymo::swiglu_backward", mutates_args=())
def swiglu_backward_op(dh: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, backend: str,
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    if backend == "triton":
        return swiglu_backward_triton(dh, gate, up)
    dgate, dup = reference_vjp(lambda g, u: (swiglu_reference(g, u),), [gate, up], [dh])
    return dgate.contiguous(), dup.contiguous()


@swiglu_backward_op.register_fake
def _(dh, gate, up, backend):
    return torch.empty_like(gate, memory_format=torch.contiguous_format), torch.empty_like(up, memory_format=torch.contiguous_format)


def _setup_swiglu(ctx, inputs, output):
    gate, up, backend = inputs
    ctx.save_for_backward(gate, up)
    ctx.backend = backend


def _swiglu_backward(ctx, dh):
    gate, up = ctx.saved_tensors
    dgate, dup = swiglu_backward_op(dh, gate, up, ctx.backend)
    return dgate, dup, None


swiglu_op.register_autograd(_swiglu_backward, setup_context=_setup_swiglu)


def swiglu(gate: torch.Tensor, up: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    """silu(gate) * up: the op `hymo::swiglu`, its body per `resolve_backend`."""
    if gate.shape != up.shape:
        raise ValueError(f"gate {tuple(gate.shape)} and up {tuple(up.shape)} must match")
    return swiglu_op(gate, up, resolve_backend(gate, backend))
