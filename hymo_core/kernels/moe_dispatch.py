"""MoE routing and dispatch in four fused ops around the grouped expert GEMMs (issue 54).

The DeepSeekMoE layer used to route and move its tokens with about 60 small aten kernels a layer (casts,
softmax, top-k, gather, argsort, searchsorted, cumsums, zero-fills, index_put, index_copy, the gate
multiply, the k-slot sum, and their backwards). Megablocks / torchtitan / DeepSeek-V3 do it in a few:

* `hymo::moe_route`: the router's matmul (x @ gate^T, E columns: a tl.dot per row block), scores (softmax or
  sigmoid, fp32), top-k of the biased scores, the chosen unbiased scores (normalised for sigmoid top-k > 1,
  times route_scale); backward: `hymo::moe_route_backward` recomputes the scores from the saved logits and
  writes the logits' gradient and x's (dlogits @ gate); the gate weight's gradient is one small matmul;
* `hymo::moe_plan`: each expert's count (a histogram), its group of rows in the buffer the expert GEMMs
  read (packed and padded to `align` rows, or a fixed `group_rows` per expert), every assignment's row
  (its stable rank among its expert's assignments, in token order, so the weight gradients' sums never
  depend on the device's schedule; -1 when a capacity drops it) and every row's assignment (-1 = padding).
  One program: the counts stay in registers between the histogram and the placement passes;
* `hymo::moe_permute`: buffer[p] = x[source[p] // k] cast to the experts' dtype, padding rows 0 (no
  separate zero-fill); backward: each token's k rows summed in fp32;
* `hymo::moe_combine`: out[n] = base[n] + sum_j w[n, j] * y[position[n, j]] in fp32 (base: the shared
  expert's output, so its add is this kernel too); backward: one kernel writes dy (w * dout, padding 0)
  and each assignment's dw (dout . y, 0 where dropped), each by exactly one program: no atomics.

Each op is a torch.library custom op with a fake and an autograd rule; its CPU / meta body is the PyTorch
reference below (the one the Triton kernels are tested against, under TRITON_INTERPRET=1 on the CPU).
No op reads anything back to the host.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from hymo_core.kernels.backend import HAVE_TRITON, reference_vjp, resolve_backend

# ------------------------------------------------------------------ PyTorch references (the CPU bodies)


def route_reference(x_ND: torch.Tensor, gate_ED: torch.Tensor, bias_E: torch.Tensor, k: int, sigmoid: bool,
                    normalize: bool, scale: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(combine weights (N, k) fp32, chosen experts (N, k) int64, router logits (N, E) in `dtype`): the logits are
    x @ gate^T in the matmuls' dtype, the experts the top-k of scores + bias, the weights unbiased scores."""
    logits_NE = F.linear(x_ND.to(dtype), gate_ED.to(dtype))
    scores_NE = route_scores(logits_NE, sigmoid)
    _, experts_NK = (scores_NE + bias_E).topk(k, dim=-1)
    return _chosen_weights(scores_NE, experts_NK, normalize, scale), experts_NK, logits_NE


def route_scores(logits_NE: torch.Tensor, sigmoid: bool) -> torch.Tensor:
    scores_NE = logits_NE.float()
    return scores_NE.sigmoid() if sigmoid else scores_NE.softmax(dim=-1)


def _chosen_weights(scores_NE, experts_NK, normalize: bool, scale: float) -> torch.Tensor:
    weights_NK = scores_NE.gather(1, experts_NK)
    if normalize:
        weights_NK = weights_NK / weights_NK.sum(dim=-1, keepdim=True)
    return weights_NK * scale if scale != 1.0 else weights_NK


def route_backward_reference(dweights_NK, dlogits_NE, gate_ED, logits_NE, experts_NK, dx_dtype: torch.dtype,
                             sigmoid: bool, normalize: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx (N, D) in `dx_dtype`, dlogits (N, E) in the logits' dtype) from the weights' and the logits' own
    gradients."""
    dlogits = torch.zeros(logits_NE.shape, dtype=torch.float32, device=logits_NE.device)
    if dweights_NK is not None:
        (dlogits,) = reference_vjp(
            lambda logits: (_chosen_weights(route_scores(logits, sigmoid), experts_NK, normalize, scale),),
            [logits_NE.float()], [dweights_NK])
    if dlogits_NE is not None:
        dlogits = dlogits + dlogits_NE.float()
    dlogits = dlogits.to(logits_NE.dtype)
    return (dlogits @ gate_ED.to(logits_NE.dtype)).to(dx_dtype), dlogits


def plan_rows(n_assignments: int, n_experts: int, capacity: int, align: int, group_rows: int) -> int:
    """The buffer's static row count: a fixed `group_rows` per expert, or every kept assignment plus each
    group's padding to `align` rows (at most E * (align - 1)), rounded up to `align`."""
    if group_rows:
        return n_experts * group_rows
    kept_bound = min(n_assignments, n_experts * capacity)
    return -(-(kept_bound + n_experts * (align - 1)) // align) * align


def plan_reference(experts_A: torch.Tensor, n_experts: int, capacity: int, rows: int, align: int, group_rows: int,
                   counts_into: torch.Tensor | None = None, dropped_into: torch.Tensor | None = None):
    """(position_A int32, source_P int32, ends_E int32, counts_E int64); see the module docstring. Adds the counts to
    `counts_into` and the dropped assignments to `dropped_into` where given (the layer's balancing counters)."""
    device = experts_A.device
    A = experts_A.numel()
    order_A = torch.argsort(experts_A, stable=True)
    sorted_A = experts_A[order_A]
    bounds_E1 = torch.searchsorted(sorted_A, torch.arange(n_experts + 1, device=device))
    counts_E = bounds_E1.diff()
    kept_E = counts_E.clamp(max=capacity)
    if group_rows:
        starts_E = torch.arange(n_experts, device=device) * group_rows
        ends_E = starts_E + group_rows
    else:
        padded_E = (kept_E + align - 1) // align * align
        ends_E = torch.cumsum(padded_E, 0)
        starts_E = ends_E - padded_E
        ends_E = torch.cat((ends_E[:-1], ends_E.new_full((1,), rows)))
    rank_sorted = torch.arange(A, device=device) - bounds_E1[:-1][sorted_A]  # place among its expert's, token order
    rank_A = torch.empty_like(rank_sorted).index_copy_(0, order_A, rank_sorted)
    position_A = torch.where(rank_A < capacity, starts_E[experts_A] + rank_A, -1)
    source_P = torch.full((rows + 1,), -1, dtype=torch.long, device=device)
    source_P = source_P.index_copy_(0, torch.where(position_A >= 0, position_A, rows), torch.arange(A, device=device))
    if counts_into is not None:
        counts_into += counts_E
    if dropped_into is not None:
        dropped_into += (counts_E - kept_E).sum()
    return position_A.int(), source_P[:rows].int(), ends_E.int(), counts_E


def permute_reference(x_ND: torch.Tensor, source_P: torch.Tensor, k: int, dtype: torch.dtype) -> torch.Tensor:
    real_P = (source_P >= 0).unsqueeze(1)
    return torch.where(real_P, x_ND[source_P.clamp(min=0).long() // k].to(dtype), 0.0).to(dtype)


def permute_backward_reference(dbuffer_PD, position_A, k: int, dtype: torch.dtype, addends: list[torch.Tensor]) -> torch.Tensor:
    rows_AD = torch.where((position_A >= 0).unsqueeze(1), dbuffer_PD[position_A.clamp(min=0).long()].float(), 0.0)
    dx_ND = rows_AD.view(-1, k, rows_AD.shape[-1]).sum(dim=1)
    for addend in addends:
        dx_ND = dx_ND + addend.float()
    return dx_ND.to(dtype)


def combine_reference(y_PD, position_A, weights_NK, base_ND, dtype: torch.dtype) -> torch.Tensor:
    N, K = weights_NK.shape
    kept_A = (position_A >= 0).unsqueeze(1)
    rows_AD = torch.where(kept_A, y_PD[position_A.clamp(min=0).long()].float() * weights_NK.reshape(-1, 1).float(), 0.0)
    out_ND = rows_AD.view(N, K, -1).sum(dim=1)
    if base_ND is not None:
        out_ND = out_ND + base_ND.float()
    return out_ND.to(dtype)


def combine_backward_reference(dout_ND, y_PD, source_P, position_A, weights_NK):
    K = weights_NK.shape[1]
    real_P = source_P >= 0
    assignment_P = source_P.clamp(min=0).long()
    weights_A = weights_NK.reshape(-1).float()
    dout_PD = dout_ND[assignment_P // K].float()
    dy_PD = torch.where(real_P.unsqueeze(1), dout_PD * weights_A[assignment_P].unsqueeze(1), 0.0).to(y_PD.dtype)
    kept_A = position_A >= 0
    y_AD = y_PD[position_A.clamp(min=0).long()].float()
    dot_A = (dout_ND.float().repeat_interleave(K, dim=0) * y_AD).sum(dim=1)
    return dy_PD, torch.where(kept_A, dot_A, 0.0).view_as(weights_NK)


# ------------------------------------------------------------------ Triton kernels

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from hymo_core.kernels.backend import wide_offset

    @triton.jit
    def _route_scores(logits, mask, SIGMOID: tl.constexpr):
        """Softmax or sigmoid of (BLOCK_N, BLOCK_E) fp32 logits; 0 outside `mask`."""
        if SIGMOID:
            scores = tl.where(mask, tl.sigmoid(logits), 0.0)
        else:
            logits = tl.where(mask, logits, float("-inf"))
            top = tl.max(logits, axis=1)
            top = tl.where(top > float("-inf"), top, 0.0)
            p = tl.where(mask, tl.exp(logits - top[:, None]), 0.0)
            total = tl.sum(p, axis=1)
            scores = p / tl.where(total > 0, total, 1.0)[:, None]
        return scores

    @triton.jit
    def _route_forward_kernel(x_ptr, gate_ptr, bias_ptr, weights_ptr, experts_ptr, logits_ptr, N, E, D, scale,
                              K: tl.constexpr, SIGMOID: tl.constexpr, NORMALIZE: tl.constexpr, IEEE: tl.constexpr,
                              BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
                              BLOCK_D: tl.constexpr):
        """Per row block: logits = x @ gate^T (in the logits' dtype, fp32 accumulation), scores, then k rounds of
        (max of the biased scores, the lowest such expert, mask it out)."""
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        cols = tl.arange(0, BLOCK_E)
        slots = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_N, BLOCK_E), dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):
            dd = d0 + tl.arange(0, BLOCK_D)
            x = tl.load(x_ptr + rows[:, None].to(tl.int64) * D + dd[None, :], mask=(rows[:, None] < N) & (dd[None, :] < D),
                        other=0.0).to(logits_ptr.dtype.element_ty)
            w = tl.load(gate_ptr + cols[None, :] * D + dd[:, None], mask=(cols[None, :] < E) & (dd[:, None] < D),
                        other=0.0).to(logits_ptr.dtype.element_ty)
            if IEEE:
                acc += tl.dot(x, w, input_precision="ieee")
            else:
                acc += tl.dot(x, w)
        mask = (rows[:, None] < N) & (cols[None, :] < E)
        logits = acc.to(logits_ptr.dtype.element_ty)
        tl.store(logits_ptr + rows[:, None].to(tl.int64) * E + cols[None, :], logits, mask=mask)
        scores = _route_scores(logits.to(tl.float32), mask, SIGMOID)
        bias = tl.load(bias_ptr + cols, mask=cols < E, other=0.0).to(tl.float32)
        biased = tl.where(cols[None, :] < E, scores + bias[None, :], float("-inf"))
        weights = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        experts = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.int64)
        for j in tl.static_range(K):
            best = tl.max(biased, axis=1)
            chosen = tl.min(tl.where(biased == best[:, None], cols[None, :], BLOCK_E), axis=1)
            hit = cols[None, :] == chosen[:, None]
            weight = tl.sum(tl.where(hit, scores, 0.0), axis=1)
            weights = tl.where(slots[None, :] == j, weight[:, None], weights)
            experts = tl.where(slots[None, :] == j, chosen[:, None].to(tl.int64), experts)
            biased = tl.where(hit, float("-inf"), biased)
        if NORMALIZE:
            weights = weights / tl.sum(weights, axis=1)[:, None]
        out = rows[:, None].to(tl.int64) * K + slots[None, :]
        slot_mask = (rows[:, None] < N) & (slots[None, :] < K)
        tl.store(weights_ptr + out, weights * scale, mask=slot_mask)
        tl.store(experts_ptr + out, experts, mask=slot_mask)

    @triton.jit
    def _route_backward_kernel(dweights_ptr, dextra_ptr, logits_ptr, experts_ptr, gate_ptr, dlogits_ptr, dx_ptr, N, E,
                               D, scale, K: tl.constexpr, SIGMOID: tl.constexpr, NORMALIZE: tl.constexpr,
                               HAS_DWEIGHTS: tl.constexpr, HAS_EXTRA: tl.constexpr, IEEE: tl.constexpr,
                               BLOCK_N: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
                               BLOCK_D: tl.constexpr):
        """dscores at the chosen experts (through the normalisation), the softmax / sigmoid backward, the logits' own
        gradient added; then dx = dlogits @ gate, so the router's input gradient is no separate matmul."""
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        cols = tl.arange(0, BLOCK_E)
        slots = tl.arange(0, BLOCK_K)
        mask = (rows[:, None] < N) & (cols[None, :] < E)
        at_e = rows[:, None].to(tl.int64) * E + cols[None, :]
        dlogits = tl.zeros((BLOCK_N, BLOCK_E), dtype=tl.float32)
        if HAS_DWEIGHTS:
            scores = _route_scores(tl.load(logits_ptr + at_e, mask=mask, other=0.0).to(tl.float32), mask, SIGMOID)
            slot_mask = (rows[:, None] < N) & (slots[None, :] < K)
            at = rows[:, None].to(tl.int64) * K + slots[None, :]
            experts = tl.load(experts_ptr + at, mask=slot_mask, other=-1)
            du = tl.load(dweights_ptr + at, mask=slot_mask, other=0.0).to(tl.float32) * scale
            raw = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
            for j in tl.static_range(K):
                expert_j = tl.sum(tl.where(slots[None, :] == j, experts, 0), axis=1)
                raw_j = tl.sum(tl.where(cols[None, :] == expert_j[:, None], scores, 0.0), axis=1)
                raw = tl.where(slots[None, :] == j, raw_j[:, None], raw)
            if NORMALIZE:
                total = tl.sum(raw, axis=1)
                total = tl.where(total > 0, total, 1.0)
                dchosen = (du - tl.sum(du * raw, axis=1)[:, None] / total[:, None]) / total[:, None]
            else:
                dchosen = du
            dscores = tl.zeros((BLOCK_N, BLOCK_E), dtype=tl.float32)
            for j in tl.static_range(K):
                expert_j = tl.sum(tl.where(slots[None, :] == j, experts, 0), axis=1)
                d_j = tl.sum(tl.where(slots[None, :] == j, dchosen, 0.0), axis=1)
                dscores += tl.where(cols[None, :] == expert_j[:, None], d_j[:, None], 0.0)
            if SIGMOID:
                dlogits = dscores * scores * (1.0 - scores)
            else:
                dlogits = scores * (dscores - tl.sum(dscores * scores, axis=1)[:, None])
        if HAS_EXTRA:
            dlogits += tl.load(dextra_ptr + at_e, mask=mask, other=0.0).to(tl.float32)
        dl = tl.where(mask, dlogits, 0.0).to(dlogits_ptr.dtype.element_ty)
        tl.store(dlogits_ptr + at_e, dl, mask=mask)
        for d0 in range(0, D, BLOCK_D):
            dd = d0 + tl.arange(0, BLOCK_D)
            w = tl.load(gate_ptr + cols[:, None] * D + dd[None, :], mask=(cols[:, None] < E) & (dd[None, :] < D),
                        other=0.0).to(dlogits_ptr.dtype.element_ty)
            if IEEE:
                dx = tl.dot(dl, w, input_precision="ieee")
            else:
                dx = tl.dot(dl, w)
            tl.store(dx_ptr + rows[:, None].to(tl.int64) * D + dd[None, :], dx.to(dx_ptr.dtype.element_ty),
                     mask=(rows[:, None] < N) & (dd[None, :] < D))

    @triton.jit
    def _plan_kernel(experts_ptr, position_ptr, source_ptr, ends_ptr, counts_ptr, counts_into_ptr, dropped_into_ptr, A,
                     E, capacity, rows, align, group_rows, COUNT: tl.constexpr, DROPPED: tl.constexpr,
                     BLOCK_A: tl.constexpr, BLOCK_E: tl.constexpr):
        """One program: histogram (added to the layer's counters), group bounds, then each assignment's stable rank
        and row, then the padding rows."""
        cols = tl.arange(0, BLOCK_E)
        lanes = tl.arange(0, BLOCK_A)
        counts = tl.zeros((BLOCK_E,), dtype=tl.int32)
        for start in range(0, A, BLOCK_A):
            a = start + lanes
            expert = tl.load(experts_ptr + a, mask=a < A, other=BLOCK_E).to(tl.int32)
            counts += tl.sum((expert[:, None] == cols[None, :]).to(tl.int32), axis=0)
        kept = tl.minimum(counts, capacity)
        if group_rows > 0:
            starts = cols * group_rows
            ends = starts + group_rows
        else:
            padded = (kept + align - 1) // align * align
            ends = tl.cumsum(padded, axis=0)
            starts = ends - padded
            ends = tl.where(cols == E - 1, rows, ends)
        tl.store(ends_ptr + cols, ends, mask=cols < E)
        tl.store(counts_ptr + cols, counts.to(tl.int64), mask=cols < E)
        if COUNT:
            total = tl.load(counts_into_ptr + cols, mask=cols < E, other=0.0)
            tl.store(counts_into_ptr + cols, total + counts.to(total.dtype), mask=cols < E)
        if DROPPED:
            dropped = tl.load(dropped_into_ptr)
            tl.store(dropped_into_ptr, dropped + tl.sum(tl.where(cols < E, counts - kept, 0), axis=0).to(dropped.dtype))
        before = tl.zeros((BLOCK_E,), dtype=tl.int32)  # assignments of each expert seen so far
        for start in range(0, A, BLOCK_A):
            a = start + lanes
            expert = tl.load(experts_ptr + a, mask=a < A, other=BLOCK_E).to(tl.int32)
            hit = expert[:, None] == cols[None, :]
            onehot = hit.to(tl.int32)
            rank = tl.sum(tl.where(hit, tl.cumsum(onehot, axis=0) - 1 + before[None, :], 0), axis=1)
            start_row = tl.sum(tl.where(hit, starts[None, :], 0), axis=1)
            kept_here = (rank < capacity) & (a < A)
            position = tl.where(kept_here, start_row + rank, -1)
            tl.store(position_ptr + a, position, mask=a < A)
            tl.store(source_ptr + position, a, mask=kept_here)
            before += tl.sum(onehot, axis=0)
        for start in range(0, rows, BLOCK_A):  # rows no assignment took: -1 (other addresses than the loop above's)
            p = start + lanes
            local = p[:, None] - starts[None, :]
            real = (local >= 0) & (p[:, None] < ends[None, :]) & (local < kept[None, :]) & (cols[None, :] < E)
            is_real = tl.sum(real.to(tl.int32), axis=1) > 0
            tl.store(source_ptr + p, tl.full((BLOCK_A,), -1, tl.int32), mask=(p < rows) & ~is_real)

    @triton.jit
    def _permute_kernel(x_ptr, source_ptr, buffer_ptr, P, D, K, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        source = tl.load(source_ptr + rows, mask=rows < P, other=-1)
        token = tl.where(source >= 0, source // K, 0).to(tl.int64)
        real = source >= 0
        for d0 in range(0, D, BLOCK_D):
            cols = d0 + tl.arange(0, BLOCK_D)
            x = tl.load(x_ptr + token[:, None] * D + cols[None, :], mask=real[:, None] & (cols[None, :] < D), other=0.0)
            tl.store(buffer_ptr + rows[:, None].to(tl.int64) * D + cols[None, :], x.to(buffer_ptr.dtype.element_ty),
                     mask=(rows[:, None] < P) & (cols[None, :] < D))

    @triton.jit
    def _permute_backward_kernel(dbuffer_ptr, position_ptr, first_ptr, second_ptr, dx_ptr, N, D, K: tl.constexpr,
                                 ADDENDS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
        """dx = the token's k buffer rows' gradients + up to two gradients of other readers of x (no autograd add)."""
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        for d0 in range(0, D, BLOCK_D):
            cols = d0 + tl.arange(0, BLOCK_D)
            mask = (rows[:, None] < N) & (cols[None, :] < D)
            at = rows[:, None].to(tl.int64) * D + cols[None, :]
            acc = tl.zeros((BLOCK_R, BLOCK_D), dtype=tl.float32)
            if ADDENDS >= 1:
                acc += tl.load(first_ptr + at, mask=mask, other=0.0).to(tl.float32)
            if ADDENDS >= 2:
                acc += tl.load(second_ptr + at, mask=mask, other=0.0).to(tl.float32)
            for j in tl.static_range(K):
                position = tl.load(position_ptr + rows * K + j, mask=rows < N, other=-1)
                acc += tl.load(dbuffer_ptr + tl.where(position >= 0, position, 0).to(tl.int64)[:, None] * D + cols[None, :],
                               mask=(position >= 0)[:, None] & (cols[None, :] < D), other=0.0).to(tl.float32)
            tl.store(dx_ptr + at, acc.to(dx_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _combine_kernel(y_ptr, position_ptr, weights_ptr, base_ptr, out_ptr, N, D, K: tl.constexpr,
                        HAS_BASE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        for d0 in range(0, D, BLOCK_D):
            cols = d0 + tl.arange(0, BLOCK_D)
            mask = (rows[:, None] < N) & (cols[None, :] < D)
            at = rows[:, None].to(tl.int64) * D + cols[None, :]
            if HAS_BASE:
                acc = tl.load(base_ptr + at, mask=mask, other=0.0).to(tl.float32)
            else:
                acc = tl.zeros((BLOCK_R, BLOCK_D), dtype=tl.float32)
            for j in tl.static_range(K):
                position = tl.load(position_ptr + rows * K + j, mask=rows < N, other=-1)
                weight = tl.load(weights_ptr + rows * K + j, mask=(rows < N) & (position >= 0), other=0.0).to(tl.float32)
                y = tl.load(y_ptr + tl.where(position >= 0, position, 0).to(tl.int64)[:, None] * D + cols[None, :],
                            mask=(position >= 0)[:, None] & (cols[None, :] < D), other=0.0).to(tl.float32)
                acc += weight[:, None] * y
            tl.store(out_ptr + at, acc.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _combine_backward_kernel(dout_ptr, y_ptr, source_ptr, position_ptr, weights_ptr, dy_ptr, dweights_ptr, P, A,
                                 D, K, row_programs, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
        """Programs below `row_programs`: buffer rows (dy, and dw of the row's assignment); the rest: dw = 0 of the
        assignments a capacity dropped (no row holds them), so dw needs no zero-fill."""
        pid = tl.program_id(0)
        if pid < row_programs:
            rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
            source = tl.load(source_ptr + rows, mask=rows < P, other=-1)
            real = source >= 0
            assignment = tl.where(real, source, 0)
            token = (assignment // K).to(tl.int64)
            weight = tl.load(weights_ptr + assignment, mask=real, other=0.0).to(tl.float32)
            dot = tl.zeros((BLOCK_R,), dtype=tl.float32)
            for d0 in range(0, D, BLOCK_D):
                cols = d0 + tl.arange(0, BLOCK_D)
                inside = real[:, None] & (cols[None, :] < D)
                at = rows[:, None].to(tl.int64) * D + cols[None, :]
                dout = tl.load(dout_ptr + token[:, None] * D + cols[None, :], mask=inside, other=0.0).to(tl.float32)
                y = tl.load(y_ptr + at, mask=inside, other=0.0).to(tl.float32)
                dot += tl.sum(dout * y, axis=1)
                tl.store(dy_ptr + at, (weight[:, None] * dout).to(dy_ptr.dtype.element_ty),
                         mask=(rows[:, None] < P) & (cols[None, :] < D))
            tl.store(dweights_ptr + assignment, dot, mask=real)
        else:
            a = wide_offset(pid - row_programs, BLOCK_R) + tl.arange(0, BLOCK_R)
            position = tl.load(position_ptr + a, mask=a < A, other=0)
            tl.store(dweights_ptr + a, tl.zeros((BLOCK_R,), dtype=tl.float32), mask=(a < A) & (position < 0))


ROUTE_ROWS = 32  # router rows per program
ROUTE_D = 64  # the router matmul's step along d_model
ROWS = 8  # token / buffer rows per program of the row kernels
BLOCK_D = 256  # columns per step of their inner loop


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def plan_block(n_experts: int) -> int:
    """Assignments per step of the plan kernel: a (BLOCK_A, BLOCK_E) one-hot of at most 8 K elements (16 K filled
    all 255 registers of its 256 threads at E = 16 on sm_90)."""
    return max(16, min(1024, 8192 // _next_pow2(n_experts)))


def _route_blocks(E: int, k: int) -> dict:
    """The route kernels' tile: 32 rows, every expert (at least 16 columns, tl.dot's smallest), 64 of d_model a step."""
    return dict(BLOCK_N=ROUTE_ROWS, BLOCK_E=max(16, _next_pow2(E)), BLOCK_K=_next_pow2(k), BLOCK_D=ROUTE_D)


def route_triton(x_ND, gate_ED, bias_E, k, sigmoid, normalize, scale, dtype):
    x_ND, gate_ED = x_ND.contiguous(), gate_ED.contiguous()
    (N, D), E = x_ND.shape, gate_ED.shape[0]
    weights_NK = x_ND.new_empty(N, k, dtype=torch.float32)
    experts_NK = x_ND.new_empty(N, k, dtype=torch.long)
    logits_NE = x_ND.new_empty(N, E, dtype=dtype)
    _route_forward_kernel[(triton.cdiv(N, ROUTE_ROWS),)](
        x_ND, gate_ED, bias_E.contiguous(), weights_NK, experts_NK, logits_NE, N, E, D, scale, K=k, SIGMOID=sigmoid,
        NORMALIZE=normalize, IEEE=dtype == torch.float32, **_route_blocks(E, k))
    return weights_NK, experts_NK, logits_NE


def route_backward_triton(dweights_NK, dlogits_NE, gate_ED, logits_NE, experts_NK, dx_dtype, sigmoid, normalize, scale):
    (N, E), (D, k) = logits_NE.shape, (gate_ED.shape[1], experts_NK.shape[1])
    dlogits = torch.empty_like(logits_NE, memory_format=torch.contiguous_format)
    dx_ND = logits_NE.new_empty(N, D, dtype=dx_dtype)
    _route_backward_kernel[(triton.cdiv(N, ROUTE_ROWS),)](
        dlogits if dweights_NK is None else dweights_NK.contiguous(), dlogits if dlogits_NE is None else dlogits_NE.contiguous(),
        logits_NE.contiguous(), experts_NK.contiguous(), gate_ED.contiguous(), dlogits, dx_ND, N, E, D, scale, K=k,
        SIGMOID=sigmoid, NORMALIZE=normalize, HAS_DWEIGHTS=dweights_NK is not None, HAS_EXTRA=dlogits_NE is not None,
        IEEE=logits_NE.dtype == torch.float32, **_route_blocks(E, k))
    return dx_ND, dlogits


def plan_triton(experts_A, n_experts, capacity, rows, align, group_rows, counts_into=None, dropped_into=None):
    experts_A = experts_A.contiguous()
    A = experts_A.numel()
    position_A = experts_A.new_empty(A, dtype=torch.int32)
    source_P = experts_A.new_empty(rows, dtype=torch.int32)
    ends_E = experts_A.new_empty(n_experts, dtype=torch.int32)
    counts_E = experts_A.new_empty(n_experts, dtype=torch.long)
    _plan_kernel[(1,)](experts_A, position_A, source_P, ends_E, counts_E,
                       counts_E if counts_into is None else counts_into, counts_E if dropped_into is None else dropped_into,
                       A, n_experts, capacity, rows, align, group_rows, COUNT=counts_into is not None,
                       DROPPED=dropped_into is not None, BLOCK_A=plan_block(n_experts), BLOCK_E=_next_pow2(n_experts),
                       num_warps=8)
    return position_A, source_P, ends_E, counts_E


def permute_triton(x_ND, source_P, k, dtype):
    x_ND = x_ND.contiguous()
    P, D = source_P.shape[0], x_ND.shape[1]
    buffer_PD = x_ND.new_empty(P, D, dtype=dtype)
    _permute_kernel[(triton.cdiv(P, ROWS),)](x_ND, source_P, buffer_PD, P, D, k, BLOCK_R=ROWS, BLOCK_D=BLOCK_D)
    return buffer_PD


def permute_backward_triton(dbuffer_PD, position_A, k, dtype, addends):
    if len(addends) > 2:
        addends = [sum(a.float() for a in addends)]
    dbuffer_PD = dbuffer_PD.contiguous()
    addends = [a.contiguous() for a in addends]
    N, D = position_A.shape[0] // k, dbuffer_PD.shape[1]
    dx_ND = dbuffer_PD.new_empty(N, D, dtype=dtype)
    first, second = (addends + [dx_ND, dx_ND])[:2]
    _permute_backward_kernel[(triton.cdiv(N, ROWS),)](dbuffer_PD, position_A, first, second, dx_ND, N, D, K=k,
                                                      ADDENDS=len(addends), BLOCK_R=ROWS, BLOCK_D=BLOCK_D)
    return dx_ND


def combine_triton(y_PD, position_A, weights_NK, base_ND, dtype):
    y_PD = y_PD.contiguous()
    N, K = weights_NK.shape
    D = y_PD.shape[1]
    out_ND = y_PD.new_empty(N, D, dtype=dtype)
    base = base_ND.contiguous() if base_ND is not None else out_ND
    _combine_kernel[(triton.cdiv(N, ROWS),)](y_PD, position_A, weights_NK.contiguous(), base, out_ND, N, D, K=K,
                                             HAS_BASE=base_ND is not None, BLOCK_R=ROWS, BLOCK_D=BLOCK_D)
    return out_ND


def combine_backward_triton(dout_ND, y_PD, source_P, position_A, weights_NK):
    dout_ND, y_PD = dout_ND.contiguous(), y_PD.contiguous()
    P, D = y_PD.shape
    A, K = position_A.shape[0], weights_NK.shape[1]
    dy_PD = torch.empty_like(y_PD)
    dweights_NK = weights_NK.new_empty(weights_NK.shape, dtype=torch.float32)
    row_programs = triton.cdiv(P, ROWS)
    _combine_backward_kernel[(row_programs + triton.cdiv(A, ROWS),)](
        dout_ND, y_PD, source_P, position_A, weights_NK.contiguous(), dy_PD, dweights_NK, P, A, D, K, row_programs,
        BLOCK_R=ROWS, BLOCK_D=BLOCK_D)
    return dy_PD, dweights_NK


# ------------------------------------------------------------------ the custom ops


@torch.library.custom_op("hymo::moe_route", mutates_args=())
def moe_route_op(x: torch.Tensor, gate: torch.Tensor, bias: torch.Tensor, k: int, sigmoid: bool, normalize: bool,
                 scale: float, dtype: torch.dtype, backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if backend == "triton":
        return route_triton(x, gate, bias, k, sigmoid, normalize, scale, dtype)
    return tuple(t.contiguous() for t in route_reference(x, gate, bias, k, sigmoid, normalize, scale, dtype))


@moe_route_op.register_fake
def _(x, gate, bias, k, sigmoid, normalize, scale, dtype, backend):
    N = x.shape[0]
    return (x.new_empty(N, k, dtype=torch.float32), x.new_empty(N, k, dtype=torch.long),
            x.new_empty(N, gate.shape[0], dtype=dtype))


@torch.library.custom_op("hymo::moe_route_backward", mutates_args=())
def moe_route_backward_op(dweights: torch.Tensor | None, dlogits: torch.Tensor | None, gate: torch.Tensor,
                          logits: torch.Tensor, experts: torch.Tensor, dx_dtype: torch.dtype, sigmoid: bool,
                          normalize: bool, scale: float, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dlogits). x itself is no input: the kernel never reads it (dx = dlogits @ gate), and an input is
    counted as read by the launch counter."""
    if backend == "triton":
        return route_backward_triton(dweights, dlogits, gate, logits, experts, dx_dtype, sigmoid, normalize, scale)
    dx, dl = route_backward_reference(dweights, dlogits, gate, logits, experts, dx_dtype, sigmoid, normalize, scale)
    return dx.contiguous(), dl.contiguous()


@moe_route_backward_op.register_fake
def _(dweights, dlogits, gate, logits, experts, dx_dtype, sigmoid, normalize, scale, backend):
    return (logits.new_empty(logits.shape[0], gate.shape[1], dtype=dx_dtype),
            torch.empty_like(logits, memory_format=torch.contiguous_format))


def _setup_route(ctx, inputs, output):
    x, gate, bias, k, sigmoid, normalize, scale, dtype, backend = inputs
    ctx.save_for_backward(x, gate, output[2], output[1])
    ctx.args = (sigmoid, normalize, scale, backend)
    ctx.set_materialize_grads(False)  # no zero-filled gradients for the experts (int64) or unused logits


def _route_backward(ctx, dweights, dexperts, dlogits):
    x, gate, logits, experts = ctx.saved_tensors
    if dweights is None and dlogits is None:
        return (None,) * 9
    dx, dlogits = moe_route_backward_op(dweights, dlogits, gate, logits, experts, x.dtype, *ctx.args)
    # The router weight's gradient: one small matmul (E x N x D); x in the logits' dtype as the forward read it.
    dgate = dlogits.mT @ (x if x.dtype == dlogits.dtype else x.to(dlogits.dtype))
    return dx, dgate.to(gate.dtype), None, None, None, None, None, None, None


moe_route_op.register_autograd(_route_backward, setup_context=_setup_route)


@torch.library.custom_op("hymo::moe_plan", mutates_args=("counts_into", "dropped_into"))
def moe_plan_op(experts: torch.Tensor, n_experts: int, capacity: int, rows: int, align: int, group_rows: int,
                counts_into: torch.Tensor | None, dropped_into: torch.Tensor | None, backend: str
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    plan = plan_triton if backend == "triton" else plan_reference
    return plan(experts.reshape(-1), n_experts, capacity, rows, align, group_rows, counts_into, dropped_into)


@moe_plan_op.register_fake
def _(experts, n_experts, capacity, rows, align, group_rows, counts_into, dropped_into, backend):
    i32 = dict(dtype=torch.int32)
    return (experts.new_empty(experts.numel(), **i32), experts.new_empty(rows, **i32), experts.new_empty(n_experts, **i32),
            experts.new_empty(n_experts, dtype=torch.long))


@torch.library.custom_op("hymo::moe_permute", mutates_args=())
def moe_permute_op(x: torch.Tensor, source: torch.Tensor, position: torch.Tensor, k: int, dtype: torch.dtype,
                   backend: str) -> torch.Tensor:
    if backend == "triton":
        return permute_triton(x, source, k, dtype)
    return permute_reference(x, source, k, dtype).contiguous()


@moe_permute_op.register_fake
def _(x, source, position, k, dtype, backend):
    return x.new_empty(source.shape[0], x.shape[1], dtype=dtype)


@torch.library.custom_op("hymo::moe_permute_backward", mutates_args=())
def moe_permute_backward_op(dbuffer: torch.Tensor, position: torch.Tensor, k: int, dtype: torch.dtype,
                            addends: list[torch.Tensor], backend: str) -> torch.Tensor:
    if backend == "triton":
        return permute_backward_triton(dbuffer, position, k, dtype, addends)
    return permute_backward_reference(dbuffer, position, k, dtype, addends).contiguous()


@moe_permute_backward_op.register_fake
def _(dbuffer, position, k, dtype, addends, backend):
    return dbuffer.new_empty(position.shape[0] // k, dbuffer.shape[1], dtype=dtype)


def _setup_permute(ctx, inputs, output):
    x, source, position, k, dtype, backend = inputs
    ctx.save_for_backward(position)
    ctx.args = (k, x.dtype, [], backend)


def _permute_backward(ctx, dbuffer):
    (position,) = ctx.saved_tensors
    return moe_permute_backward_op(dbuffer, position, *ctx.args), None, None, None, None, None


moe_permute_op.register_autograd(_permute_backward, setup_context=_setup_permute)


class PermuteFanout(torch.autograd.Function):
    """`moe_permute`, and `x` again (a view) for each of its other readers (the shared expert): their
    gradients come back here and the permute backward's kernel adds them, so autograd launches no add for x."""

    @staticmethod
    def forward(ctx, x, source, position, k: int, dtype: torch.dtype, backend: str, readers: int):
        ctx.save_for_backward(position)
        ctx.args = (k, x.dtype, backend)
        ctx.set_materialize_grads(False)
        return (moe_permute_op(x, source, position, k, dtype, backend), *(x.view_as(x) for _ in range(readers)))

    @staticmethod
    def backward(ctx, dbuffer, *dreaders):
        (position,) = ctx.saved_tensors
        k, dtype, backend = ctx.args
        addends = [d for d in dreaders if d is not None]
        if dbuffer is None:  # only the readers' gradients (no expert output was used)
            return sum(addends), None, None, None, None, None, None
        return moe_permute_backward_op(dbuffer, position, k, dtype, addends, backend), None, None, None, None, None, None


@torch.library.custom_op("hymo::moe_combine", mutates_args=())
def moe_combine_op(y: torch.Tensor, source: torch.Tensor, position: torch.Tensor, weights: torch.Tensor,
                   base: torch.Tensor | None, dtype: torch.dtype, backend: str) -> torch.Tensor:
    if backend == "triton":
        return combine_triton(y, position, weights, base, dtype)
    return combine_reference(y, position, weights, base, dtype).contiguous()


@moe_combine_op.register_fake
def _(y, source, position, weights, base, dtype, backend):
    return y.new_empty(weights.shape[0], y.shape[1], dtype=dtype)


@torch.library.custom_op("hymo::moe_combine_backward", mutates_args=())
def moe_combine_backward_op(dout: torch.Tensor, y: torch.Tensor, source: torch.Tensor, position: torch.Tensor,
                            weights: torch.Tensor, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    if backend == "triton":
        return combine_backward_triton(dout, y, source, position, weights)
    dy, dweights = combine_backward_reference(dout, y, source, position, weights)
    return dy.contiguous(), dweights.contiguous()


@moe_combine_backward_op.register_fake
def _(dout, y, source, position, weights, backend):
    return torch.empty_like(y, memory_format=torch.contiguous_format), weights.new_empty(weights.shape, dtype=torch.float32)


def _setup_combine(ctx, inputs, output):
    y, source, position, weights, base, dtype, backend = inputs
    ctx.save_for_backward(y, source, position, weights)
    ctx.base = None if base is None else base.dtype
    ctx.backend = backend


def _combine_backward(ctx, dout):
    y, source, position, weights = ctx.saved_tensors
    dy, dweights = moe_combine_backward_op(dout, y, source, position, weights, ctx.backend)
    dbase = None if ctx.base is None else dout.to(ctx.base)  # the shared expert's gradient: the output's own
    return dy, None, None, dweights.to(weights.dtype), dbase, None, None


moe_combine_op.register_autograd(_combine_backward, setup_context=_setup_combine)


# ------------------------------------------------------------------ the calls the layer makes


def moe_route(x_ND: torch.Tensor, gate_ED: torch.Tensor, bias_E: torch.Tensor, k: int, sigmoid: bool, normalize: bool,
              scale: float, dtype: torch.dtype, backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(combine weights (N, k) fp32, experts (N, k) int64, logits (N, E) in `dtype`): the router's matmul x @ gate^T
    in `dtype`, top-k of scores + bias, weights from the unbiased scores; one kernel forward, one (+ the router
    weight's small matmul) backward."""
    return moe_route_op(x_ND, gate_ED, bias_E, k, sigmoid, normalize, float(scale), dtype, resolve_backend(x_ND, backend))


def moe_plan(experts_NK: torch.Tensor, n_experts: int, capacity: int, rows: int, align: int = 1, group_rows: int = 0,
             counts_into: torch.Tensor | None = None, dropped_into: torch.Tensor | None = None, backend: str | None = None):
    """(position_A, source_P, ends_E, counts_E) of the buffer the expert GEMMs read; `rows` from `plan_rows`. The
    counts are added to `counts_into`, the assignments the capacity drops to `dropped_into`, where given."""
    return moe_plan_op(experts_NK, n_experts, capacity, rows, align, group_rows, counts_into, dropped_into,
                       resolve_backend(experts_NK, backend))


def moe_permute(x_ND: torch.Tensor, source_P: torch.Tensor, position_A: torch.Tensor, k: int, dtype: torch.dtype,
                backend: str | None = None) -> torch.Tensor:
    """The buffer of expert rows: row p is token source_P[p] // k in `dtype`, padding rows zero."""
    return moe_permute_op(x_ND, source_P, position_A, k, dtype, resolve_backend(x_ND, backend))


def moe_permute_fanout(x_ND: torch.Tensor, source_P: torch.Tensor, position_A: torch.Tensor, k: int,
                       dtype: torch.dtype, readers: int, backend: str | None = None) -> tuple[torch.Tensor, ...]:
    """(the buffer, then `readers` views of x for x's other readers): x's gradient is one kernel."""
    return PermuteFanout.apply(x_ND, source_P, position_A, k, dtype, resolve_backend(x_ND, backend), readers)


def moe_combine(y_PD: torch.Tensor, source_P: torch.Tensor, position_A: torch.Tensor, weights_NK: torch.Tensor,
                base_ND: torch.Tensor | None, dtype: torch.dtype, backend: str | None = None) -> torch.Tensor:
    """base + each token's k expert rows weighted by the gates, summed in fp32, in `dtype`."""
    return moe_combine_op(y_PD, source_P, position_A, weights_NK, base_ND, dtype, resolve_backend(y_PD, backend))
