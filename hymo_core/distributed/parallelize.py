"""Turn a built model into the one a run trains: activation checkpointing, compile, FSDP2, per block.

Generic over `model.layers`: whatever block kind sits in the stack (dense,
Gated DeltaNet, MLA, MoE) becomes its own unit, and the root unit holds what
is left (embeddings, final norm, head, MTP modules). Every switch keeps the
parameter names (no wrapper modules), so the optimizer's partition rules,
the checkpoints and the state dicts read the same with and without them.

- activation checkpointing (`torch.distributed._composable.checkpoint`):
  a block's activations are recomputed in the backward instead of stored;
- compile (`nn.Module.compile`, in place), over `compile_scope(config, runtime)`: the whole model as one
  graph (one process: Inductor fuses across blocks and into the fused head + loss, as nanoGPT and
  torchtitan users compile), or each block as its own graph (under torchrun, where FSDP2's per-block
  hooks sit between blocks, and with activation checkpointing): the repeated unit compiles once and
  graph breaks stay local;
- FSDP2 (`fully_shard`), from two ranks on (`wraps_in_fsdp`): parameters sharded along dim 0 across ranks,
  all-gathered per block in forward and backward, gradients reduce-scattered.
  With `[parallel] replicate = R, shard = S` the mesh is (R, S) and `fully_shard`
  over it is HSDP: each replica group of S ranks shards the model, the R groups
  hold the same shards and all-reduce their gradients (multi-node: S = ranks per
  node keeps the all-gathers on the node's links).
  With `[parallel] expert = P` the routed experts are split over groups of P
  ranks first (hymo_core/distributed/expert_parallel.py); FSDP shards them over
  the W / P groups on a mesh of their own, or leaves them out when P = W.
  Mixed precision: bf16 parameters in compute with fp32 gradient reduction on
  CUDA for a bf16 recipe; fp32 everywhere on CPU. The fp32 master shards are
  what the optimizer updates.

`build_parallel_model` is how a run gets its model (torchtitan's order): built on the
meta device (no storage), parallelised there, then materialised, so a rank allocates
and initialises only its own shards and never holds the whole fp32 model (at most one
init unit's full values, hymo_core/models/materialise.py). The values equal eager
`Transformer(config)` under the same seed, bit for bit, at any world size.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from hymo_core.models.configs import ModelConfig
from hymo_core.models.init import build_on_meta, materialise_
from hymo_core.train.config import TrainConfig
from hymo_core.distributed.expert_parallel import EXPERT_FSDP_DIM, ExpertSharding, apply_expert_parallel
from hymo_core.distributed.process_group import Runtime


def mixed_precision_policy(config: TrainConfig, device: torch.device):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if device.type == "cuda" and config.precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()  # fp32 parameters and reductions


def apply_activation_checkpointing(model: nn.Module) -> None:
    from torch.distributed._composable import checkpoint

    for block in model.layers:
        checkpoint(block)


COMPILE_BACKEND = "inductor"  # torch.compile's default: generated Triton (GPU) or C++ (CPU) kernels


def compile_scope(config: TrainConfig, runtime: Runtime) -> str:
    """"model" or "blocks": the config's choice, or for "auto" blocks under FSDP2 (two ranks or more) or
    activation checkpointing."""
    if config.compile_scope != "auto":
        return config.compile_scope
    return "blocks" if wraps_in_fsdp(runtime) or config.activation_checkpointing else "model"


def apply_compile(model: nn.Module, scope: str = "blocks") -> None:
    if scope == "model":
        model.compile(backend=COMPILE_BACKEND)
        return
    for block in model.layers:
        block.compile(backend=COMPILE_BACKEND)


def apply_fsdp(model: nn.Module, runtime: Runtime, config: TrainConfig, experts: ExpertSharding | None = None) -> nn.Module:
    """FSDP2 per block, then the root. Under expert parallelism (`experts`), the experts are first sharded
    over their own mesh (several expert groups) or left out (one group)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    replicate, shard = config.mesh_shape(runtime.world_size)
    if replicate == 1:
        mesh = init_device_mesh(runtime.device.type, (shard,), mesh_dim_names=("shard",))
    else:  # HSDP: fully_shard over a 2-D mesh shards over "shard" and replicates over "replicate"
        mesh = init_device_mesh(runtime.device.type, (replicate, shard), mesh_dim_names=("replicate", "shard"))
    policy = mixed_precision_policy(config, runtime.device)
    ignored = experts.ignored if experts is not None and experts.ignored else None
    if experts is not None and experts.mesh is not None:
        from torch.distributed.tensor import Shard

        for module in experts.modules:
            fully_shard(module, mesh=experts.mesh, mp_policy=policy, shard_placement_fn=lambda param: Shard(EXPERT_FSDP_DIM))
    last = len(model.layers) - 1
    for index, block in enumerate(model.layers):
        # The last block's parameters are needed again at once by the backward: keep them gathered.
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=index < last, ignored_params=ignored)
    fully_shard(model, mesh=mesh, mp_policy=policy, ignored_params=ignored)
    return model


def parallelize(model: nn.Module, runtime: Runtime, config: TrainConfig) -> nn.Module:
    """The order torchtitan uses: checkpoint, then compile, then shard (each wraps what came before)."""
    if config.activation_checkpointing:
        apply_activation_checkpointing(model)
    if config.compile:
        apply_compile(model, compile_scope(config, runtime))
    if wraps_in_fsdp(runtime):
        apply_fsdp(model, runtime, config, experts=apply_expert_parallel(model, runtime, config))
    return model


def wraps_in_fsdp(runtime: Runtime) -> bool:
    """FSDP2 only where there is something to shard: two ranks or more.

    One process on one device (also under torchrun) keeps the plain model: per-unit hooks, resharding after
    forward and the re-gather in backward buy nothing there (bench/launch_budget.py measures the cost on one
    gloo rank), and the optimizer steps plain tensors. Checkpoints are the same either way: a launched run
    still writes DCP (plain tensors save and load under DCP as shards of one), which any world size reads.
    """
    return runtime.launched and runtime.world_size > 1


def build_parallel_model(model_config: ModelConfig, runtime: Runtime, config: TrainConfig,
                         kernel_backend: str | None = None) -> nn.Module:
    """The run's model: on meta, then checkpointing / compile / sharding, then this rank's storage on its device.

    Draws the init seed from torch's global generator as eager construction does (seed it first).
    """
    model = parallelize(build_on_meta(model_config, kernel_backend), runtime, config)
    return materialise_(model, runtime.device)


def reshard(model: nn.Module) -> None:
    """Put every FSDP2 block back into its sharded state. A step left midway (an alert's stop between forward and
    backward) leaves the blocks gathered, and the summary's full-weight digest then reads plain tensors."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())
