"""The attention-logit probe QK-Clip and logging read, and the per-head rescale QK-Clip applies.

The probe wants, per query head, the largest |q.k| / sqrt(d) over causally
visible pairs. Materialising the scores beside SDPA would cost B*H*T*T
floats (17 GB at B8 H32 T4096); here queries are taken in row chunks so at
most `PROBE_CHUNK_ELEMENTS` scores exist at once, keys only up to the chunk's
last query, and GQA groups share their key head through a view instead of
`repeat_interleave`.

The rescale multiplies a projection's rows head by head with one broadcast
multiply (no per-head Python loop, no device-to-host reads). Under FSDP2 the
weight is a DTensor sharded along rows; the row factors are cut the same
way and applied to the local shard.
"""
from __future__ import annotations

import torch

PROBE_CHUNK_ELEMENTS = 1 << 26  # 256 MB of fp32 scores per chunk at most


@torch.no_grad()
def causal_max_logits(q_BHTD: torch.Tensor, k_BKTD: torch.Tensor, sqrt_d: float,
                      chunk_elements: int = PROBE_CHUNK_ELEMENTS) -> torch.Tensor:
    """(H,) fp32: max over batch and visible pairs of |q.k| / sqrt_d; key head k serves query heads k*G .. k*G+G-1."""
    B, H, T, D = q_BHTD.shape
    K = k_BKTD.shape[1]
    G = H // K
    q_BKGTD = q_BHTD.float().view(B, K, G, T, D)
    k_BK1DT = k_BKTD.float().transpose(-2, -1).unsqueeze(2)
    rows = max(1, chunk_elements // max(1, B * H * T))
    positions_T = torch.arange(T, device=q_BHTD.device)
    peak_KG = torch.zeros(K, G, device=q_BHTD.device)
    for start in range(0, T, rows):
        end = min(T, start + rows)
        scores_BKGCS = (q_BKGTD[:, :, :, start:end] @ k_BK1DT[..., :end]).abs_()
        hidden_CS = positions_T[None, :end] > positions_T[start:end, None]  # key after query
        scores_BKGCS.masked_fill_(hidden_CS, 0.0)
        peak_KG = torch.maximum(peak_KG, scores_BKGCS.amax(dim=(0, 3, 4)))
    return peak_KG.reshape(H) / sqrt_d


@torch.no_grad()
def scale_rows_(weight_RD: torch.Tensor, factor_R: torch.Tensor) -> None:
    """weight[r] *= factor_R[r] in one broadcast multiply (a DTensor shard scales only its own rows)."""
    factor_R1 = factor_R.to(torch.float32).reshape(-1, 1)
    if hasattr(weight_RD, "to_local"):
        from torch.distributed.tensor import distribute_tensor

        local = distribute_tensor(factor_R1.to(weight_RD.device), weight_RD.device_mesh, weight_RD.placements, src_data_rank=None)
        weight_RD.to_local().mul_(local.to_local().to(weight_RD.dtype))
        return
    weight_RD.mul_(factor_R1.to(weight_RD.device, weight_RD.dtype))


@torch.no_grad()
def scale_head_rows_(weight_RD: torch.Tensor, scale_H: torch.Tensor) -> None:
    """weight[h*d:(h+1)*d] *= scale_H[h] for every head h at once."""
    scale_rows_(weight_RD, scale_H.repeat_interleave(weight_RD.shape[0] // scale_H.numel()))


@torch.no_grad()
def qk_clip_heads_(q_weight: torch.Tensor, k_weight: torch.Tensor, scale_H: torch.Tensor, n_kv_heads: int) -> None:
    """Shrink each query head's logits by scale_H (<= 1; 1 leaves it alone).

    One key head per query head: both rows scale by sqrt(scale). Under GQA a key
    head is shared, so only the query rows scale (by scale): the group's other
    heads keep their logits.
    """
    if scale_H.numel() == n_kv_heads:
        root_H = scale_H.sqrt()
        scale_head_rows_(q_weight, root_H)
        scale_head_rows_(k_weight, root_H)
    else:
        scale_head_rows_(q_weight, scale_H)
