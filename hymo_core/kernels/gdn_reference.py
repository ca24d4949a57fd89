"""Gated delta rule, the oracle: one token at a time, in fp32 (flash-linear-attention layout).

Per head, with the state h (K x V, i.e. S^T of the paper's S_t):
    h_t = a_t (I - b_t k_t k_t^T) h_{t-1} + b_t k_t v_t^T,   o_t = h_t^T (scale q_t)
written as "decay, read the current value of k_t, move it toward v_t by b_t":
    h <- a_t h;  u_t = b_t (v_t - h^T k_t);  h <- h + k_t u_t^T.
`g` is log a_t (<= 0). Shapes: q, k (B, T, H, K); v (B, T, H, V); g, beta (B, T, H);
state (B, H, K, V) in fp32. The loop is slow but differentiable, and every other
implementation is checked against it.
"""

from __future__ import annotations

import torch


def gated_delta_rule_recurrent(
    q_BTHK: torch.Tensor, k_BTHK: torch.Tensor, v_BTHV: torch.Tensor, g_BTH: torch.Tensor, beta_BTH: torch.Tensor,
    scale: float, initial_state_BHKV: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(o in v's dtype, final state in fp32)."""
    B, T, H, K = k_BTHK.shape
    V = v_BTHV.shape[-1]
    q, k, v = (t.float() for t in (q_BTHK, k_BTHK, v_BTHV))
    a_BTH, beta = g_BTH.float().exp(), beta_BTH.float()
    h_BHKV = (initial_state_BHKV.float() if initial_state_BHKV is not None
              else q.new_zeros(B, H, K, V))
    outputs = []
    for t in range(T):
        h_BHKV = h_BHKV * a_BTH[:, t, :, None, None]
        k_BHK = k[:, t]
        u_BHV = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhkv,bhk->bhv", h_BHKV, k_BHK))
        h_BHKV = h_BHKV + k_BHK[..., None] * u_BHV[..., None, :]
        outputs.append(torch.einsum("bhkv,bhk->bhv", h_BHKV, q[:, t] * scale))
    o_BTHV = torch.stack(outputs, dim=1) if outputs else v.new_zeros(B, 0, H, V)
    return o_BTHV.to(v_BTHV.dtype), h_BHKV
