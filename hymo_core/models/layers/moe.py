"""DeepSeekMoE FFN: fine-grained routed SwiGLU experts + shared experts, aux-loss-free balancing.

DeepSeek-V3's recipe as seed 000 (§6.5, "EMA gate-bias") uses it:

* the router (`gate`) scores every token against every routed expert with a sigmoid (or softmax);
* a per-expert bias (`expert_bias_E`, a buffer: no gradient, in no optimizer) is added to the
  scores **only to choose the top-k experts**; the combine weights are the unbiased scores of the
  chosen experts (normalised to sum 1 for sigmoid), so the bias steers load, never outputs;
* every training forward adds its per-expert token counts to `tokens_per_expert_E`; once per
  optimizer update (`after_optimizer_step`, never inside backward) the counts of all the update's
  micro-batches (and, through `reduce`, all data-parallel ranks) become loads, an exponential
  moving average of the loads is kept (`load_ema_E`, decay configurable), and the bias moves
  b_i += gamma * sign(mean_load - load_i): under-loaded experts become more attractive;
* an optional sequence-wise auxiliary loss (DeepSeek-V3 eq. 17-20), weight 0 by default.

Experts run dropless and grouped: assignments are sorted by expert (a stable argsort, so token
order is kept inside an expert), each one's rank inside its expert comes from the sorted boundaries
(`searchsorted`), and the work is about N k rows, not E / k times that. Layouts (`experts.layout`):

* "grouped": the experts' rows back to back in a buffer whose size depends on the shapes only
  (N k + E * 15 rows at most), each group padded to 16 rows, multiplied by `torch._grouped_mm` with
  device-side offsets: no host read. Chosen on CUDA sm_90+ in bf16 and on the CPU;
* "looped": the same rows, one matmul chain per expert over its exact segment; the E segment sizes
  are read to the host once per layer and forward. Chosen on CUDA where `_grouped_mm` has no native
  kernel (fp32, or before sm_90);
* "padded": an (E, C, D) stack, C = the most rows one expert can receive (N, or the capacity): E / k
  times the work. Never chosen; the reference the others are tested against.

Under expert parallelism (hymo_core/distributed/expert_parallel.py sets `experts.dispatch`) each
expert's kept rows travel to the rank holding it by an all-to-all with variable split sizes, and back;
the splits are read to the host, one small read per MoE layer and forward (the documented exception).

Outputs go back to their (token, slot) rows and the k slots are summed, with no atomic scatter-add.
With `capacity_factor > 0` an expert keeps at most ceil(cf * tokens * k / E) assignments per
forward, the first in token order; the rest are dropped (their combine weight is lost, the residual
carries the token) and counted. Counters and the gate-bias step stay on the device; only
`moe_after_optimizer_step(..., read=True)` (the trainer's logging steps) reads figures back.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from hymo_core.kernels.grouped_mm import grouped_mm
from hymo_core.models.configs import MoEConfig

GROUP_ALIGN = 16  # rows of each grouped_mm group are padded to a multiple of this (16-byte TMA alignment, bf16 and fp32)
EXPERT_LAYOUTS = ("auto", "grouped", "looped", "padded")


def native_grouped_mm(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether `torch._grouped_mm` runs its own kernel here, with device-side offsets: CUDA sm_90+ in bf16, or the CPU
    (torch's per-group loop, where reading the offsets is no device sync)."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    if device.type == "cpu":
        return True
    return device.type == "cuda" and dtype == torch.bfloat16 and torch.cuda.get_device_capability(device) >= (9, 0)


def grouped_mm_flops(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """`torch._grouped_mm`'s FLOPs, every row of the buffer counted (padding and slack included): 2 m k n.

    (m, k) x (G, k, n) is the forward and the input gradient; (k, m) x (m, n) -> (G, k, n) the weight
    gradient, the offsets splitting m; (G, m, k) x (G, k, n) the batched form. torch's FlopCounterMode
    has no formula for the op (it counts 0), so one is registered here.
    """
    if len(a_shape) == 3 and len(b_shape) == 3:
        return 2 * a_shape[0] * a_shape[1] * a_shape[2] * b_shape[2]
    return 2 * a_shape[-2] * a_shape[-1] * b_shape[-1]


def _register_grouped_mm_flops() -> None:
    from torch.utils import flop_counter

    op = getattr(torch.ops.aten, "_grouped_mm", None)
    if op is not None and op.default not in flop_counter.flop_registry and op not in flop_counter.flop_registry:
        flop_counter.register_flop_formula(op)(grouped_mm_flops)


_register_grouped_mm_flops()


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype matmuls on `x` run in: autocast's when it is on for x's device, else x's own (the meta device
    has no autocast: counting there runs in the model's own dtype)."""
    if torch.amp.is_autocast_available(x.device.type) and torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def resolve_layout(layout: str, x: torch.Tensor) -> str:
    """"auto": grouped where `torch._grouped_mm` runs natively, else looped. "padded" is never chosen: it is the
    E / k times larger reference the others are tested against."""
    if layout not in EXPERT_LAYOUTS:
        raise ValueError(f"expert layout must be one of {EXPERT_LAYOUTS}, got {layout!r}")
    if layout != "auto":
        return layout
    return "grouped" if native_grouped_mm(x.device, compute_dtype(x)) else "looped"


@dataclass
class SortedAssignments:
    """One forward's (token, slot) assignments sorted by expert, token order kept inside an expert; device tensors.

    `rank_A` is an assignment's place among its expert's; it is kept when that is below `capacity` (the most one
    expert keeps: a shape-only bound); `counts_E` counts each expert's assignments, `kept_E` its kept ones.
    `can_drop` is False when the capacity is at least the token count (dropless: a token picks k distinct experts,
    so no expert receives more): a static fact, so the masks that only matter for drops are not launched.
    """

    experts_A: torch.Tensor
    rank_A: torch.Tensor
    kept_A: torch.Tensor
    counts_E: torch.Tensor
    kept_E: torch.Tensor
    capacity: int
    can_drop: bool = True

    @staticmethod
    def of(experts_A: torch.Tensor, n_experts: int, capacity: int, can_drop: bool = True) -> tuple["SortedAssignments", torch.Tensor]:
        """Sort flat expert ids (a stable argsort); returns the assignments and the sorting order."""
        order_A = torch.argsort(experts_A, stable=True)
        sorted_A = experts_A[order_A]
        bounds_E1 = torch.searchsorted(sorted_A, torch.arange(n_experts + 1, device=experts_A.device))
        rank_A = torch.arange(sorted_A.numel(), device=experts_A.device) - bounds_E1[:-1][sorted_A]
        counts_E = bounds_E1.diff()
        kept_E = counts_E.clamp(max=capacity) if can_drop else counts_E
        return SortedAssignments(sorted_A, rank_A, rank_A < capacity, counts_E, kept_E, capacity, can_drop), order_A


def grouped_rows(assignments: SortedAssignments, n_experts: int) -> tuple[int, torch.Tensor, torch.Tensor]:
    """The grouped buffer: its static row count, each kept assignment's row, and the int32 group ends.

    Each expert's kept rows sit back to back, the group padded to GROUP_ALIGN rows; the slack (at most
    E * (GROUP_ALIGN - 1) rows beyond the kept ones, a shape-only bound) joins the last group, so the groups
    cover the whole buffer and no output row is left unwritten. Dropped assignments share the last row.
    """
    kept_bound = min(assignments.experts_A.numel(), n_experts * assignments.capacity)
    rows = -(-(kept_bound + n_experts * (GROUP_ALIGN - 1) + 1) // GROUP_ALIGN) * GROUP_ALIGN
    padded_E = (assignments.kept_E + GROUP_ALIGN - 1) // GROUP_ALIGN * GROUP_ALIGN
    ends_E = torch.cumsum(padded_E, 0)
    position_A = (ends_E - padded_E)[assignments.experts_A] + assignments.rank_A
    if assignments.can_drop:
        position_A = torch.where(assignments.kept_A, position_A, rows - 1)
    ends_E = torch.cat((ends_E[:-1], ends_E.new_full((1,), rows)))
    return rows, position_A, ends_E.to(torch.int32)


def grouped_swiglu(x_PD: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor, ends_E: torch.Tensor) -> torch.Tensor:
    """Each expert's SwiGLU on its group of rows: three `torch._grouped_mm` calls, no padding beyond the groups'."""
    hidden_PF = F.silu(grouped_mm(x_PD, w1.mT, ends_E)) * grouped_mm(x_PD, w3.mT, ends_E)
    return grouped_mm(hidden_PF, w2.mT, ends_E)


def stacked_swiglu(stack_ECD: torch.Tensor, w1_EFD: torch.Tensor, w2_EDF: torch.Tensor, w3_EFD: torch.Tensor) -> torch.Tensor:
    """Each expert's SwiGLU on its rows of an (E, C, D) stack: three batched matmuls."""
    hidden_ECF = F.silu(torch.bmm(stack_ECD, w1_EFD.mT)) * torch.bmm(stack_ECD, w3_EFD.mT)
    return torch.bmm(hidden_ECF, w2_EDF.mT)


def expert_swiglu(layout: str, x_AD: torch.Tensor, assignments: SortedAssignments, w1: torch.Tensor, w2: torch.Tensor,
                  w3: torch.Tensor) -> torch.Tensor:
    """Each kept assignment's expert output, one row per row of `x_AD` (expert-sorted); dropped rows give 0.

    grouped: the kept rows grouped by expert (`grouped_rows`), `torch._grouped_mm`; ~N k rows of work.
    looped: the same rows, one matmul chain per expert over its exact segment; the segment sizes are read
        to the host (one read of E counts: where torch has no native grouped matmul on this device).
    padded: an (E, C, D) stack, C = the capacity (N without one): E / k times the work; the reference.
    """
    E, D = w1.shape[0], x_AD.shape[1]
    if assignments.can_drop:
        x_AD = torch.where(assignments.kept_A.unsqueeze(1), x_AD, 0.0)
    if layout == "padded":
        C = assignments.capacity
        position_A = torch.where(assignments.kept_A, assignments.experts_A * C + assignments.rank_A, E * C)
        buffer_PD = x_AD.new_zeros(E * C + 1, D).index_put((position_A,), x_AD)
        out_PD = torch.cat((stacked_swiglu(buffer_PD[:-1].view(E, C, D), w1, w2, w3).reshape(-1, D), buffer_PD.new_zeros(1, D)))
        return out_PD[position_A]
    if layout == "looped":
        kept_E = assignments.kept_E.tolist()  # the one host read of this layout
        position_A = torch.where(assignments.kept_A, (torch.cumsum(assignments.kept_E, 0) - assignments.kept_E)[assignments.experts_A]
                                 + assignments.rank_A, sum(kept_E))
        rows_KD = x_AD.new_zeros(sum(kept_E) + 1, D).index_put((position_A,), x_AD)
        outputs = [F.linear(F.silu(F.linear(rows, w1[e])) * F.linear(rows, w3[e]), w2[e])
                   for e, rows in enumerate(rows_KD[:-1].split(kept_E))]
        return torch.cat(outputs + [rows_KD.new_zeros(1, D)])[position_A]
    rows, position_A, ends_E = grouped_rows(assignments, E)
    buffer_PD = x_AD.new_zeros(rows, D).index_put((position_A,), x_AD)
    return grouped_swiglu(buffer_PD, w1, w2, w3, ends_E)[position_A]


class StackedWeight(nn.Module):
    """One (E, out, in) weight for E experts, so the parameter is named `experts.wN.weight`."""

    def __init__(self, n_experts: int, out_features: int, in_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_experts, out_features, in_features))


class RoutedExperts(nn.Module):
    """E SwiGLU experts, w1 (gate) / w3 (up) / w2 (down), over expert-sorted assignment rows."""

    def __init__(self, n_experts: int, d_model: int, expert_dim: int):
        super().__init__()
        self.n_experts = n_experts
        self.w1 = StackedWeight(n_experts, expert_dim, d_model)
        self.w2 = StackedWeight(n_experts, d_model, expert_dim)
        self.w3 = StackedWeight(n_experts, expert_dim, d_model)
        self.layout = "auto"  # a runtime choice like the kernel backend: one of EXPERT_LAYOUTS
        # Expert parallelism: (x_AD, assignments, (w1, w2, w3), dtype, layout) -> y_AD, the rows sent to the ranks
        # holding their experts and back; None = every expert is here. Set by hymo_core.distributed.expert_parallel.
        self.dispatch: Callable[..., torch.Tensor] | None = None

    def resolved_layout(self, x: torch.Tensor) -> str:
        return resolve_layout(self.layout, x)

    def forward(self, x_AD: torch.Tensor, assignments: SortedAssignments) -> torch.Tensor:
        """`x_AD` in expert-sorted order; returns one output row per row of `x_AD`, same order (dropped: 0)."""
        dtype = compute_dtype(x_AD)
        layout = self.resolved_layout(x_AD)
        if self.dispatch is not None:
            return self.dispatch(x_AD.to(dtype), assignments, (self.w1.weight, self.w2.weight, self.w3.weight), dtype, layout)
        w1, w2, w3 = (w.weight.to(dtype) for w in (self.w1, self.w2, self.w3))
        return expert_swiglu(layout, x_AD.to(dtype), assignments, w1, w2, w3)


class SharedExpert(nn.Module):
    """The always-on SwiGLU (n_shared experts fused into one of n_shared x the width)."""

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(d_model, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d_model, bias=False)
        self.w3 = nn.Linear(d_model, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


@dataclass
class Routing:
    experts_NK: torch.Tensor  # chosen experts per token (bias used here)
    weights_NK: torch.Tensor  # their combine weights (no bias)
    scores_NE: torch.Tensor  # unbiased affinities


class MoE(nn.Module):
    """The FFN of a block (layers/__init__.py): forward(x_BTD) -> y_BTD, counting tokens per expert in training."""

    def __init__(self, d_model: int, config: MoEConfig, init_std: float = 0.02):
        super().__init__()
        self.config = config
        E = config.n_routed_experts
        self.gate = nn.Linear(d_model, E, bias=False)
        self.experts = RoutedExperts(E, d_model, config.expert_dim)
        self.shared_expert = SharedExpert(d_model, config.n_shared_experts * config.expert_dim) if config.n_shared_experts else None
        # Persistent buffers: a checkpoint carries the balancing state, so a resume continues it exactly.
        self.register_buffer("expert_bias_E", torch.zeros(E))
        self.register_buffer("load_ema_E", torch.full((E,), 1.0 / E))
        self.register_buffer("tokens_per_expert_E", torch.zeros(E, dtype=torch.float64))
        self.register_buffer("dropped_assignments", torch.zeros((), dtype=torch.float64))
        self.aux_loss: torch.Tensor | None = None  # of the last training forward, when aux_loss_weight > 0
        self.last_update_stats: dict[str, torch.Tensor] | None = None
        self.init_std = init_std
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        for weight in (self.gate.weight, self.experts.w2.weight):
            nn.init.normal_(weight, std=self.init_std)
        if self.shared_expert is not None:
            for linear in (self.shared_expert.w1, self.shared_expert.w2, self.shared_expert.w3):
                nn.init.normal_(linear.weight, std=self.init_std)
        self.init_extra_parameters()

    @torch.no_grad()
    def init_extra_parameters(self, generator: torch.Generator | None = None) -> None:
        """The stacked input weights (the model's init walk only knows nn.Linear / nn.Embedding)."""
        nn.init.normal_(self.experts.w1.weight, std=self.init_std, generator=generator)
        nn.init.normal_(self.experts.w3.weight, std=self.init_std, generator=generator)

    @torch.no_grad()
    def reset_buffers(self) -> None:
        """The balancing state of a fresh model (meta-device materialisation recomputes it)."""
        self.expert_bias_E.zero_()
        self.load_ema_E.fill_(1.0 / self.config.n_routed_experts)
        self.tokens_per_expert_E.zero_()
        self.dropped_assignments.zero_()

    def residual_weights(self) -> list[torch.Tensor]:
        """Weights that write into the residual stream (the model re-initialises them depth-scaled)."""
        out = [self.experts.w2.weight]
        if self.shared_expert is not None:
            out.append(self.shared_expert.w2.weight)
        return out

    def route(self, x_ND: torch.Tensor) -> Routing:
        scores_NE = self.gate(x_ND).float()
        scores_NE = scores_NE.sigmoid() if self.config.score_function == "sigmoid" else scores_NE.softmax(dim=-1)
        # The bias only decides *which* experts: selection from biased scores, weights from unbiased ones.
        _, experts_NK = (scores_NE.detach() + self.expert_bias_E).topk(self.config.n_activated_experts, dim=-1)
        weights_NK = scores_NE.gather(1, experts_NK)
        if self.config.score_function == "sigmoid" and self.config.n_activated_experts > 1:
            # DeepSeek-V3 normalises the chosen sigmoid scores. With one expert that would be the
            # constant 1 and the router would get no gradient, so top-1 keeps the raw score.
            weights_NK = weights_NK / weights_NK.sum(dim=-1, keepdim=True)
        scale = self.config.route_scale
        return Routing(experts_NK, weights_NK * scale if scale != 1.0 else weights_NK, scores_NE)

    def capacity(self, n_tokens: int) -> int:
        """Most assignments one expert keeps per forward: ceil(cf * N * k / E) with a capacity factor,
        else N (a token picks k distinct experts, so no expert receives more than N)."""
        if self.config.capacity_factor <= 0:
            return n_tokens
        assignments = n_tokens * self.config.n_activated_experts
        return min(n_tokens, math.ceil(self.config.capacity_factor * assignments / self.config.n_routed_experts))

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        B, T, D = x_BTD.shape
        N = B * T
        x_ND = x_BTD.reshape(N, D)
        routing = self.route(x_ND)
        E, K = self.config.n_routed_experts, self.config.n_activated_experts
        capacity = self.capacity(N)
        assignments, order_A = SortedAssignments.of(routing.experts_NK.reshape(-1), E, capacity, can_drop=capacity < N)
        y_AD = self.experts(x_ND[order_A // K] if K > 1 else x_ND[order_A], assignments)
        y_AD = y_AD * routing.weights_NK.reshape(-1)[order_A].unsqueeze(1).to(y_AD.dtype)
        if assignments.can_drop:
            y_AD = torch.where(assignments.kept_A.unsqueeze(1), y_AD, 0.0)  # a dropped assignment adds nothing, not even a NaN
        # Un-sort into one row per (token, slot) and sum the k slots: no atomic scatter-add, so the
        # sum's order (and a resumed run's bits) does not depend on the device's thread schedule.
        slots_AD = x_ND.new_zeros(N * K, D).index_copy(0, order_A, y_AD.to(x_ND.dtype))
        out_ND = slots_AD.view(N, K, D).sum(dim=1) if K > 1 else slots_AD
        if self.shared_expert is not None:
            out_ND = out_ND + self.shared_expert(x_ND)
        if self.training:
            with torch.no_grad():
                self.tokens_per_expert_E += assignments.counts_E.to(torch.float64)
                if assignments.can_drop:  # dropless: nothing to add
                    self.dropped_assignments += (~assignments.kept_A).sum().to(torch.float64)
            self.aux_loss = self._sequence_aux_loss(routing, B, T) if self.config.aux_loss_weight > 0 else None
        return out_ND.reshape(B, T, D)

    def _sequence_aux_loss(self, routing: Routing, B: int, T: int) -> torch.Tensor:
        """DeepSeek-V3's sequence-wise balance loss: alpha * sum_i f_i P_i, averaged over sequences."""
        E, K = self.config.n_routed_experts, self.config.n_activated_experts
        chosen_BTE = torch.zeros(B * T, E, device=routing.scores_NE.device).scatter_(1, routing.experts_NK, 1.0).view(B, T, E)
        f_BE = chosen_BTE.sum(dim=1) * E / (K * T)
        normalised_BTE = (routing.scores_NE / routing.scores_NE.sum(dim=-1, keepdim=True)).view(B, T, E)
        p_BE = normalised_BTE.mean(dim=1)
        return self.config.aux_loss_weight * (f_BE * p_BE).sum(dim=1).mean()

    @torch.no_grad()
    def apply_bias_update(self, tokens_per_expert_E: torch.Tensor, dropped: torch.Tensor) -> dict[str, torch.Tensor]:
        """One optimizer update's balancing step from its (already reduced) counts; resets the counters.

        Device tensors only: an update that routed nothing keeps the bias and averages an even load
        into the EMA. The figures are 0-dim / (E,) tensors; `load_figures` reads them.
        """
        E = self.config.n_routed_experts
        total = tokens_per_expert_E.sum()
        routed = total > 0
        load_E = torch.where(routed, tokens_per_expert_E / total.clamp(min=1.0), 1.0 / E).float()
        decay = self.config.load_ema_decay
        self.load_ema_E.mul_(decay).add_(load_E, alpha=1.0 - decay)
        if self.config.bias_update:
            step_E = self.config.bias_update_rate * torch.sign(self.load_ema_E.mean() - self.load_ema_E)
            self.expert_bias_E += torch.where(routed, step_E, 0.0)
        self.tokens_per_expert_E.zero_()
        self.dropped_assignments.zero_()
        relative_E = load_E * E  # 1.0 = a perfectly even share
        self.last_update_stats = {
            "load_min": relative_E.min(), "load_max": relative_E.max(),
            "load_cv": relative_E.std(unbiased=False), "bias_norm": self.expert_bias_E.norm(),
            "dropped_tokens": dropped.detach().clone(), "load": relative_E,
        }
        return self.last_update_stats

    @torch.no_grad()
    def discard_counts(self) -> None:
        """An attempted update that did not happen (fp16 overflow skip): its counts must not steer the bias."""
        self.tokens_per_expert_E.zero_()
        self.dropped_assignments.zero_()


Reduce = Callable[[torch.Tensor], torch.Tensor]
LOAD_FIGURES = ("load_min", "load_max", "load_cv", "bias_norm", "dropped_tokens")


def load_figures(stats: dict[str, torch.Tensor]) -> dict[str, float | list[float]]:
    """One layer's update figures as plain numbers: one host read (the trainer's logging steps)."""
    values = torch.cat([stats[key].reshape(-1).double() for key in LOAD_FIGURES + ("load",)]).tolist()
    figures: dict[str, float | list[float]] = dict(zip(LOAD_FIGURES, values))
    figures["load"] = [round(v, 4) for v in values[len(LOAD_FIGURES):]]
    return figures


@torch.no_grad()
def moe_after_optimizer_step(named_moes: list[tuple[str, MoE]], reduce: Reduce | None = None,
                             read: bool = True) -> dict[str, dict]:
    """The once-per-update balancing step for every MoE layer; returns each layer's load figures.

    `reduce` sums a tensor over data-parallel ranks (e.g. `dist.all_reduce` in place, returned);
    all layers' counts travel in one tensor, so a data-parallel update costs one collective.
    With `read=False` (an update that is not logged) nothing is read back and {} is returned.
    """
    if not named_moes:
        return {}
    counts = torch.stack([torch.cat([moe.tokens_per_expert_E, moe.dropped_assignments.view(1)]) for _, moe in named_moes])
    if reduce is not None:
        counts = reduce(counts)
    stats = {name: moe.apply_bias_update(row[:-1], row[-1]) for (name, moe), row in zip(named_moes, counts)}
    return {name: load_figures(layer) for name, layer in stats.items()} if read else {}
