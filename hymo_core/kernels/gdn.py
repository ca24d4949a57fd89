"""Gated DeltaNet's token mixing op, one entry point for its three implementations.

    o, final_state = gated_delta_rule(q, k, v, g, beta, scale, initial_state, backend=...)

Layout and meaning follow flash-linear-attention (gdn_reference.py has the math):
q, k (B, T, H, K) with k L2-normalised by the caller; v (B, T, H, V); g = log decay
(B, T, H), <= 0; beta (B, T, H) in (0, 1); state (B, H, K, V) fp32 in and out.

backend: "recurrent" (the token-by-token oracle, plain autograd), "reference" (chunked
PyTorch, the CPU training path), "triton" (gdn_triton.py), or None/"auto", resolved by
`resolve_backend` like every other kernel (CUDA -> Triton, CPU -> reference).

The chunked paths are one torch.library op, `hymo::gated_delta_rule` (forward) with
`hymo::gated_delta_rule_backward`, so torch.compile sees a single opaque node whose
shapes come from the fake implementation. The forward also returns what the Triton
backward reuses (the in-chunk gate cumsum G and the inverse Tinv); the reference body
returns them empty and its backward recomputes the chunked forward under autograd.
"""

from __future__ import annotations

from typing import Optional

import torch

from hymo_core.kernels.backend import reference_vjp, resolve_backend
from hymo_core.kernels.gdn_chunk import CHUNK, gated_delta_rule_chunked
from hymo_core.kernels.gdn_reference import gated_delta_rule_recurrent


@torch.library.custom_op("hymo::gated_delta_rule", mutates_args=())
def gated_delta_rule_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                        initial_state: Optional[torch.Tensor], scale: float, backend: str,
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(o, final state, G, Tinv); G and Tinv are empty on the reference backend."""
    if backend == "triton":
        from hymo_core.kernels.gdn_triton import gdn_forward

        h0 = initial_state.float().contiguous() if initial_state is not None else None
        return gdn_forward(q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous(), scale, h0)
    o, ht = gated_delta_rule_chunked(q, k, v, g, beta, scale, initial_state)
    return o.contiguous(), ht.contiguous(), q.new_empty(0, dtype=torch.float32), q.new_empty(0, dtype=torch.float32)


@gated_delta_rule_op.register_fake
def _(q, k, v, g, beta, initial_state, scale, backend):
    B, T, H, K = q.shape
    fp32 = dict(dtype=torch.float32)
    if backend == "triton":
        G, Tinv = q.new_empty(B, T, H, **fp32), q.new_empty(B, T, H, CHUNK, **fp32)
    else:
        G, Tinv = q.new_empty(0, **fp32), q.new_empty(0, **fp32)
    return torch.empty_like(v, memory_format=torch.contiguous_format), q.new_empty(B, H, K, v.shape[-1], **fp32), G, Tinv


@torch.library.custom_op("hymo::gated_delta_rule_backward", mutates_args=())
def gated_delta_rule_backward_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    initial_state: Optional[torch.Tensor], G: torch.Tensor, Tinv: torch.Tensor, do: torch.Tensor,
    dht: Optional[torch.Tensor], scale: float, backend: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dg, dbeta, dh0) in the inputs' dtypes; dh0 is empty without an initial state."""
    if backend == "triton":
        from hymo_core.kernels.gdn_triton import gdn_backward

        h0 = initial_state.float().contiguous() if initial_state is not None else None
        grads = gdn_backward(q.contiguous(), k.contiguous(), v.contiguous(), beta.contiguous(), G, Tinv, h0,
                             do.contiguous(), dht.float().contiguous() if dht is not None else None, scale)
    else:
        def forward(q, k, v, g, beta, h0):
            return gated_delta_rule_chunked(q, k, v, g, beta, scale, h0)

        grads = reference_vjp(forward, [q, k, v, g, beta, initial_state], [do, dht])
    if initial_state is None:
        grads = list(grads[:5]) + [q.new_empty(0, dtype=torch.float32)]
    inputs = (q, k, v, g, beta, initial_state if initial_state is not None else grads[5])
    return tuple(grad.to(x.dtype).contiguous() for grad, x in zip(grads, inputs))


@gated_delta_rule_backward_op.register_fake
def _(q, k, v, g, beta, initial_state, G, Tinv, do, dht, scale, backend):
    dh0 = torch.empty_like(initial_state, memory_format=torch.contiguous_format) if initial_state is not None else q.new_empty(0, dtype=torch.float32)
    return (torch.empty_like(q, memory_format=torch.contiguous_format), torch.empty_like(k, memory_format=torch.contiguous_format), torch.empty_like(v, memory_format=torch.contiguous_format), torch.empty_like(g, memory_format=torch.contiguous_format),
            torch.empty_like(beta, memory_format=torch.contiguous_format), dh0)


def _setup_context(ctx, inputs, output):
    q, k, v, g, beta, initial_state, scale, backend = inputs
    ctx.save_for_backward(q, k, v, g, beta, initial_state, output[2], output[3])
    ctx.scale, ctx.backend, ctx.has_h0 = scale, backend, initial_state is not None
    ctx.set_materialize_grads(False)  # an unused final state (training) is dht None, not a zero-filled (B, H, K, V)


def _backward(ctx, do, dht, _dG, _dTinv):
    q, k, v, g, beta, initial_state, G, Tinv = ctx.saved_tensors
    if do is None:
        do = torch.zeros_like(v)
    dq, dk, dv, dg, dbeta, dh0 = gated_delta_rule_backward_op(q, k, v, g, beta, initial_state, G, Tinv, do, dht,
                                                              ctx.scale, ctx.backend)
    return dq, dk, dv, dg, dbeta, dh0 if ctx.has_h0 else None, None, None


gated_delta_rule_op.register_autograd(_backward, setup_context=_setup_context)


def gated_delta_rule(
    q_BTHK: torch.Tensor, k_BTHK: torch.Tensor, v_BTHV: torch.Tensor, g_BTH: torch.Tensor, beta_BTH: torch.Tensor,
    scale: float | None = None, initial_state_BHKV: torch.Tensor | None = None, backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(o (B, T, H, V) in v's dtype, final state (B, H, K, V) fp32)."""
    B, T, H, K = q_BTHK.shape
    if k_BTHK.shape != q_BTHK.shape or v_BTHV.shape[:3] != (B, T, H) or g_BTH.shape != (B, T, H) \
            or beta_BTH.shape != (B, T, H):
        raise ValueError(f"gated_delta_rule: shapes q {tuple(q_BTHK.shape)} k {tuple(k_BTHK.shape)} "
                         f"v {tuple(v_BTHV.shape)} g {tuple(g_BTH.shape)} beta {tuple(beta_BTH.shape)} disagree")
    if initial_state_BHKV is not None and initial_state_BHKV.shape != (B, H, K, v_BTHV.shape[-1]):
        raise ValueError(f"initial state {tuple(initial_state_BHKV.shape)} != {(B, H, K, v_BTHV.shape[-1])}")
    scale = K ** -0.5 if scale is None else scale
    if backend == "recurrent":
        return gated_delta_rule_recurrent(q_BTHK, k_BTHK, v_BTHV, g_BTH, beta_BTH, scale, initial_state_BHKV)
    o, ht, _, _ = gated_delta_rule_op(q_BTHK, k_BTHK, v_BTHV, g_BTH, beta_BTH, initial_state_BHKV, float(scale),
                                      resolve_backend(q_BTHK, backend))
    return o, ht
