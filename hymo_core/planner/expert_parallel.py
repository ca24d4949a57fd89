"""What expert parallelism costs per rank: model state held and bytes the all-to-all moves (torch-free).

The rules are those of hymo_core/distributed/expert_parallel.py: with W ranks and `expert = P`,
every weight but the routed experts is FSDP-sharded over W; the routed experts are split over the P
ranks of an expert group and FSDP-sharded over the W / P groups, so a rank keeps 1 / W of them at
any P. Each MoE forward sends every kept assignment's row (dropless: N k rows, N tokens per
micro-batch; a capacity factor cf keeps at most E x C, C = ceil(cf * N * k / E)) to its expert's rank
with variable split sizes, no padding: with balanced routing a rank sends (P - 1) / P of its rows out
and as much back (dispatch, combine), and the backward repeats both. Against that, EP moves fewer expert
weights: FSDP over W all-gathers every expert (forward and backward) and reduce-scatters its gradient
on every micro-batch; under EP a rank does that only for its E / P experts, over the W / P groups
(nothing at P = W).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from hymo_core.planner.planner import GRAD_BYTES, OPTIMIZER_BYTES, WEIGHT_BYTES, ModelShape, count_parameters, mtp_block_shape

STATE_BYTES = WEIGHT_BYTES + GRAD_BYTES + OPTIMIZER_BYTES  # per parameter, mixed precision + Adam-sized state


def moe_layer_count(shape: ModelShape) -> int:
    """Layers with a routed-expert FFN: trunk layers of a `moe_on` kind, and MTP blocks when `mtp_moe`."""
    kinds = shape.layer_kinds()
    trunk = sum(kind in shape.moe_on for kind in kinds)
    mtp = shape.mtp_depth if kinds[-1] in mtp_block_shape(shape).moe_on else 0
    return trunk + mtp


def routed_expert_parameters(shape: ModelShape) -> int:
    """Parameters of every routed expert (w1, w2, w3 of each), over all MoE layers."""
    return moe_layer_count(shape) * shape.moe_routed_experts * 3 * shape.d_model * shape.moe_expert_dim


def rows_per_expert(tokens: int, shape: ModelShape, capacity_factor: float) -> int:
    """C, the most assignments one expert keeps (hymo_core/models/layers/moe.py `MoE.capacity`)."""
    if capacity_factor <= 0:
        return tokens
    return min(tokens, math.ceil(capacity_factor * tokens * shape.moe_activated_experts / shape.moe_routed_experts))


@dataclass(frozen=True)
class ExpertParallelCost:
    ranks: int
    expert: int
    state_bytes: float  # per rank: FSDP-sharded non-experts + this rank's experts, weights + grads + optimizer
    expert_state_bytes: float  # the routed experts' part of it
    alltoall_bytes: float  # per rank per micro-batch, all MoE layers, forward + backward, sent (received alike)
    padding: float  # rows sent / real assignments (1: variable splits send no padding; < 1 when a capacity drops)
    expert_weight_bytes: float  # per rank per micro-batch: moving expert weights / gradients instead of tokens
    gathered_bytes: float  # per rank, held while one MoE block runs: its experts all-gathered by FSDP (bf16)


def expert_parallel_cost(shape: ModelShape, ranks: int, expert: int, tokens: int, capacity_factor: float = 0.0,
                         activation_bytes: int = 2) -> ExpertParallelCost:
    """Per-rank cost for W = `ranks`, P = `expert`, `tokens` = micro-batch x sequence length per rank."""
    if ranks % expert or (shape.moe_routed_experts and shape.moe_routed_experts % expert):
        raise ValueError(f"expert = {expert} must divide {ranks} ranks and {shape.moe_routed_experts} routed experts")
    routed = routed_expert_parameters(shape)
    rest = count_parameters(shape).total - routed
    experts = routed * STATE_BYTES / ranks  # E / P experts per rank, FSDP-sharded over the W / P groups
    assignments = tokens * max(shape.moe_activated_experts, 1)
    kept = min(assignments, shape.moe_routed_experts * rows_per_expert(tokens, shape, capacity_factor))
    rows_bytes = kept * shape.d_model * activation_bytes
    sent = 4 * rows_bytes * (expert - 1) / expert * moe_layer_count(shape)  # dispatch + combine, forward + backward
    # FSDP over the W / P groups of this rank's E / P experts: bf16 all-gather in forward and again in
    # backward, fp32 reduce-scatter of the gradients (P = 1: every expert over all W ranks; P = W: nothing).
    groups = ranks // expert
    weights = routed / expert * (2 * WEIGHT_BYTES + 4) * (groups - 1) / groups
    layers = max(moe_layer_count(shape), 1)
    gathered = routed / layers / expert * WEIGHT_BYTES if groups > 1 else 0.0  # P = W: nothing to gather
    return ExpertParallelCost(ranks, expert, rest * STATE_BYTES / ranks + experts, experts, sent,
                              kept / assignments if shape.moe_routed_experts else 0.0, weights,
                              gathered)


def expert_degrees(shape: ModelShape, ranks: int) -> list[int]:
    return [p for p in (1, 2, 4, 8, 16, 32, 64) if p <= ranks and ranks % p == 0 and shape.moe_routed_experts % p == 0]


def format_expert_parallel(label: str, shape: ModelShape, ranks: list[int], tokens: int,
                           capacity_factors: tuple[float, ...] = (0.0, 1.25)) -> str:
    """Markdown table: per rank, model state and bytes moved (per micro-batch, sent) for each `expert` degree."""
    lines = [f"Expert parallelism, {label}: {routed_expert_parameters(shape):,} routed-expert parameters in "
             f"{moe_layer_count(shape)} MoE layers; {tokens:,} tokens per rank per micro-batch, bf16 activations",
             "",
             "| ranks | expert | state GB/rank | of it experts | gathered experts per block GB | capacity factor "
             "| rows sent / assignments | token all-to-all MB | expert weights/grads MB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for world in ranks:
        for degree in expert_degrees(shape, world):
            for factor in capacity_factors:
                cost = expert_parallel_cost(shape, world, degree, tokens, factor)
                lines.append(f"| {world} | {degree} | {cost.state_bytes / 1e9:.2f} | {cost.expert_state_bytes / 1e9:.2f} | "
                             f"{cost.gathered_bytes / 1e9:.3f} | "
                             f"{factor or 'none'} | {cost.padding:.2f} | {cost.alltoall_bytes / 1e6:,.1f} | "
                             f"{cost.expert_weight_bytes / 1e6:,.1f} |")
    return "\n".join(lines)
