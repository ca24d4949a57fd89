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

Experts run grouped: tokens are sorted by expert and each expert multiplies its contiguous slice
(no loop over tokens; one over experts, the CPU-friendly form of a grouped GEMM); outputs go back
to their (token, slot) rows and the k slots are summed, with no atomic scatter-add. With
`capacity_factor > 0` an expert takes at most ceil(cf * tokens * k / E) assignments per forward,
the rest are dropped (their combine weight is lost, the residual carries the token) and counted.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from hymo_core.models.configs import MoEConfig


class StackedWeight(nn.Module):
    """One (E, out, in) weight for E experts, so the parameter is named `experts.wN.weight`."""

    def __init__(self, n_experts: int, out_features: int, in_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_experts, out_features, in_features))


class RoutedExperts(nn.Module):
    """E SwiGLU experts, w1 (gate) / w3 (up) / w2 (down), computed over tokens sorted by expert."""

    def __init__(self, n_experts: int, d_model: int, expert_dim: int):
        super().__init__()
        self.w1 = StackedWeight(n_experts, expert_dim, d_model)
        self.w2 = StackedWeight(n_experts, d_model, expert_dim)
        self.w3 = StackedWeight(n_experts, expert_dim, d_model)

    def forward(self, x_SD: torch.Tensor, tokens_per_expert: list[int]) -> torch.Tensor:
        """`x_SD` holds each expert's tokens contiguously, in expert order, `tokens_per_expert[e]` of them."""
        outputs = []
        for expert, x_sD in enumerate(x_SD.split(tokens_per_expert)):
            if x_sD.shape[0] == 0:
                continue
            hidden = F.silu(x_sD @ self.w1.weight[expert].T) * (x_sD @ self.w3.weight[expert].T)
            outputs.append(hidden @ self.w2.weight[expert].T)
        return torch.cat(outputs) if outputs else x_SD.new_zeros(0, self.w2.weight.shape[1])


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
        self.last_update_stats: dict[str, float | list[float]] | None = None
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
    def init_extra_parameters(self) -> None:
        """The stacked input weights (the model's init walk only knows nn.Linear / nn.Embedding)."""
        nn.init.normal_(self.experts.w1.weight, std=self.init_std)
        nn.init.normal_(self.experts.w3.weight, std=self.init_std)

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

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        B, T, D = x_BTD.shape
        x_ND = x_BTD.reshape(B * T, D)
        routing = self.route(x_ND)
        E, K = self.config.n_routed_experts, self.config.n_activated_experts
        flat_experts = routing.experts_NK.reshape(-1)
        counts_E = torch.bincount(flat_experts, minlength=E)
        order = torch.argsort(flat_experts, stable=True)  # assignments grouped by expert, token order kept
        kept = self._within_capacity(counts_E, order.numel(), x_ND.device)
        if kept is not None:
            order = order[kept]
        token_of = order // K
        sorted_counts = torch.bincount(flat_experts[order], minlength=E)
        y_SD = self.experts(x_ND[token_of], sorted_counts.tolist())
        y_SD = y_SD * routing.weights_NK.reshape(-1)[order].unsqueeze(1).to(y_SD.dtype)
        # Un-sort into one row per (token, slot) and sum the k slots: no atomic scatter-add, so the
        # sum's order (and a resumed run's bits) does not depend on the device's thread schedule.
        slots_AD = x_ND.new_zeros(B * T * K, D).index_copy(0, order, y_SD.to(x_ND.dtype))
        out_ND = slots_AD.view(B * T, K, D).sum(dim=1)
        if self.shared_expert is not None:
            out_ND = out_ND + self.shared_expert(x_ND)
        if self.training:
            with torch.no_grad():
                self.tokens_per_expert_E += counts_E.to(torch.float64)
                self.dropped_assignments += flat_experts.numel() - order.numel()
            self.aux_loss = self._sequence_aux_loss(routing, B, T) if self.config.aux_loss_weight > 0 else None
        return out_ND.reshape(B, T, D)

    def _within_capacity(self, counts_E: torch.Tensor, n_assignments: int, device: torch.device) -> torch.Tensor | None:
        """Indices (into the expert-sorted assignments) each expert keeps under its capacity; None = keep all."""
        if self.config.capacity_factor <= 0:
            return None
        capacity = math.ceil(self.config.capacity_factor * n_assignments / self.config.n_routed_experts)
        starts_E = torch.cumsum(counts_E, 0) - counts_E
        expert_of_sorted = torch.repeat_interleave(torch.arange(counts_E.numel(), device=device), counts_E)
        rank_within_expert = torch.arange(n_assignments, device=device) - starts_E[expert_of_sorted]
        return torch.nonzero(rank_within_expert < capacity).squeeze(1)

    def _sequence_aux_loss(self, routing: Routing, B: int, T: int) -> torch.Tensor:
        """DeepSeek-V3's sequence-wise balance loss: alpha * sum_i f_i P_i, averaged over sequences."""
        E, K = self.config.n_routed_experts, self.config.n_activated_experts
        chosen_BTE = torch.zeros(B * T, E, device=routing.scores_NE.device).scatter_(1, routing.experts_NK, 1.0).view(B, T, E)
        f_BE = chosen_BTE.sum(dim=1) * E / (K * T)
        normalised_BTE = (routing.scores_NE / routing.scores_NE.sum(dim=-1, keepdim=True)).view(B, T, E)
        p_BE = normalised_BTE.mean(dim=1)
        return self.config.aux_loss_weight * (f_BE * p_BE).sum(dim=1).mean()

    @torch.no_grad()
    def apply_bias_update(self, tokens_per_expert_E: torch.Tensor, dropped: float) -> dict[str, float | list[float]]:
        """One optimizer update's balancing step from its (already reduced) counts; resets the counters."""
        E = self.config.n_routed_experts
        total = float(tokens_per_expert_E.sum())
        load_E = (tokens_per_expert_E / total if total > 0 else torch.full_like(tokens_per_expert_E, 1.0 / E)).float()
        decay = self.config.load_ema_decay
        self.load_ema_E.mul_(decay).add_(load_E, alpha=1.0 - decay)
        if self.config.bias_update and total > 0:
            self.expert_bias_E += self.config.bias_update_rate * torch.sign(self.load_ema_E.mean() - self.load_ema_E)
        self.tokens_per_expert_E.zero_()
        self.dropped_assignments.zero_()
        relative_E = load_E * E  # 1.0 = a perfectly even share
        self.last_update_stats = {
            "load_min": float(relative_E.min()), "load_max": float(relative_E.max()),
            "load_cv": float(relative_E.std(unbiased=False)), "bias_norm": float(self.expert_bias_E.norm()),
            "dropped_tokens": dropped, "load": [round(float(v), 4) for v in relative_E],
        }
        return self.last_update_stats

    @torch.no_grad()
    def discard_counts(self) -> None:
        """An attempted update that did not happen (fp16 overflow skip): its counts must not steer the bias."""
        self.tokens_per_expert_E.zero_()
        self.dropped_assignments.zero_()


Reduce = Callable[[torch.Tensor], torch.Tensor]


@torch.no_grad()
def moe_after_optimizer_step(named_moes: list[tuple[str, MoE]], reduce: Reduce | None = None) -> dict[str, dict]:
    """The once-per-update balancing step for every MoE layer; returns each layer's load figures.

    `reduce` sums a tensor over data-parallel ranks (e.g. `dist.all_reduce` in place, returned);
    all layers' counts travel in one tensor, so a data-parallel update costs one collective.
    """
    if not named_moes:
        return {}
    counts = torch.stack([torch.cat([moe.tokens_per_expert_E, moe.dropped_assignments.view(1)]) for _, moe in named_moes])
    if reduce is not None:
        counts = reduce(counts)
    return {name: moe.apply_bias_update(row[:-1], float(row[-1])) for (name, moe), row in zip(named_moes, counts)}
