"""Gated DeltaNet's token mixing op, one entry point for its three implementations.

    o, final_state = gated_delta_rule(q, k, v, g, beta, scale, initial_state, backend=...)

Layout and meaning follow flash-linear-attention (gdn_reference.py has the math):
q, k (B, T, H, K) with k L2-normalised by the caller; v (B, T, H, V); g = log decay
(B, T, H), <= 0; beta (B, T, H) in (0, 1); state (B, H, K, V) fp32 in and out.

backend: "recurrent" (the token-by-token oracle), "reference" (chunked PyTorch, the CPU
training path), "triton" (chunked Triton kernel, forward and backward), or None/"auto",
resolved by `resolve_backend` like every other kernel (CUDA -> Triton, CPU -> reference).
"""

from __future__ import annotations

import torch

from hymo_core.kernels.backend import resolve_backend
from hymo_core.kernels.gdn_chunk import gated_delta_rule_chunked
from hymo_core.kernels.gdn_reference import gated_delta_rule_recurrent


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
    if resolve_backend(q_BTHK, backend) == "triton":
        from hymo_core.kernels.gdn_triton import gated_delta_rule_triton

        return gated_delta_rule_triton(q_BTHK, k_BTHK, v_BTHV, g_BTH, beta_BTH, scale, initial_state_BHKV)
    return gated_delta_rule_chunked(q_BTHK, k_BTHK, v_BTHV, g_BTH, beta_BTH, scale, initial_state_BHKV)
