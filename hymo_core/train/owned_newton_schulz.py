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

A matrix this rank holds whole (a plain tensor, FSDP2 on one process, a replicated DTensor) is
orthogonalised where it is, from its local tensor: no gather, no copy per matrix; any other
placement is gathered whole first.
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


def _start_gather(updates: list[torch.Tensor], layout: torch.Tensor, dtype: torch.dtype, offset: int) -> _Exchange:
    """Post the all-to-all that brings every matrix whole to its owner (`updates`: this rank's rows, `layout`'s split)."""
    dim = shard_dimension(layout)
    mesh = layout.device_mesh
    group, ranks = mesh.get_group(dim), mesh.size(dim)
    rank = mesh.get_local_rank(dim)
    rows, columns = layout.shape
    exchange = _Exchange(updates, group, rank, ranks, row_counts(rows, ranks), owners(len(updates), ranks, offset), columns)
    local = updates
    if local[0].shape[0] != exchange.counts[rank]:
        raise RuntimeError(f"rank {rank} holds {local[0].shape[0]} rows of a {rows}-row matrix; Shard(0) gives {exchange.counts[rank]}")
    by_owner = [i for owner in range(ranks) for i in exchange.owned_by(owner)]
    send = torch.stack([local[i] for i in by_owner]).reshape(-1).to(dtype)  # one copy and one cast for the group
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


def _finish(exchange: _Exchange) -> torch.Tensor:
    """This rank's rows of every result, stacked in the updates' order and dtype: (N, rows, B)."""
    exchange.handle.wait()
    ranks, rows = exchange.ranks, exchange.counts[exchange.rank]
    pieces = exchange.received.split([len(exchange.owned_by(o)) * rows * exchange.columns for o in range(ranks)])
    local: list[torch.Tensor | None] = [None] * len(exchange.updates)
    for owner, piece in enumerate(pieces):
        owned = exchange.owned_by(owner)
        for index, rows_CB in zip(owned, piece.view(len(owned), rows, exchange.columns).unbind(0)):
            local[index] = rows_CB
    return torch.stack(local).to(exchange.updates[0].dtype)  # type: ignore[arg-type]


def orthogonalise_groups(groups: Sequence[list[torch.Tensor]], layouts: Sequence[torch.Tensor], stack_function: StackFunction,
                         dtype: torch.dtype) -> list[torch.Tensor]:
    """Newton-Schulz (`stack_function` on a stack in `dtype`) of every matrix, each computed once over the ranks.

    `groups`: lists of same-shape updates, each this rank's rows as a plain tensor; `layouts[i]`: a tensor
    laid out as group i's matrices are (its parameter: a DTensor under FSDP2, else plain). Returns, per
    group, this rank's rows of the directions stacked (N, rows, B) in the updates' dtype: the optimizer
    goes on with one tensor per shape group, not one per matrix.
    """
    results: list[torch.Tensor | None] = [None] * len(groups)
    exchanges: list[tuple[int, _Exchange]] = []
    offset = 0
    for index, (updates, layout) in enumerate(zip(groups, layouts)):
        if shard_dimension(layout) is not None:
            exchanges.append((index, _start_gather(updates, layout, dtype, offset)))
            offset += len(updates)
    for index, (updates, layout) in enumerate(zip(groups, layouts)):  # while the exchanges travel: what needs none
        if results[index] is None and shard_dimension(layout) is None:
            results[index] = _orthogonalise_in_place(updates, layout, stack_function, dtype)
    for _, exchange in exchanges:
        _orthogonalise_owned(exchange, stack_function)
    for index, exchange in exchanges:
        results[index] = _finish(exchange)
    return results  # type: ignore[return-value]


def holds_whole(layout: torch.Tensor) -> bool:
    """True when this rank's local tensor is the whole matrix: a plain tensor, or a DTensor split only over
    mesh dimensions of one rank (FSDP2 on one process) or replicated."""
    if DTensor is None or not isinstance(layout, DTensor):
        return True
    mesh = layout.device_mesh
    return all(p.is_replicate() or mesh.size(dim) == 1 for dim, p in enumerate(layout.placements))


def _orthogonalise_in_place(updates: list[torch.Tensor], layout: torch.Tensor, stack_function: StackFunction,
                            dtype: torch.dtype) -> torch.Tensor:
    """Whole local matrices as they are, one stack; other layouts gathered whole (every rank computes)."""
    if holds_whole(layout):
        return stack_function(torch.stack(updates).to(dtype)).to(updates[0].dtype)
    mesh, placements = layout.device_mesh, layout.placements
    whole = [DTensor.from_local(u, mesh, placements, run_check=False, shape=layout.shape, stride=layout.stride()).full_tensor()
             for u in updates]
    directions = stack_function(torch.stack(whole).to(dtype)).to(updates[0].dtype).unbind(0)
    return torch.stack([distribute_tensor(d, mesh, placements, src_data_rank=None).to_local() for d in directions])


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
