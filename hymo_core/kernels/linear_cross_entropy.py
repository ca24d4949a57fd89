"""The output projection and cross-entropy (+ z-loss) fused over chunks of tokens: the full logits never exist.

At dense-125m's 8 x 2048 tokens and vocabulary 50,304 the logits are 1.65 GB in bf16, written by the
head, read by the loss, and their gradient written and read again. Here the tokens are taken
CHUNK_ELEMENTS // V rows at a time (a power of two; 4,096 rows at V = 50,304: 4 chunks, about 8 launches
each, so the chunking costs launches that stay few): each chunk's
logits are projected, reduced to (ce, lse) per row by `hymo::cross_entropy_rows`, and, when a gradient
will be asked for, turned at once into the chunk's gradient (`hymo::cross_entropy_rows_backward`) and
multiplied back into the hidden state's and the weight's gradients, as Liger-Kernel's fused linear
cross-entropy does. The backward then only scales those two by the upstream gradient: no logits are
saved and none are recomputed, at the cost of holding an fp32 weight gradient (V x D) from forward to
backward instead of the logits (N x V).

The objective is ce + z_loss * mean(lse^2) over non-ignored tokens, the same as
`cross_entropy.cross_entropy_loss` on the full logits, and the cross-entropy is returned beside it for
reporting, and each row's log-partition (log-Z, the monitor's signal) as a third (no gradient flows
through either).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hymo_core.kernels.backend import resolve_backend
from hymo_core.kernels.cross_entropy import cross_entropy_rows_backward_op, cross_entropy_rows_op, vocab_block

CHUNK_ELEMENTS = 1 << 28  # logits of one chunk: 2**28 elements, 537 MB in bf16 (a third of dense-125m's whole)


def chunk_rows(rows: int, vocab: int) -> int:
    """Tokens per chunk: the largest power of two with at most CHUNK_ELEMENTS logits (at least 1)."""
    fitting = max(1, CHUNK_ELEMENTS // vocab)
    return min(rows, 1 << (fitting.bit_length() - 1))


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden_ND, weight_VD, targets_N, z_loss, multiplier, ignore_index, backend, chunk, with_grad):
        N, V = hidden_ND.shape[0], weight_VD.shape[0]
        valid_N = (targets_N != ignore_index).float()
        n_valid = valid_N.sum().clamp(min=1.0)
        if with_grad:
            dce_N = valid_N / n_valid  # d objective / d ce_row (ignored rows: 0)
            dlse_coefficient_N = valid_N * (2.0 * z_loss / n_valid) if z_loss else torch.zeros_like(valid_N)
            dhidden = []
            dweight_VD = torch.zeros(weight_VD.shape, dtype=torch.float32, device=weight_VD.device)
        ce, lse = [], []
        block_v = vocab_block(V)
        for start in range(0, N, chunk):
            rows = slice(start, start + chunk)
            h_CD, targets_C = hidden_ND[rows], targets_N[rows]
            logits_CV = F.linear(h_CD, weight_VD)
            if multiplier != 1.0:
                logits_CV = logits_CV * multiplier
            ce_C, lse_C = cross_entropy_rows_op(logits_CV, targets_C, ignore_index, block_v, backend)
            ce.append(ce_C)
            lse.append(lse_C)
            if with_grad:  # d objective / d logits of this chunk, then into h and W: the chunk's logits die here
                dlse_C = lse_C * dlse_coefficient_N[rows] if z_loss else dlse_coefficient_N[rows]
                dlogits_CV = cross_entropy_rows_backward_op(dce_N[rows], dlse_C, logits_CV, targets_C, lse_C,
                                                            ignore_index, block_v, backend)
                if multiplier != 1.0:
                    dlogits_CV = dlogits_CV * multiplier
                dhidden.append(dlogits_CV @ weight_VD)
                dweight_VD += dlogits_CV.t() @ h_CD
                del dlogits_CV
            del logits_CV
        ce_N, lse_N = (torch.cat(parts) if len(parts) > 1 else parts[0] for parts in (ce, lse))
        mean_ce = ce_N.sum() / n_valid
        objective = mean_ce + z_loss * (lse_N.square() * valid_N).sum() / n_valid if z_loss else mean_ce.clone()
        if with_grad:
            dhidden_ND = (torch.cat(dhidden) if len(dhidden) > 1 else dhidden[0]).to(hidden_ND.dtype)
            ctx.save_for_backward(dhidden_ND, dweight_VD)
        ctx.with_grad, ctx.weight_dtype = with_grad, weight_VD.dtype
        lse_N = lse_N.detach()  # every row's log-partition: a monitor's log-Z, at no extra launch
        ctx.mark_non_differentiable(mean_ce, lse_N)
        ctx.set_materialize_grads(False)  # the two reported outputs get no zero-filled gradients (launches)
        return objective, mean_ce, lse_N

    @staticmethod
    def backward(ctx, dobjective, _dce, _dlse):
        if not ctx.with_grad:
            raise RuntimeError("linear_cross_entropy ran without a gradient (grad mode off) and was differentiated")
        dhidden_ND, dweight_VD = ctx.saved_tensors
        if dobjective is None:
            return (None,) * 9
        return (dhidden_ND * dobjective.to(dhidden_ND.dtype), (dweight_VD * dobjective).to(ctx.weight_dtype),
                None, None, None, None, None, None, None)


def linear_cross_entropy(
    hidden_ND: torch.Tensor,
    weight_VD: torch.Tensor,
    targets_N: torch.Tensor,
    z_loss: float = 0.0,
    multiplier: float = 1.0,
    ignore_index: int = -100,
    backend: str | None = None,
    chunk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(objective, mean cross-entropy, each row's log-partition) of logits = multiplier * hidden @ weight.T,
    never materialised whole (the last two carry no gradient; the third is what a monitor reads as log-Z).

    `chunk` rows at a time (default `chunk_rows`). Equals `cross_entropy_loss(head(hidden), targets, z_loss)`
    in value and gradient (hidden's and weight's).
    """
    if hidden_ND.ndim != 2 or weight_VD.ndim != 2 or targets_N.shape != hidden_ND.shape[:1]:
        raise ValueError(f"expected (N, D) hidden, (V, D) weight and (N,) targets, got {tuple(hidden_ND.shape)}, "
                         f"{tuple(weight_VD.shape)}, {tuple(targets_N.shape)}")
    chunk = chunk or chunk_rows(hidden_ND.shape[0], weight_VD.shape[0])
    with_grad = torch.is_grad_enabled() and (hidden_ND.requires_grad or weight_VD.requires_grad)
    return _LinearCrossEntropy.apply(hidden_ND, weight_VD, targets_N, float(z_loss), float(multiplier), ignore_index,
                                     resolve_backend(hidden_ND, backend), chunk, with_grad)
