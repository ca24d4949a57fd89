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

Experts run grouped, with no host read (no `.tolist()`, no data-dependent shape): assignments are
sorted by expert (a stable argsort, so token order is kept inside an expert), each one's rank inside
its expert comes from the sorted boundaries (`searchsorted`), and every sorted row gets a place in
a buffer whose size depends on the shapes only. Two layouts of that buffer (`experts.layout`):

* "grouped": the experts' rows back to back, each group padded to 16 rows, multiplied by
  `torch._grouped_mm` with device-side offsets (chosen on CUDA with bf16 on sm_90+);
* "padded": an (E, C, D) stack, C = the most rows one expert can receive (N tokens, as a token
  picks k distinct experts, or the capacity), multiplied by one batched matmul (everywhere else).

Under expert parallelism (hymo_core/distributed/expert_parallel.py sets `experts.dispatch`) the
padded stack is the unit of exchange: its (E, C, D) shape depends on the shapes only, so the
all-to-all that sends each expert's rows to the rank holding it, and the one that brings the outputs
back, have fixed, equal split sizes: no host read of the routing.

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

from hymo_core.models.configs import MoEConfig

GROUP_ALIGN = 16  # rows of each grouped_mm group are padded to a multiple of this
EXPERT_LAYOUTS = ("auto", "grouped", "padded")


def grouped_mm_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the grouped layout is chosen: this build has `torch._grouped_mm`, a Hopper+ GPU, bf16."""
    if not hasattr(torch, "_grouped_mm") or device.type != "cuda" or dtype != torch.bfloat16:
        return False
    return torch.cuda.get_device_capability(device) >= (9, 0)


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype matmuls on `x` run in: autocast's when it is on for x's device, else x's own."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


@dataclass
class ExpertPlacement:
    """Where each expert-sorted assignment sits in the expert buffer; device tensors only.

    `rows` is the buffer's static row count, `position_A` the row of sorted assignment i (dropped
    assignments of the padded layout share the spare last row, which is never multiplied into a kept
    output), `offsets_E` (grouped layout) the int32 end row of each expert's group.
    """

    rows: int
    position_A: torch.Tensor
    offsets_E: torch.Tensor | None


def stacked_swiglu(stack_ECD: torch.Tensor, w1_EFD: torch.Tensor, w2_EDF: torch.Tensor, w3_EFD: torch.Tensor) -> torch.Tensor:
    """Each expert's SwiGLU on its rows of an (E, C, D) stack: three batched matmuls."""
    hidden_ECF = F.silu(torch.bmm(stack_ECD, w1_EFD.mT)) * torch.bmm(stack_ECD, w3_EFD.mT)
    return torch.bmm(hidden_ECF, w2_EDF.mT)


class StackedWeight(nn.Module):
    """One (E, out, in) weight for E experts, so the parameter is named `experts.wN.weight`."""

    def __init__(self, n_experts: int, out_features: int, in_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_experts, out_features, in_features))


class RoutedExperts(nn.Module):
    """E SwiGLU experts, w1 (gate) / w3 (up) / w2 (down), multiplied over an expert-major buffer."""

    def __init__(self, n_experts: int, d_model: int, expert_dim: int):
        super().__init__()
        self.n_experts = n_experts
        self.w1 = StackedWeight(n_experts, expert_dim, d_model)
        self.w2 = StackedWeight(n_experts, d_model, expert_dim)
        self.w3 = StackedWeight(n_experts, expert_dim, d_model)
        self.layout = "auto"  # a runtime choice like the kernel backend: "auto" | "grouped" | "padded"
        # Expert parallelism: (stack_ECD, (w1, w2, w3), dtype, training) -> out_ECD, run where the experts live;
        # None = every expert is here. Set by hymo_core.distributed.expert_parallel, which knows the process groups.
        self.dispatch: Callable[..., torch.Tensor] | None = None

    def resolved_layout(self, x: torch.Tensor) -> str:
        if self.layout not in EXPERT_LAYOUTS:
            raise ValueError(f"expert layout must be one of {EXPERT_LAYOUTS}, got {self.layout!r}")
        if self.dispatch is not None:
            return "padded"  # the fixed (E, C, D) stack is what the all-to-all exchanges
        if self.layout != "auto":
            return self.layout
        return "grouped" if grouped_mm_available(x.device, compute_dtype(x)) else "padded"

    def place(self, layout: str, sorted_experts_A: torch.Tensor, rank_A: torch.Tensor, counts_E: torch.Tensor,
              per_expert_rows: int) -> ExpertPlacement:
        """Buffer rows of the sorted assignments; `per_expert_rows` is the most one expert keeps."""
        E, A = self.n_experts, sorted_experts_A.numel()
        if layout == "grouped":
            padded_E = (counts_E + GROUP_ALIGN - 1) // GROUP_ALIGN * GROUP_ALIGN
            ends_E = torch.cumsum(padded_E, 0)
            position_A = (ends_E - padded_E)[sorted_experts_A] + rank_A
            return ExpertPlacement(A + E * (GROUP_ALIGN - 1), position_A, ends_E.to(torch.int32))
        spare = E * per_expert_rows
        position_A = torch.where(rank_A < per_expert_rows, sorted_experts_A * per_expert_rows + rank_A, spare)
        return ExpertPlacement(spare + 1, position_A, None)

    def forward(self, x_AD: torch.Tensor, placement: ExpertPlacement) -> torch.Tensor:
        """`x_AD` in expert-sorted order; returns one output row per row of `x_AD`, same order."""
        dtype = compute_dtype(x_AD)
        D = x_AD.shape[1]
        buffer_PD = x_AD.new_zeros(placement.rows, D, dtype=dtype).index_put((placement.position_A,), x_AD.to(dtype))
        if self.dispatch is not None:
            stack_ECD = buffer_PD[:-1].view(self.n_experts, -1, D)
            out_ECD = self.dispatch(stack_ECD, (self.w1.weight, self.w2.weight, self.w3.weight), dtype, self.training)
            return torch.cat((out_ECD.reshape(-1, D), buffer_PD.new_zeros(1, D)))[placement.position_A]
        w1, w2, w3 = (w.weight.to(dtype) for w in (self.w1, self.w2, self.w3))
        if placement.offsets_E is not None:
            offsets = placement.offsets_E
            hidden_PF = F.silu(torch._grouped_mm(buffer_PD, w1.mT, offs=offsets)) * \
                torch._grouped_mm(buffer_PD, w3.mT, offs=offsets)
            out_PD = torch._grouped_mm(hidden_PF, w2.mT, offs=offsets)
        else:
            stack_ECD = buffer_PD[:-1].view(self.n_experts, -1, D)
            out_PD = torch.cat((stacked_swiglu(stack_ECD, w1, w2, w3).reshape(-1, D), buffer_PD.new_zeros(1, D)))
        return out_PD[placement.position_A]


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
        return Routing(experts_NK, weights_NK * self.config.route_scale, scores_NE)

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
        flat_experts_A = routing.experts_NK.reshape(-1)
        order_A = torch.argsort(flat_experts_A, stable=True)  # assignments grouped by expert, token order kept
        sorted_experts_A = flat_experts_A[order_A]
        bounds_E1 = torch.searchsorted(sorted_experts_A, torch.arange(E + 1, device=x_ND.device))
        starts_E, counts_E = bounds_E1[:-1], bounds_E1.diff()
        rank_A = torch.arange(N * K, device=x_ND.device) - starts_E[sorted_experts_A]
        capacity = self.capacity(N)
        kept_A = rank_A < capacity
        placement = self.experts.place(self.experts.resolved_layout(x_ND), sorted_experts_A, rank_A, counts_E, capacity)
        y_AD = self.experts(x_ND[order_A // K], placement)
        y_AD = y_AD * routing.weights_NK.reshape(-1)[order_A].unsqueeze(1).to(y_AD.dtype)
        y_AD = torch.where(kept_A.unsqueeze(1), y_AD, 0.0)  # a dropped assignment adds nothing, not even a NaN
        # Un-sort into one row per (token, slot) and sum the k slots: no atomic scatter-add, so the
        # sum's order (and a resumed run's bits) does not depend on the device's thread schedule.
        slots_AD = x_ND.new_zeros(N * K, D).index_copy(0, order_A, y_AD.to(x_ND.dtype))
        out_ND = slots_AD.view(N, K, D).sum(dim=1)
        if self.shared_expert is not None:
            out_ND = out_ND + self.shared_expert(x_ND)
        if self.training:
            with torch.no_grad():
                self.tokens_per_expert_E += counts_E.to(torch.float64)
                self.dropped_assignments += (~kept_A).sum().to(torch.float64)
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
