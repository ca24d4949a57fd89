"""SwiGLU activation: h = silu(gate) * up, the elementwise core of the FFN.

Eager PyTorch writes silu(gate) to memory and reads it back for the product;
the Triton kernel does both in one pass in fp32 registers, and the backward
recomputes the sigmoid instead of saving it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hymo_core.kernels.backend import HAVE_TRITON, resolve_backend

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


class SwiGLUTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        gate, up = gate.contiguous(), up.contiguous()
        h = torch.empty_like(gate)
        n = gate.numel()
        _swiglu_forward_kernel[(triton.cdiv(n, BLOCK),)](gate, up, h, n, BLOCK=BLOCK)
        ctx.save_for_backward(gate, up)
        return h

    @staticmethod
    def backward(ctx, dh: torch.Tensor):
        gate, up = ctx.saved_tensors
        dh = dh.contiguous()
        dgate, dup = torch.empty_like(gate), torch.empty_like(up)
        n = gate.numel()
        _swiglu_backward_kernel[(triton.cdiv(n, BLOCK),)](dh, gate, up, dgate, dup, n, BLOCK=BLOCK)
        return dgate, dup


def swiglu(gate: torch.Tensor, up: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    """silu(gate) * up, dispatched per `resolve_backend`."""
    if gate.shape != up.shape:
        raise ValueError(f"gate {tuple(gate.shape)} and up {tuple(up.shape)} must match")
    if resolve_backend(gate, backend) == "triton":
        return SwiGLUTriton.apply(gate, up)
    return swiglu_reference(gate, up)
