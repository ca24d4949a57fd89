"""`torch._grouped_mm` in any dtype under torch.compile: the MoE experts' grouped matmul.

Eager `_grouped_mm` runs fp32 on the CPU (torch's per-group loop), but its fake (meta) implementation
insists on bf16, so tracing an fp32 MoE block (the CPU's layout, compile on) failed with "Expected
inputs of BF16 type". `grouped_mm` calls the aten op directly in bf16, where its fake and Inductor's
lowering apply (the GPU's path), and otherwise `hymo::grouped_mm`, a custom op with a dtype-agnostic
fake and its own backward (`hymo::grouped_mm_backward`, two `_grouped_mm` calls):

    out (m, n) = a (m, k) x b (G, k, n), rows of group g = offs[g-1] .. offs[g]
    da = dout x b^T (grouped the same way);  db_g = a_g^T dout_g  (the (k, m) x (m, n) -> (G, k, n) form)
"""
from __future__ import annotations

import torch


@torch.library.custom_op("hymo::grouped_mm", mutates_args=())
def grouped_mm_op(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    return torch._grouped_mm(a, b, offs=offs)


@grouped_mm_op.register_fake
def _(a, b, offs):
    return a.new_empty(a.shape[0], b.shape[-1])


@torch.library.custom_op("hymo::grouped_mm_backward", mutates_args=())
def grouped_mm_backward_op(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, dout: torch.Tensor
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    dout = dout.contiguous()  # autograd may hand a broadcast (stride-0) gradient, which _grouped_mm rejects
    return torch._grouped_mm(dout, b.mT, offs=offs), torch._grouped_mm(a.mT, dout, offs=offs)


@grouped_mm_backward_op.register_fake
def _(a, b, offs, dout):
    return a.new_empty(a.shape), b.new_empty(b.shape)


def _setup(ctx, inputs, output):
    a, b, offs = inputs
    ctx.save_for_backward(a, b, offs)


def _backward(ctx, dout):
    a, b, offs = ctx.saved_tensors
    da, db = grouped_mm_backward_op(a, b, offs, dout)
    return da, db, None


grouped_mm_op.register_autograd(_backward, setup_context=_setup)


def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """a (m, k) x b (G, k, n) by row groups ending at `offs` (int32, on a's device)."""
    if a.dtype == torch.bfloat16:
        return torch._grouped_mm(a, b, offs=offs)
    return grouped_mm_op(a, b, offs)


def _register_flops() -> None:
    """FlopCounterMode sees the custom ops, not the aten calls in their bodies: 2 m k n forward, twice that backward."""
    from torch.utils import flop_counter

    @flop_counter.register_flop_formula(torch.ops.hymo.grouped_mm)
    def _(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
        return 2 * a_shape[0] * a_shape[1] * b_shape[-1]

    @flop_counter.register_flop_formula(torch.ops.hymo.grouped_mm_backward)
    def _(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
        return 4 * a_shape[0] * a_shape[1] * b_shape[-1]


_register_flops()
