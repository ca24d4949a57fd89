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

A MoE forward under EP (torchtitan's MoE design, with fixed-size buffers):
1. every rank routes its own tokens: router, gate bias, top-k, capacity drops and load counts are
   the layer's own code (hymo_core/models/layers/moe.py), unchanged;
2. its assignments sit in the padded (E, C, D) stack; C (rows per expert) depends on the shapes only,
   so the block of experts owned by group rank p is a fixed slice: one all-to-all with equal split
   sizes sends each block to its owner. No routing figure is read back to the host;
3. each rank runs its E / P experts over the P * C rows it received (one batched SwiGLU);
4. the same all-to-all in reverse brings the outputs home; the layer un-sorts and combines them.

The price of fixed splits is padding: E * C * D values travel where N * k * D are real. With a
capacity factor cf, C = cf * N * k / E and the padding is cf; without one, C = N and it is E / k
(the planner reports the bytes). Gradients: all_to_all's backward returns each expert's gradient
from every rank of the group, summed; it is scaled by 1 / P in the backward, and FSDP's mean over the
W / P groups makes it FSDP's mean over all W ranks.

Every rank of a group must run the same forwards with the same C: training micro-batches have one
shape by construction; in evaluation (shapes may differ, e.g. cloze continuations) the group agrees
on the largest C first, one small all-reduce and host read per MoE layer per forward, outside the
training step.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

from hymo_core.distributed.process_group import Runtime
from hymo_core.models.layers.moe import MoE, stacked_swiglu
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


def _all_to_all(blocks_PXD: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Block p goes to group rank p; block s of the result came from group rank s. Equal splits, autograd."""
    from torch.distributed.nn.functional import all_to_all_single

    return all_to_all_single(torch.empty_like(blocks_PXD), blocks_PXD.contiguous(), group=group)


@dataclass
class ExpertDispatch:
    """`RoutedExperts.dispatch` under EP: (E, C, D) stack in, its experts' outputs back, same layout."""

    group: dist.ProcessGroup  # the P ranks of this rank's expert group
    ranks: int  # P

    def agreed_rows(self, rows: int, device: torch.device) -> int:
        """The largest C in the group (evaluation only: a host read)."""
        value = torch.tensor([rows], device=device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self.group)
        return int(value.item())

    def __call__(self, stack_ECD: torch.Tensor, weights: tuple[torch.Tensor, ...], dtype: torch.dtype,
                 training: bool) -> torch.Tensor:
        E, C, D = stack_ECD.shape
        P, local = self.ranks, E // self.ranks
        rows = C if training else self.agreed_rows(C, stack_ECD.device)
        if rows > C:
            stack_ECD = torch.cat((stack_ECD, stack_ECD.new_zeros(E, rows - C, D)), dim=1)
        received_PLRD = _all_to_all(stack_ECD.reshape(P, local * rows, D), self.group).view(P, local, rows, D)
        mine_LXD = received_PLRD.permute(1, 0, 2, 3).reshape(local, P * rows, D)  # each local expert: every source's rows
        w1, w2, w3 = (_ScaleGradient.apply(w.to_local(), 1.0 / P).to(dtype) for w in weights)
        out_LXD = stacked_swiglu(mine_LXD, w1, w2, w3)
        back_PLRD = out_LXD.view(local, P, rows, D).permute(1, 0, 2, 3)
        returned_ERD = _all_to_all(back_PLRD.reshape(P, local * rows, D), self.group).view(E, rows, D)
        return returned_ERD[:, :C]


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
