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

Routing and dispatch are four fused ops (hymo_core/kernels/moe_dispatch.py; Triton on CUDA, PyTorch on the
CPU), so the layer is a handful of kernels around the expert GEMMs, as in DeepSeek-V3 / torchtitan /
Megablocks: `hymo::moe_route` (the router's matmul, scores, top-k with the bias, combine weights; its backward
writes x's gradient too, the router weight's is one small matmul), `hymo::moe_plan` (per-expert
counts, each assignment's row in the experts' buffer: its stable rank inside its expert, so token order is
kept there; each row's assignment), `hymo::moe_permute` (one gather into that buffer, in the matmuls' dtype)
and `hymo::moe_combine` (one weighted gather-sum back to the tokens, the shared expert's output added).
Experts run dropless over about N k rows, not E / k times that. Layouts (`experts.layout`) of the buffer:

* "grouped": the experts' rows back to back in a buffer whose size depends on the shapes only
  (N k + E * 15 rows at most), each group padded to 16 rows, multiplied by `torch._grouped_mm` with
  device-side offsets: no host read. Chosen on CUDA sm_90+ in bf16 and on the CPU;
* "looped": the same rows packed exactly, one matmul chain per expert over its segment; the E segment
  sizes are read to the host once per layer and forward. Chosen on CUDA where `_grouped_mm` has no native
  kernel (fp32, or before sm_90);
* "padded": an (E, C, D) stack, C = the most rows one expert can receive (N, or the capacity): E / k
  times the work. Never chosen; the reference the others are tested against.

Under expert parallelism (hymo_core/distributed/expert_parallel.py sets `experts.dispatch`) each
expert's kept rows travel to the rank holding it by an all-to-all with variable split sizes, and back;
the splits are read to the host, one small read per MoE layer and forward (the documented exception).

Each token's k expert rows are summed by the one program that owns the token: no atomic scatter-add.
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

from hymo_core.kernels.activation import swiglu
from hymo_core.kernels.grouped_mm import grouped_mm
from hymo_core.kernels.moe_dispatch import moe_combine, moe_permute_fanout, moe_plan, moe_route, plan_rows, route_scores
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


def float_promotion(a: torch.dtype, b: torch.dtype) -> torch.dtype:
    """`torch.promote_types` of two floating dtypes, worked out here: the aten call would count as a launch."""
    if a == b:
        return a
    wider = max(a, b, key=lambda d: d.itemsize)
    return torch.float32 if wider.itemsize == 2 else wider  # fp16 with bf16 -> fp32


def resolve_layout(layout: str, x: torch.Tensor) -> str:
    """"auto": grouped where `torch._grouped_mm` runs natively, else looped. "padded" is never chosen: it is the
    E / k times larger reference the others are tested against."""
    if layout not in EXPERT_LAYOUTS:
        raise ValueError(f"expert layout must be one of {EXPERT_LAYOUTS}, got {layout!r}")
    if layout != "auto":
        return layout
    return "grouped" if native_grouped_mm(x.device, compute_dtype(x)) else "looped"


@dataclass
class DispatchPlan:
    """Where one forward's (token, slot) assignments sit in the buffer of rows the experts read; device tensors
    from `hymo::moe_plan` (hymo_core/kernels/moe_dispatch.py).

    `position_A`: each assignment's row (-1: a capacity dropped it); `source_P`: each row's assignment (-1:
    padding); `ends_E`: the int32 group ends `torch._grouped_mm` reads; `counts_E`: each expert's assignments.
    Inside an expert the rows keep token order. `can_drop` is False when the capacity is at least the token
    count (a token picks k distinct experts, so no expert receives more): a static fact, so nothing that only
    matters for drops is launched.
    """

    position_A: torch.Tensor
    source_P: torch.Tensor
    ends_E: torch.Tensor
    counts_E: torch.Tensor
    capacity: int
    can_drop: bool

    @property
    def kept_E(self) -> torch.Tensor:
        return self.counts_E.clamp(max=self.capacity) if self.can_drop else self.counts_E

    @staticmethod
    def of(experts: torch.Tensor, n_experts: int, capacity: int, layout: str, can_drop: bool = True,
           counters: tuple[torch.Tensor, torch.Tensor] | None = None) -> "DispatchPlan":
        """The plan for `layout`: "grouped" pads each expert's rows to GROUP_ALIGN (the buffer's size depends on the
        shapes only: N k + E * 15 rows at most); "looped" (and expert parallelism) packs them exactly; "padded"
        gives every expert `capacity` rows. `counters` (tokens per expert, dropped assignments) are added to by the
        same kernel (the dropped one only where a capacity can drop)."""
        align, group_rows = {"grouped": (GROUP_ALIGN, 0), "padded": (1, capacity)}.get(layout, (1, 0))
        rows = plan_rows(experts.numel(), n_experts, capacity, align, group_rows)
        counts_into, dropped_into = counters if counters is not None else (None, None)
        return DispatchPlan(*moe_plan(experts, n_experts, capacity, rows, align, group_rows, counts_into,
                                      dropped_into if can_drop else None), capacity, can_drop)


def grouped_swiglu(x_PD: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor, ends_E: torch.Tensor) -> torch.Tensor:
    """Each expert's SwiGLU on its group of rows: three `torch._grouped_mm` calls and one SwiGLU kernel."""
    return grouped_mm(swiglu(grouped_mm(x_PD, w1.mT, ends_E), grouped_mm(x_PD, w3.mT, ends_E)), w2.mT, ends_E)


def stacked_swiglu(stack_ECD: torch.Tensor, w1_EFD: torch.Tensor, w2_EDF: torch.Tensor, w3_EFD: torch.Tensor) -> torch.Tensor:
    """Each expert's SwiGLU on its rows of an (E, C, D) stack: three batched matmuls."""
    return torch.bmm(swiglu(torch.bmm(stack_ECD, w1_EFD.mT), torch.bmm(stack_ECD, w3_EFD.mT)), w2_EDF.mT)


def expert_swiglu(layout: str, x_PD: torch.Tensor, plan: DispatchPlan, w1: torch.Tensor, w2: torch.Tensor,
                  w3: torch.Tensor) -> torch.Tensor:
    """Each buffer row's expert output, one row per row of `x_PD` (laid out by `DispatchPlan.of(..., layout)`).

    grouped: `torch._grouped_mm` over the padded groups; ~N k rows of work.
    looped: one matmul chain per expert over its exact segment; the segment sizes are read to the host
        (one read of E counts: where torch has no native grouped matmul on this device).
    padded: an (E, C, D) stack, C = the capacity (N without one): E / k times the work; the reference.
    """
    E, D = w1.shape[0], x_PD.shape[1]
    if layout == "padded":
        return stacked_swiglu(x_PD.view(E, -1, D), w1, w2, w3).reshape(x_PD.shape[0], w2.shape[1])
    if layout == "looped":
        kept_E = plan.kept_E.tolist()  # the one host read of this layout
        outputs = [F.linear(F.silu(F.linear(rows, w1[e])) * F.linear(rows, w3[e]), w2[e])
                   for e, rows in enumerate(x_PD[:sum(kept_E)].split(kept_E))]
        return torch.cat(outputs + [x_PD.new_zeros(x_PD.shape[0] - sum(kept_E), w2.shape[1])])
    return grouped_swiglu(x_PD, w1, w2, w3, plan.ends_E)


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
        # Expert parallelism: (x_PD, plan, (w1, w2, w3), dtype, layout) -> y_PD, the rows sent to the ranks holding
        # their experts and back; None = every expert is here. Set by hymo_core.distributed.expert_parallel.
        self.dispatch: Callable[..., torch.Tensor] | None = None

    def resolved_layout(self, x: torch.Tensor) -> str:
        return resolve_layout(self.layout, x)

    def forward(self, x_PD: torch.Tensor, plan: DispatchPlan, layout: str) -> torch.Tensor:
        """`x_PD`: the buffer `hymo::moe_permute` filled after `plan` (in the matmuls' dtype); one output row per row."""
        if self.dispatch is not None:
            return self.dispatch(x_PD, plan, (self.w1.weight, self.w2.weight, self.w3.weight), x_PD.dtype, layout)
        w1, w2, w3 = (w.weight.to(x_PD.dtype) for w in (self.w1, self.w2, self.w3))
        return expert_swiglu(layout, x_PD, plan, w1, w2, w3)


class SharedExpert(nn.Module):
    """The always-on SwiGLU (n_shared experts fused into one of n_shared x the width)."""

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(d_model, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d_model, bias=False)
        self.w3 = nn.Linear(d_model, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # As the dense FeedForward: one matmul for both input projections, SwiGLU on the packed output.
        return self.w2(swiglu(F.linear(x, torch.cat((self.w1.weight, self.w3.weight)))))


@dataclass
class Routing:
    experts_NK: torch.Tensor  # chosen experts per token (bias used here)
    weights_NK: torch.Tensor  # their combine weights (no bias)
    logits_NE: torch.Tensor  # the router's output
    sigmoid: bool

    def scores(self) -> torch.Tensor:
        """The unbiased affinities (fp32), recomputed from the logits: only the sequence aux loss reads them."""
        return route_scores(self.logits_NE, self.sigmoid)


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
        """The router's matmul (`gate`, in the matmuls' dtype), top-k of the biased scores, combine weights from the
        unbiased ones: one fused op (`hymo::moe_route`).

        The bias only decides *which* experts. DeepSeek-V3 normalises the chosen sigmoid scores; with one expert
        that would be the constant 1 and the router would get no gradient, so top-1 keeps the raw score.
        """
        sigmoid = self.config.score_function == "sigmoid"
        K = self.config.n_activated_experts
        weights_NK, experts_NK, logits_NE = moe_route(x_ND, self.gate.weight, self.expert_bias_E, K, sigmoid,
                                                      sigmoid and K > 1, self.config.route_scale, compute_dtype(x_ND))
        return Routing(experts_NK, weights_NK, logits_NE, sigmoid)

    def capacity(self, n_tokens: int) -> int:
        """Most assignments one expert keeps per forward: ceil(cf * N * k / E) with a capacity factor,
        else N (a token picks k distinct experts, so no expert receives more than N)."""
        if self.config.capacity_factor <= 0:
            return n_tokens
        assignments = n_tokens * self.config.n_activated_experts
        return min(n_tokens, math.ceil(self.config.capacity_factor * assignments / self.config.n_routed_experts))

    def plan(self, routing: Routing, layout: str) -> DispatchPlan:
        """The buffer rows of this routing for `layout`; under expert parallelism the kept rows travel packed, with
        no padding on the wire."""
        N = routing.experts_NK.shape[0]
        capacity = self.capacity(N)
        return DispatchPlan.of(routing.experts_NK, self.config.n_routed_experts, capacity,
                               "looped" if self.experts.dispatch else layout, can_drop=capacity < N,
                               counters=(self.tokens_per_expert_E, self.dropped_assignments) if self.training else None)

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        """Route, plan, permute, experts, combine (+ the shared expert inside the combine): a handful of kernels."""
        B, T, D = x_BTD.shape
        N = B * T
        x_ND = x_BTD.reshape(N, D)
        routing = self.route(x_ND)
        K = self.config.n_activated_experts
        layout = self.experts.resolved_layout(x_ND)
        plan = self.plan(routing, layout)
        # The shared expert reads x through the permute's fan-out: x's gradient from both is one kernel.
        rows_PD, *x_shared = moe_permute_fanout(x_ND, plan.source_P, plan.position_A, K, compute_dtype(x_ND),
                                                readers=int(self.shared_expert is not None))
        y_PD = self.experts(rows_PD, plan, layout)
        shared_ND = self.shared_expert(x_shared[0]) if self.shared_expert is not None else None
        # Each token's k rows weighted by the gates and summed in token order (no atomic scatter-add, so a
        # resumed run's bits do not depend on the device's thread schedule), the shared expert added.
        out_ND = moe_combine(y_PD, plan.source_P, plan.position_A, routing.weights_NK, shared_ND,
                             x_ND.dtype if shared_ND is None else float_promotion(x_ND.dtype, shared_ND.dtype))
        if self.training:  # the plan kernel has added this forward's counts to the balancing counters
            self.aux_loss = self._sequence_aux_loss(routing, B, T) if self.config.aux_loss_weight > 0 else None
        return out_ND.reshape(B, T, D)

    def _sequence_aux_loss(self, routing: Routing, B: int, T: int) -> torch.Tensor:
        """DeepSeek-V3's sequence-wise balance loss: alpha * sum_i f_i P_i, averaged over sequences."""
        E, K = self.config.n_routed_experts, self.config.n_activated_experts
        scores_NE = routing.scores()
        chosen_BTE = torch.zeros(B * T, E, device=scores_NE.device).scatter_(1, routing.experts_NK, 1.0).view(B, T, E)
        f_BE = chosen_BTE.sum(dim=1) * E / (K * T)
        normalised_BTE = (scores_NE / scores_NE.sum(dim=-1, keepdim=True)).view(B, T, E)
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
