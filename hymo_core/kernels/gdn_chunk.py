"""Gated delta rule in chunks of 64 (WY/UT form): matmuls inside a chunk, a recurrence across chunks.

Inside a chunk with local log-decay cumsum G_t (Gamma_t = exp G_t) and the state h0
at its start, the per-token updates u_t = b_t (v_t - a_t h_{t-1}^T k_t) satisfy the
unit-lower-triangular system (UT transform)
    (I + A) U = diag(b) V - diag(b Gamma) K h0,   A_ts = b_t Gamma_t/Gamma_s k_t.k_s  (s < t),
so with Tinv = (I + A)^-1, W = Tinv diag(b Gamma) K and Ũ = Tinv diag(b) V (WY form):
    U  = Ũ - W h0
    O  = diag(Gamma) Q h0 + (mask_{s<=t} Gamma_t/Gamma_s Q K^T) U
    h1 = Gamma_C h0 + (diag(Gamma_C/Gamma) K)^T U.
Everything but the last two lines' h0 terms is computed for a group of chunks at once (8, so
the C x C tensors stay in cache); only the state walks chunk by chunk, so the cost is linear
in T. Autograd differentiates it.
A ragged tail is padded with k = v = 0, b = 0, g = 0, which leaves the state untouched.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK = 64
GROUP = 8  # chunks whose intra-chunk terms are computed together


def chunk_intra(k_BHNCK: torch.Tensor, v_BHNCV: torch.Tensor, G_BHNC: torch.Tensor, beta_BHNC: torch.Tensor,
                decay_BHNCC: torch.Tensor):
    """Per-chunk quantities that do not depend on the incoming state: (W, Ũ).

    `decay_BHNCC` is Gamma_t / Gamma_s on and below the diagonal, 0 above.
    """
    C = k_BHNCK.shape[-2]
    strict_CC = torch.ones(C, C, dtype=k_BHNCK.dtype, device=k_BHNCK.device).tril(-1)
    A_BHNCC = (beta_BHNC[..., :, None] * strict_CC) * decay_BHNCC * (k_BHNCK @ k_BHNCK.transpose(-1, -2))
    eye_CC = torch.eye(C, dtype=k_BHNCK.dtype, device=k_BHNCK.device)
    rhs = torch.cat((beta_BHNC[..., None] * G_BHNC.exp()[..., None] * k_BHNCK, beta_BHNC[..., None] * v_BHNCV), -1)
    sol = torch.linalg.solve_triangular(eye_CC + A_BHNCC, rhs, upper=False, unitriangular=True)
    K = k_BHNCK.shape[-1]
    return sol[..., :K], sol[..., K:]


def gated_delta_rule_chunked(
    q_BTHK: torch.Tensor, k_BTHK: torch.Tensor, v_BTHV: torch.Tensor, g_BTH: torch.Tensor, beta_BTH: torch.Tensor,
    scale: float, initial_state_BHKV: torch.Tensor | None = None, chunk_size: int = CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as gated_delta_rule_recurrent; fp32 math, o in v's dtype."""
    B, T, H, K = k_BTHK.shape
    V = v_BTHV.shape[-1]
    C = chunk_size
    N = max(1, -(-T // C))
    pad = N * C - T

    def chunks(x: torch.Tensor) -> torch.Tensor:  # (B, T, H, ...) -> (B, H, N, C, ...) in fp32
        x = x.float().transpose(1, 2)
        if pad:
            x = F.pad(x, (0, 0) * (x.ndim - 3) + (0, pad))
        return x.reshape(B, H, N, C, *x.shape[3:])

    q, k, v = chunks(q_BTHK) * scale, chunks(k_BTHK), chunks(v_BTHV)
    g, beta = chunks(g_BTH), chunks(beta_BTH)
    h_BHKV = initial_state_BHKV.float() if initial_state_BHKV is not None else q.new_zeros(B, H, K, V)
    outputs = []
    for n0 in range(0, N, GROUP):  # a group of chunks at a time keeps the C x C tensors in cache
        h_BHKV = chunk_group(q[:, :, n0:n0 + GROUP], k[:, :, n0:n0 + GROUP], v[:, :, n0:n0 + GROUP],
                             g[:, :, n0:n0 + GROUP], beta[:, :, n0:n0 + GROUP], h_BHKV, outputs)
    o_BHTV = torch.cat(outputs, 2)[:, :, :T]
    return o_BHTV.transpose(1, 2).to(v_BTHV.dtype), h_BHKV


def chunk_group(q, k, v, g, beta, h_BHKV: torch.Tensor, outputs: list[torch.Tensor]) -> torch.Tensor:
    """Consecutive chunks (B, H, n, C, .): batched intra-chunk terms, then the state walk.

    Appends each chunk's output (B, H, C, V) to `outputs`; returns the state after the last chunk.
    """
    C = k.shape[-2]
    G_BHNC = g.cumsum(-1)
    incl_CC = torch.ones(C, C, dtype=torch.bool, device=k.device).tril()
    # exp only where s <= t (the difference is <= 0 there), so the masked side cannot overflow
    decay_BHNCC = (G_BHNC[..., :, None] - G_BHNC[..., None, :]).masked_fill(~incl_CC, float("-inf")).exp()
    W_BHNCK, Ut_BHNCV = chunk_intra(k, v, G_BHNC, beta, decay_BHNCC)
    P_BHNCC = decay_BHNCC * (q @ k.transpose(-1, -2))
    Gamma_BHNC = G_BHNC.exp()
    qg_BHNCK = q * Gamma_BHNC[..., None]
    kd_BHNCK = k * (G_BHNC[..., -1:] - G_BHNC).exp()[..., None]
    for n in range(k.shape[2]):
        U_BHCV = Ut_BHNCV[:, :, n] - W_BHNCK[:, :, n] @ h_BHKV
        outputs.append(qg_BHNCK[:, :, n] @ h_BHKV + P_BHNCC[:, :, n] @ U_BHCV)
        h_BHKV = Gamma_BHNC[:, :, n, -1, None, None] * h_BHKV + kd_BHNCK[:, :, n].transpose(-1, -2) @ U_BHCV
    return h_BHKV
