"""Newton-Schulz of row-sharded matrices, each matrix orthogonalised once, by the rank that owns it.

FSDP2 keeps every 2-D parameter (and so its momentum) as row shards: rank r of
the W ranks of the shard dimension holds rows `chunk(A, W)[r]`. Newton-Schulz
needs whole matrices. Gathering every matrix on every rank (the simple way)
repeats all of the work W times and moves (W - 1)/W of every matrix to every
rank. Here (the scheme of microsoft/dion and torchtitan's Muon experiments):

1. matrices of one shape form a group; matrix i of the group is owned by rank
   (offset + i) mod W, the offset running on across groups so small groups
   spread over the ranks too;
2. one all-to-all per group: every rank sends its rows of each matrix to the
   matrix's owner, so each owner holds its matrices whole;
3. the owner runs Newton-Schulz on its stack of whole matrices;
4. one all-to-all back: each rank receives its rows of every result.

Each matrix is orthogonalised once, and each rank sends and receives about
2 (W - 1)/W^2 of the group's bytes instead of (W - 1)/W. The rows travel in
the Newton-Schulz dtype: the iteration casts its input to that dtype first
and its result is cast back afterwards, so sending bf16 changes no number.
Groups are pipelined: every group's first all-to-all is started before any
Newton-Schulz runs, and a group's way back is started as soon as its
iteration is done, so communication overlaps with the other groups' compute.

A matrix that is not row-sharded (one process, or a replicated DTensor) is
orthogonalised where it is; any other placement is gathered whole first.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

try:
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor
except ImportError:  # pragma: no cover - torch built without distributed
    DTensor = None

from hymo_core.planner.muon import owners, row_counts  # torch-free: the planner counts with the same rules

StackFunction = Callable[[torch.Tensor], torch.Tensor]  # (N, A, B) -> (N, A, B), Newton-Schulz of each matrix


def shard_dimension(tensor: torch.Tensor) -> int | None:
    """The mesh dimension a DTensor's rows are split over, when that is its only split and has ranks to share; else None."""
    if DTensor is None or not isinstance(tensor, DTensor):
        return None
    shards = [dim for dim, placement in enumerate(tensor.placements) if isinstance(placement, Shard)]
    if len(shards) != 1 or tensor.placements[shards[0]].dim != 0 or tensor.device_mesh.size(shards[0]) == 1:
        return None
    return shards[0]


@dataclass
class _Exchange:
    """One shape group in flight: who owns what, the buffers, and the pending collective."""

    updates: list[torch.Tensor]
    group: dist.ProcessGroup
    rank: int
    ranks: int
    counts: list[int]  # rows per rank
    owners: list[int]  # owner rank of each matrix
    columns: int
    handle: dist.Work | None = None
    received: torch.Tensor | None = None

    def owned_by(self, owner: int) -> list[int]:
        return [i for i, o in enumerate(self.owners) if o == owner]


def _start_gather(updates: list[torch.Tensor], dtype: torch.dtype, offset: int) -> _Exchange:
    """Post the all-to-all that brings every matrix whole to its owner."""
    dim = shard_dimension(updates[0])
    mesh = updates[0].device_mesh
    group, ranks = mesh.get_group(dim), mesh.size(dim)
    rank = mesh.get_local_rank(dim)
    rows, columns = updates[0].shape
    exchange = _Exchange(updates, group, rank, ranks, row_counts(rows, ranks), owners(len(updates), ranks, offset), columns)
    local = [u.to_local() for u in updates]
    if local[0].shape[0] != exchange.counts[rank]:
        raise RuntimeError(f"rank {rank} holds {local[0].shape[0]} rows of a {rows}-row matrix; Shard(0) gives {exchange.counts[rank]}")
    send = torch.cat([local[i].reshape(-1).to(dtype) for owner in range(ranks) for i in exchange.owned_by(owner)]
                     or [local[0].new_empty(0, dtype=dtype)])
    send_sizes = [len(exchange.owned_by(owner)) * exchange.counts[rank] * columns for owner in range(ranks)]
    mine = len(exchange.owned_by(rank))
    receive_sizes = [mine * exchange.counts[source] * columns for source in range(ranks)]
    exchange.received = send.new_empty(sum(receive_sizes))
    exchange.handle = dist.all_to_all_single(exchange.received, send, receive_sizes, send_sizes, group=group, async_op=True)
    return exchange


def _orthogonalise_owned(exchange: _Exchange, stack_function: StackFunction) -> None:
    """Wait for the rows, run Newton-Schulz on the whole owned matrices, post the all-to-all back."""
    exchange.handle.wait()
    ranks, rank, columns = exchange.ranks, exchange.rank, exchange.columns
    mine = len(exchange.owned_by(rank))
    pieces = exchange.received.split([mine * exchange.counts[s] * columns for s in range(ranks)])
    if mine:
        whole_NAB = torch.cat([piece.view(mine, exchange.counts[s], columns) for s, piece in enumerate(pieces)], dim=1)
        result_NAB = stack_function(whole_NAB).to(exchange.received.dtype)
        send = torch.cat([rows_NCB.reshape(-1) for rows_NCB in result_NAB.split(exchange.counts, dim=1)])
    else:
        send = exchange.received.new_empty(0)
    receive_sizes = [len(exchange.owned_by(owner)) * exchange.counts[rank] * columns for owner in range(ranks)]
    exchange.received = send.new_empty(sum(receive_sizes))
    exchange.handle = dist.all_to_all_single(exchange.received, send, receive_sizes,
                                             [mine * exchange.counts[s] * columns for s in range(ranks)],
                                             group=exchange.group, async_op=True)


def _finish(exchange: _Exchange) -> list[torch.Tensor]:
    """This rank's rows of every result, as DTensors laid out like the updates."""
    exchange.handle.wait()
    ranks, rows = exchange.ranks, exchange.counts[exchange.rank]
    pieces = exchange.received.split([len(exchange.owned_by(o)) * rows * exchange.columns for o in range(ranks)])
    local: list[torch.Tensor | None] = [None] * len(exchange.updates)
    for owner, piece in enumerate(pieces):
        owned = exchange.owned_by(owner)
        for index, rows_CB in zip(owned, piece.view(len(owned), rows, exchange.columns).unbind(0)):
            local[index] = rows_CB
    return [DTensor.from_local(part.to(u.dtype), u.device_mesh, u.placements, run_check=False, shape=u.shape, stride=u.stride())
            for part, u in zip(local, exchange.updates)]


def orthogonalise_groups(groups: Sequence[list[torch.Tensor]], stack_function: StackFunction,
                         dtype: torch.dtype) -> list[list[torch.Tensor]]:
    """Newton-Schulz (`stack_function` on a stack in `dtype`) of every matrix, each computed once over the ranks.

    `groups`: lists of same-shape updates (plain tensors or DTensors). Returns the
    directions in the same nesting, each laid out like its update and in its dtype.
    """
    results: list[list[torch.Tensor] | None] = [None] * len(groups)
    exchanges: list[tuple[int, _Exchange]] = []
    offset = 0
    for index, updates in enumerate(groups):
        if shard_dimension(updates[0]) is not None:
            exchanges.append((index, _start_gather(updates, dtype, offset)))
            offset += len(updates)
    for index, updates in enumerate(groups):  # while the exchanges travel: what needs no communication
        if results[index] is None and shard_dimension(updates[0]) is None:
            results[index] = _orthogonalise_in_place(updates, stack_function, dtype)
    for _, exchange in exchanges:
        _orthogonalise_owned(exchange, stack_function)
    for index, exchange in exchanges:
        results[index] = _finish(exchange)
    return results  # type: ignore[return-value]


def _orthogonalise_in_place(updates: list[torch.Tensor], stack_function: StackFunction, dtype: torch.dtype) -> list[torch.Tensor]:
    """Plain tensors and replicated DTensors as they are; other layouts gathered whole (every rank computes)."""
    if DTensor is None or not isinstance(updates[0], DTensor):
        return [d.to(u.dtype) for d, u in zip(stack_function(torch.stack(updates).to(dtype)).unbind(0), updates)]
    whole = [u.full_tensor() for u in updates]
    directions = stack_function(torch.stack(whole).to(dtype)).unbind(0)
    return [distribute_tensor(d.to(u.dtype), u.device_mesh, u.placements, src_data_rank=None) for d, u in zip(directions, updates)]


def shard_group(tensor: torch.Tensor) -> dist.ProcessGroup | None:
    """The process group whose ranks hold the other rows of `tensor` (None: this rank holds them all)."""
    dim = shard_dimension(tensor)
    return None if dim is None else tensor.device_mesh.get_group(dim)


def local_part(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's rows of a DTensor (a view: in-place changes reach the DTensor), a plain tensor as it is."""
    return tensor.to_local() if DTensor is not None and isinstance(tensor, DTensor) else tensor


def sum_over_shards_(partial: torch.Tensor, group: "dist.ProcessGroup | None") -> torch.Tensor:
    """Per-rank partial sums summed over the shard group, in place (one collective for a whole vector)."""
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(partial, group=group)
    return partial


def rows_like(matrix: torch.Tensor) -> torch.Tensor:
    """Zeros with one entry per row of `matrix`, split over the ranks as its rows are (per-row optimizer state)."""
    if DTensor is None or not isinstance(matrix, DTensor):
        return matrix.new_zeros(matrix.shape[0])
    local = matrix.to_local()
    return DTensor.from_local(local.new_zeros(local.shape[0]), matrix.device_mesh, matrix.placements, run_check=False,
                              shape=torch.Size([matrix.shape[0]]), stride=(1,))
