"""The attention-logit probe QK-Clip and logging read, and the per-head rescale QK-Clip applies.

The probe wants, per query head, the largest |q.k| / sqrt(d) over causally
visible pairs. Materialising the scores beside SDPA would cost B*H*T*T
floats (17 GB at B8 H32 T4096); here queries are taken in row chunks so at
most `PROBE_CHUNK_ELEMENTS` scores exist at once, keys only up to the chunk's
last query, and GQA groups share their key head through a view instead of
`repeat_interleave`. On CUDA a Triton kernel does the same tile by tile (scores
never reach memory); both are the op `hymo::causal_max_logits`.

The rescale multiplies a projection's rows head by head with one broadcast
multiply (no per-head Python loop, no device-to-host reads). Under FSDP2 the
weight is a DTensor sharded along rows; the row factors are cut the same
way and applied to the local shard.
"""
from __future__ import annotations

import torch

from hymo_core.kernels.backend import HAVE_TRITON, resolve_backend

PROBE_CHUNK_ELEMENTS = 1 << 26  # 256 MB of fp32 scores per chunk at most
NEVER_SKIP = -1.0  # `skip_below` that makes every query block exact (|q.k| >= 0 > -1)
BOUND_SLACK = 1.0 + 1e-3  # the Cauchy-Schwarz bound, widened past fp32 rounding of the norms and the dot

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from hymo_core.kernels.tuning import autotuned, launch

    PROBE_CONFIGS = [triton.Config({"BM": 64, "BN": bn}, num_warps=w) for bn, w in ((32, 4), (64, 4), (64, 8))]

    @autotuned(PROBE_CONFIGS, key=["D"])
    @triton.jit
    def _causal_max_logit_kernel(q_ptr, k_ptr, key_norm_ptr, out_ptr, skip_below, T, H, G, D, NQ, sq_b, sq_h, sq_t,
                                 sk_b, sk_h, sk_t, BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
        """max |q.k| over one block of BM queries and every key at or before each query (one number per program).

        Scores live one (BM, BN) tile at a time, never in memory. The dot multiplies the inputs as
        they are (bf16 MMA with fp32 accumulation on bf16 activations, IEEE fp32 on fp32): the probe
        reads the logits attention itself computes from those operands.

        Cauchy-Schwarz first: |q.k| <= max |q| over the block x max |k| of the (batch, key head)
        (`key_norm_ptr`). When that bound is at most `skip_below` the block runs no key tile and
        stores the bound instead (QK-Clip's threshold: no logit of the block can be clipped).
        """
        i_m, i_bh = tl.program_id(0), tl.program_id(1)
        i_b, i_h = i_bh // H, i_bh % H
        rows = i_m * BM + tl.arange(0, BM)
        d = tl.arange(0, BD)
        q_base = q_ptr + i_b.to(tl.int64) * sq_b + i_h.to(tl.int64) * sq_h
        k_base = k_ptr + i_b.to(tl.int64) * sk_b + (i_h // G).to(tl.int64) * sk_h
        q = tl.load(q_base + rows[:, None].to(tl.int64) * sq_t + d[None, :],
                    mask=(rows < T)[:, None] & (d < D)[None, :], other=0.0)
        q32 = q.to(tl.float32)
        key_norm = tl.load(key_norm_ptr + i_b * (H // G) + i_h // G)
        bound = tl.sqrt(tl.max(tl.sum(q32 * q32, 1), 0)) * key_norm * 1.001  # BOUND_SLACK
        skipped = bound <= skip_below
        peak = tl.zeros([BM], dtype=tl.float32)
        for n0 in range(0, tl.where(skipped, 0, tl.minimum(T, i_m * BM + BM)), BN):
            cols = n0 + tl.arange(0, BN)
            k = tl.load(k_base + cols[:, None].to(tl.int64) * sk_t + d[None, :],
                        mask=(cols < T)[:, None] & (d < D)[None, :], other=0.0)
            if q_ptr.dtype.element_ty == tl.float32:
                scores = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                scores = tl.dot(q, tl.trans(k))
            visible = (cols[None, :] <= rows[:, None]) & (cols < T)[None, :]
            peak = tl.maximum(peak, tl.max(tl.where(visible, tl.abs(scores), 0.0), 1))
        tl.store(out_ptr + i_bh.to(tl.int64) * NQ + i_m, tl.where(skipped, bound, tl.max(peak, 0)))


def causal_max_logits_triton(q_BHTD: torch.Tensor, k_BKTD: torch.Tensor, skip_below: float = NEVER_SKIP) -> torch.Tensor:
    """(H,) max |q.k| (not yet divided by sqrt d): one partial maximum per (query block, batch, head).

    A query block whose Cauchy-Schwarz bound is at most `skip_below` stores the bound (see the kernel)."""
    B, H, T, D = q_BHTD.shape
    q_BHTD, k_BKTD = (x if x.stride(-1) == 1 else x.contiguous() for x in (q_BHTD, k_BKTD))
    NQ = triton.cdiv(T, 64)  # every config uses BM = 64
    key_norm_BK = torch.linalg.vector_norm(k_BKTD, dim=-1, dtype=torch.float32).amax(dim=-1)
    partial_BHN = torch.empty(B, H, NQ, device=q_BHTD.device, dtype=torch.float32)
    launch(_causal_max_logit_kernel, lambda meta: (NQ, B * H), q_BHTD, k_BKTD, key_norm_BK, partial_BHN, float(skip_below), T, H,
           H // k_BKTD.shape[1], D, NQ, *q_BHTD.stride()[:3], *k_BKTD.stride()[:3],
           BD=max(16, triton.next_power_of_2(D)))
    return partial_BHN.amax(dim=(0, 2))


def causal_max_logits_reference(q_BHTD: torch.Tensor, k_BKTD: torch.Tensor,
                                chunk_elements: int = PROBE_CHUNK_ELEMENTS) -> torch.Tensor:
    """(H,) max |q.k| in PyTorch, queries in row chunks so at most `chunk_elements` scores exist at once."""
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
    return peak_KG.reshape(H)


@torch.library.custom_op("hymo::causal_max_logits", mutates_args=())
def causal_max_logits_op(q: torch.Tensor, k: torch.Tensor, chunk_elements: int, backend: str,
                         skip_below: float = NEVER_SKIP) -> torch.Tensor:
    """(H,) fp32 max |q.k|. A read-only probe: no autograd rule (it runs under no_grad).

    Where a head's maximum is above `skip_below` it is exact; elsewhere the value lies between the exact
    maximum and `skip_below` (Triton skips the blocks a norm bound clears; the reference is always exact)."""
    if backend == "triton":
        return causal_max_logits_triton(q, k) if skip_below == NEVER_SKIP else causal_max_logits_triton(q, k, skip_below)
    return causal_max_logits_reference(q, k, chunk_elements)


@causal_max_logits_op.register_fake
def _(q, k, chunk_elements, backend, skip_below=NEVER_SKIP):
    return q.new_empty(q.shape[1], dtype=torch.float32)


@torch.no_grad()
def causal_max_logits(q_BHTD: torch.Tensor, k_BKTD: torch.Tensor, sqrt_d: float,
                      chunk_elements: int = PROBE_CHUNK_ELEMENTS, backend: str | None = None,
                      skip_below: float | None = None) -> torch.Tensor:
    """(H,) fp32: max over batch and visible pairs of |q.k| / sqrt_d; key head k serves query heads k*G .. k*G+G-1.

    `skip_below` (a logit, e.g. QK-Clip's threshold): heads whose maximum is at most it may return any value in
    [their maximum, skip_below] instead, so the kernel skips the query blocks a norm bound clears. None: exact."""
    skip = NEVER_SKIP if skip_below is None else skip_below * sqrt_d
    return causal_max_logits_op(q_BHTD, k_BKTD, chunk_elements, resolve_backend(q_BHTD, backend), skip) / sqrt_d


@torch.no_grad()
def scale_rows_(weight_RD: torch.Tensor, factor_R: torch.Tensor) -> None:
    """weight[r] *= factor_R[r] in one broadcast multiply (a DTensor shard scales only its own rows). The fp32
    factor multiplies in place without a cast of its own (the in-place multiply converts as it goes)."""
    factor_R1 = factor_R.to(torch.float32).reshape(-1, 1)
    if hasattr(weight_RD, "to_local"):
        from torch.distributed.tensor import distribute_tensor

        local = distribute_tensor(factor_R1.to(weight_RD.device), weight_RD.device_mesh, weight_RD.placements, src_data_rank=None)
        weight_RD.to_local().mul_(local.to_local().to(weight_RD.dtype))
        return
    weight_RD.mul_(factor_R1.to(weight_RD.device))


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
