"""Expert parallelism: the routed experts split over an `expert` mesh dimension, tokens moved by all-to-all.

`[parallel] expert = P` lays the W ranks out as a (W / P, P) mesh named ("expert_data", "expert"):
rank r belongs to expert group r // P (P consecutive ranks, e.g. the GPUs of a node) and holds the
E / P experts of chunk r mod P. Each expert weight is a DTensor sharded along the expert dimension
over "expert" (Shard(0)); with more than one group, FSDP2 shards it further over "expert_data"
(Shard(1): torchtitan's "dp_shard_mod_ep"), so a rank keeps 1 / W of the experts' state, all-gathers
its E / P experts per block over the W / P groups and reduce-scatters their gradients. With one group
(P = W) FSDP leaves the experts alone (`ignored_params`). Everything else (attention, router, shared
expert, embeddings) is FSDP / HSDP-sharded as before. DCP sees the global (E, out, in) tensor, so a
checkpoint written under EP loads without it and the other way round.

A MoE forward under EP (torchtitan's design: dropless, variable splits):
1. every rank routes its own tokens: router, gate bias, top-k, capacity drops and load counts are
   the layer's own code (hymo_core/models/layers/moe.py), unchanged; its kept assignments are sorted
   by expert, so the rows bound for group rank p (experts p * E / P ..) are one contiguous block;
2. one all-to-all of the E per-expert counts tells each rank how many rows every source sends to
   each of its experts; those counts and its own are read to the host together: one small D2H read
   per MoE layer and forward (E + E integers), the price of sending no padding. It is the one host
   sync of an EP training step (evaluation and activation-checkpoint recomputation pay it again);
3. the rows travel by all-to-all with those split sizes; each rank runs its E / P experts over
   what it received, grouped by expert (the layer's grouped / looped layout, ~N k rows of work);
4. the same all-to-all in reverse brings the outputs home; the layer un-sorts and combines them.

Nothing is padded on the wire: the N k kept rows travel (a capacity factor only drops). Gradients:
all_to_all's backward returns each expert's gradient from every rank of the group, summed; it is
scaled by 1 / P in the backward, and FSDP's mean over the W / P groups makes it FSDP's mean over all
W ranks. Ranks may send different row counts, so evaluation batches of different shapes need no
agreement step.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

from hymo_core.distributed.process_group import Runtime
from hymo_core.kernels.moe_dispatch import moe_permute
from hymo_core.models.layers.moe import DispatchPlan, MoE, expert_swiglu
from hymo_core.train.config import TrainConfig

EXPERT_MESH_DIMS = ("expert_data", "expert")


class _ScaleGradient(torch.autograd.Function):
    """Identity forward; the backward multiplies the gradient by `scale`."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.scale, None


def _all_to_all(rows_XD: torch.Tensor, send: list[int], receive: list[int], group: dist.ProcessGroup) -> torch.Tensor:
    """Rows send[p] (in order) go to group rank p; the result holds receive[s] rows from each rank s. Autograd."""
    from torch.distributed.nn.functional import all_to_all_single

    out = rows_XD.new_empty(sum(receive), rows_XD.shape[1])
    return all_to_all_single(out, rows_XD.contiguous(), output_split_sizes=receive, input_split_sizes=send, group=group)


@dataclass
class ExpertDispatch:
    """`RoutedExperts.dispatch` under EP: expert-sorted rows in, their experts' outputs back, same order."""

    group: dist.ProcessGroup  # the P ranks of this rank's expert group
    ranks: int  # P

    def exchange_counts(self, kept_E: torch.Tensor) -> tuple[list[int], list[int], torch.Tensor]:
        """Rows this rank sends to each expert, and rows each source sends to each local expert (source-major),
        on the host, the latter on the device too: one all-to-all of the counts and one host read of both."""
        received_SL = torch.empty_like(kept_E)
        dist.all_to_all_single(received_SL, kept_E.contiguous(), group=self.group)
        figures = torch.cat((kept_E, received_SL)).tolist()  # the documented host read of an EP forward
        return figures[:kept_E.numel()], figures[kept_E.numel():], received_SL

    def __call__(self, x_PD: torch.Tensor, plan: DispatchPlan, weights: tuple[torch.Tensor, ...],
                 dtype: torch.dtype, layout: str) -> torch.Tensor:
        """`x_PD`: the kept rows packed in expert order (the "looped" plan), then padding; returns their outputs."""
        E, D = plan.counts_E.numel(), x_PD.shape[1]
        P, L = self.ranks, E // self.ranks
        sent_E, received_SL, received_device_SL = self.exchange_counts(plan.kept_E)
        send = [sum(sent_E[p * L:(p + 1) * L]) for p in range(P)]
        receive = [sum(received_SL[s * L:(s + 1) * L]) for s in range(P)]
        kept = sum(sent_E)
        received_RD = _all_to_all(x_PD[:kept], send, receive, self.group)
        # Received rows come source-major (s, local expert l); each l's rows from every source form its group.
        R = received_RD.shape[0]
        segment_ends = torch.cumsum(received_device_SL, 0)
        local_expert_R = torch.searchsorted(segment_ends, torch.arange(R, device=x_PD.device), right=True) % L
        local = DispatchPlan.of(local_expert_R, L, max(R, 1), layout, can_drop=False)
        w1, w2, w3 = (_ScaleGradient.apply(w.to_local(), 1.0 / P).to(dtype) for w in weights)
        y_QD = expert_swiglu(layout, moe_permute(received_RD, local.source_P, local.position_A, 1, dtype), local, w1, w2, w3)
        y_RD = y_QD[local.position_A.long()]  # back to the order the rows arrived in
        returned_KD = _all_to_all(y_RD, receive, send, self.group)
        return torch.cat((returned_KD, returned_KD.new_zeros(x_PD.shape[0] - kept, D)))


def moe_layers(model: nn.Module) -> list[MoE]:
    return [module for module in model.modules() if isinstance(module, MoE)]


@dataclass
class ExpertSharding:
    """What FSDP must know after `apply_expert_parallel`: the experts to leave alone (one group), or the
    modules to shard over the groups and the mesh to shard them on."""

    ignored: set[nn.Parameter]
    modules: list[nn.Module]
    mesh: object | None  # the "expert_data" DeviceMesh when W / P > 1


EXPERT_FSDP_DIM = 1  # experts are already split on dim 0; FSDP splits each one's rows (torchtitan's choice too)


def apply_expert_parallel(model: nn.Module, runtime: Runtime, config: TrainConfig) -> ExpertSharding:
    """Split every MoE layer's routed experts over the `expert` mesh dimension; nothing changes with
    `expert = 1` or a model without MoE. Works on a meta-device model (no communication: each rank
    keeps its slice).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    groups, P = config.expert_mesh_shape(runtime.world_size)
    layers = moe_layers(model)
    if P == 1 or not layers:
        return ExpertSharding(set(), [], None)
    for moe in layers:
        if moe.config.n_routed_experts % P:
            raise ValueError(f"[parallel] expert = {P} does not divide the {moe.config.n_routed_experts} routed experts")
    mesh = init_device_mesh(runtime.device.type, (groups, P), mesh_dim_names=EXPERT_MESH_DIMS)
    dispatch = ExpertDispatch(mesh.get_group("expert"), P)
    parameters: set[nn.Parameter] = set()
    for moe in layers:
        for stacked in (moe.experts.w1, moe.experts.w2, moe.experts.w3):
            weight = stacked.weight
            stacked.weight = nn.Parameter(distribute_tensor(weight.detach(), mesh["expert"], [Shard(0)], src_data_rank=None),
                                          requires_grad=weight.requires_grad)
            parameters.add(stacked.weight)
        moe.experts.dispatch = dispatch
    if groups == 1:
        return ExpertSharding(parameters, [], None)
    return ExpertSharding(set(), [moe.experts for moe in layers], mesh["expert_data"])
