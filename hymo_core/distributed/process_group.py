"""The process group a training run lives in, and the few collectives the loop needs.

Under `torchrun` (PyTorch's elastic launcher) every rank finds RANK, WORLD_SIZE
and LOCAL_RANK in its environment; `init_runtime` joins the group with gloo on
CPU and nccl on CUDA, and each rank drives `cuda:LOCAL_RANK`. Without those
variables the run is one plain process and every helper here is a no-op, so
the same trainer code serves both.

The global batch is a property of the recipe, not of the launch:
`batch_size x gradient_accumulation_steps` windows per update on one process.
With W ranks each rank reads G / W of them per update, as micro-batches of
`batch_size` (or of G / W when that is smaller) and as many accumulation
steps as that takes. FSDP averages gradients over ranks, the loop divides
each micro-batch loss by its accumulation steps: the update is the mean over
the same G windows either way, only the summation order differs.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hymo_core.train.config import TrainConfig

LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


@dataclass(frozen=True)
class Runtime:
    """Where this process sits: its rank, the world size, its device, and whether a process group exists."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    launched: bool = False  # under torchrun (a process group exists), even with one rank

    @property
    def is_writer(self) -> bool:
        """Rank 0 writes the shared files (metrics, index, summary, checkpoint metadata)."""
        return self.rank == 0

    def batch_plan(self, config: TrainConfig) -> tuple[int, int]:
        """(micro-batch per rank, accumulation steps) so every update reads the recipe's global batch."""
        windows = config.batch_size * config.gradient_accumulation_steps
        if windows % self.world_size:
            raise ValueError(f"global batch {config.batch_size} x {config.gradient_accumulation_steps} = {windows} windows "
                             f"does not split over {self.world_size} ranks")
        per_rank = windows // self.world_size
        micro = config.batch_size if per_rank % config.batch_size == 0 else per_rank
        if per_rank % micro:
            raise ValueError(f"{per_rank} windows per rank is not a multiple of batch_size {config.batch_size}")
        return micro, per_rank // micro


def launched_by_torchrun() -> bool:
    return all(name in os.environ for name in LAUNCH_VARIABLES)


def backend_for(device_type: str) -> str:
    """nccl between GPUs, gloo between CPU processes."""
    return "nccl" if device_type == "cuda" else "gloo"


def init_runtime(device: torch.device | None = None) -> Runtime:
    """Join torchrun's process group (once), or describe the single plain process."""
    if not launched_by_torchrun():
        return Runtime(device=device or torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    rank, world_size, local_rank = (int(os.environ[name]) for name in LAUNCH_VARIABLES)
    if device is None:
        device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend_for(device.type), device_id=device if device.type == "cuda" else None)
    return Runtime(rank=rank, world_size=world_size, local_rank=local_rank, device=device, launched=True)


def close_runtime(runtime: Runtime) -> None:
    if runtime.launched and dist.is_initialized():
        dist.destroy_process_group()


def group_active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce_mean(value: float, device: torch.device) -> float:
    """The mean of a per-rank number over ranks (the loss of the whole global batch); plain float on one process."""
    if not group_active():
        return value
    total = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(total)
    return float(total) / dist.get_world_size()


def all_reduce_max_(tensor: torch.Tensor) -> torch.Tensor:
    """Elementwise max over ranks, in place (QK-Clip must rescale the same heads on every rank)."""
    if group_active():
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor


def all_reduce_sum_(tensor: torch.Tensor) -> torch.Tensor:
    """Elementwise sum over ranks, in place."""
    if group_active():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def reduce_expert_load_(tokens_per_expert_E: torch.Tensor) -> torch.Tensor:
    """Tokens routed to each expert, summed over ranks in place, before the gate-bias sign update.

    Every rank must see the global load or the ranks' gate biases drift apart
    (each would balance only its own slice of the batch). MoE's
    after-optimizer-step hook calls this on its per-expert counter.
    """
    return all_reduce_sum_(tokens_per_expert_E)


def all_gather_objects(value: object) -> list[object]:
    """Every rank's value, in rank order (loader cursors, RNG states, file digests for checkpoint metadata)."""
    if not group_active():
        return [value]
    gathered: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def broadcast_object(value: object, source: int = 0) -> object:
    """Rank `source`'s value on every rank (a check one rank made for all); the value itself on one process."""
    if not group_active():
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=source)
    return holder[0]


def any_rank(flag: bool, device: torch.device) -> bool:
    """True when the flag is set on at least one rank (so every rank takes the same branch)."""
    if not group_active():
        return flag
    value = torch.tensor([int(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value)


def barrier() -> None:
    if group_active():
        dist.barrier()


def full_value(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's global value (e.g. the gradient norm FSDP computes per shard); other tensors unchanged."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _by_mesh(grads: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Gradients grouped by device mesh (plain tensors form one group), in first-seen order."""
    groups: dict[int, list[torch.Tensor]] = {}
    for grad in grads:
        groups.setdefault(id(getattr(grad, "device_mesh", None)), []).append(grad)
    return list(groups.values())


def total_grad_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm over all these gradients as a plain device tensor, also when they live on several meshes
    (expert-parallel experts beside FSDP shards), which torch cannot stack: each mesh's norm is completed first."""
    norms = [full_value(torch.nn.utils.get_total_norm(group)) for group in _by_mesh(grads)]
    return norms[0] if len(norms) == 1 else torch.linalg.vector_norm(torch.stack(norms))


@torch.no_grad()
def clip_grad_norm_(parameters, max_norm: float, error_if_nonfinite: bool = False) -> torch.Tensor:
    """torch's global-norm clip; returns the norm before clipping, as a plain tensor (no host read).

    On one mesh (or none) it is torch's own call; over several, `total_grad_norm`, then every local shard scaled.
    """
    params = [p for p in parameters if p.grad is not None]
    grads = [p.grad for p in params]
    if len(_by_mesh(grads)) <= 1:
        return full_value(torch.nn.utils.clip_grad_norm_(params, max_norm, error_if_nonfinite=error_if_nonfinite))
    total = total_grad_norm(grads)
    if error_if_nonfinite and not torch.isfinite(total):  # a host read, only where the caller asks for one
        raise RuntimeError(f"the total norm of gradients is non-finite ({float(total)})")
    coefficient = (max_norm / (total + 1e-6)).clamp(max=1.0)
    torch._foreach_mul_([g.to_local() if hasattr(g, "to_local") else g for g in grads], coefficient)
    return total
