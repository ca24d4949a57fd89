"""What one Muon / NorMuon update costs per rank: Newton-Schulz FLOPs, bytes moved, collectives.

Two schemes for matrices whose rows are sharded over W ranks (FSDP2's Shard(0)):

- "gather": every rank all-gathers every matrix (fp32) and orthogonalises all of
  them, then keeps its rows; NorMuon adds one scalar all-reduce per matrix for
  the norms;
- "owned" (hymo_core.train.owned_newton_schulz): same-shape matrices are dealt out to
  owner ranks, one all-to-all per shape brings each whole to its owner (in the
  Newton-Schulz dtype), the owner orthogonalises it, one all-to-all takes the
  rows back; NorMuon's norms are one all-reduce for all matrices.

Pure Python, like the planner: the sharding and ownership rules here are the
ones the optimizer runs (it imports `row_counts` and `owners` from here).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hymo_core.planner.planner import ModelShape, mtp_block_shape

SCHEMES = ("gather", "owned")


def mixer_matrix_shapes(shape: ModelShape, kind: str) -> list[tuple[int, int]]:
    """(out, in) of a token mixer's Muon / NorMuon weights, in the layer's parameter order (GDN's H x d gate
    projections a_proj / b_proj are AdamW's: hymo_core/train/partition.py)."""
    d, H = shape.d_model, shape.n_heads
    if kind == "A":
        kv = shape.n_kv_heads * shape.head_dim
        return [(d, d), (kv, d), (kv, d), (d, d)]  # q, k, v, o
    if kind == "G":
        key, value, heads = shape.gdn_heads * shape.gdn_key_head_dim, shape.gdn_heads * shape.gdn_value_head_dim, shape.gdn_heads
        return [(key, d), (key, d), (value, d), (value, d), (d, value)]  # q k v g o
    if kind == "M":
        qk = shape.mla_nope_dim + shape.mla_rope_dim
        return [(shape.mla_q_rank, d), (H * qk, shape.mla_q_rank), (shape.mla_kv_rank + shape.mla_rope_dim, d),
                (H * (shape.mla_nope_dim + shape.mla_v_dim), shape.mla_kv_rank), (d, H * shape.mla_v_dim)]
    raise ValueError(f"unknown mixer kind {kind!r}")


def block_matrix_shapes(shape: ModelShape, kind: str) -> list[tuple[int, int]]:
    """A block's Muon / NorMuon matrices: the mixer's and, when the FFN is dense, gate, up and down
    (MoE routers and experts stay on AdamW: hymo_core/train/partition.py)."""
    ffn = [] if kind in shape.moe_on else [(shape.ffn_dim, shape.d_model)] * 2 + [(shape.d_model, shape.ffn_dim)]
    return mixer_matrix_shapes(shape, kind) + ffn


def muon_matrix_shapes(shape: ModelShape) -> list[tuple[int, int]]:
    """Every Muon / NorMuon matrix of the model in parameter order: the blocks, then each MTP depth's
    [h; e] -> d projection and its block (of the last layer's kind; dense unless `mtp_moe`)."""
    kinds = shape.layer_kinds()
    shapes = [s for kind in kinds for s in block_matrix_shapes(shape, kind)]
    mtp = mtp_block_shape(shape)
    for _ in range(shape.mtp_depth):
        shapes += [(shape.d_model, 2 * shape.d_model)] + block_matrix_shapes(mtp, kinds[-1])
    return shapes


def row_counts(rows: int, ranks: int) -> list[int]:
    """Rows each rank holds under Shard(0): torch.chunk's split (ceil-sized chunks, empty ones at the end)."""
    chunk = -(-rows // ranks)
    return [max(0, min(chunk, rows - rank * chunk)) for rank in range(ranks)]


def owners(count: int, ranks: int, offset: int) -> list[int]:
    """Owner rank of each of `count` same-shape matrices; the offset runs on from the previous shape group."""
    return [(offset + index) % ranks for index in range(count)]


def newton_schulz_flops(rows: int, columns: int, steps: int = 5) -> int:
    """Quintic Newton-Schulz on the wide orientation (a <= b): per step A = XX^T, A@A, (bA + cA^2)@X."""
    a, b = sorted((rows, columns))
    return steps * (2 * a * a * b + 2 * a * a * a + 2 * a * a * b)


def shape_groups(shapes: Sequence[tuple[int, int]]) -> list[tuple[tuple[int, int], int]]:
    """(shape, how many) in first-seen order: the order the optimizer stacks them."""
    counts: dict[tuple[int, int], int] = {}
    for shape in shapes:
        counts[tuple(shape)] = counts.get(tuple(shape), 0) + 1
    return list(counts.items())


@dataclass(frozen=True)
class MuonUpdateCost:
    scheme: str
    ranks: int
    matrices: int
    parameters: int
    ns_flops: int  # on the busiest rank
    bytes_received: int  # on the busiest rank
    collectives: int  # per rank (every rank takes part in each)


def muon_update_cost(shapes: Sequence[tuple[int, int]], ranks: int, scheme: str, steps: int = 5, ns_bytes: int = 4,
                     norm_reductions: bool = True) -> MuonUpdateCost:
    """Per-rank cost of one update of these row-sharded matrices. `ns_bytes`: the Newton-Schulz dtype's
    size (the owned scheme sends rows in it; gather moves fp32). `norm_reductions`: NorMuon's norms."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    parameters = sum(a * b for a, b in shapes)
    if scheme == "gather":
        flops = sum(newton_schulz_flops(a, b, steps) for a, b in shapes)
        received = max(sum((a - row_counts(a, ranks)[rank]) * b * 4 for a, b in shapes) for rank in range(ranks))
        collectives = (len(shapes) * (2 if norm_reductions else 1)) if ranks > 1 else 0
        return MuonUpdateCost(scheme, ranks, len(shapes), parameters, flops, received, collectives)
    flops_per_rank, received_per_rank, offset = [0] * ranks, [0] * ranks, 0
    groups = shape_groups(shapes)
    for (a, b), count in groups:
        counts = row_counts(a, ranks)
        for owner in owners(count, ranks, offset):
            flops_per_rank[owner] += newton_schulz_flops(a, b, steps)
            for rank in range(ranks):
                if rank == owner:
                    received_per_rank[rank] += (a - counts[rank]) * b * ns_bytes  # the other ranks' rows
                else:
                    received_per_rank[rank] += counts[rank] * b * ns_bytes  # my rows of the result
        offset += count
    collectives = (2 * len(groups) + (1 if norm_reductions else 0)) if ranks > 1 else 0
    return MuonUpdateCost(scheme, ranks, len(shapes), parameters, max(flops_per_rank) if ranks > 1 else flops_per_rank[0],
                          max(received_per_rank), collectives)


def format_muon_costs(label: str, shapes: Sequence[tuple[int, int]], rank_counts: Sequence[int], steps: int = 5,
                      ns_bytes: int = 2) -> str:
    """The table `hymo plan model --preset NAME --muon-ranks 8,64` prints."""
    parameters = sum(a * b for a, b in shapes)
    lines = [f"Muon / NorMuon update of {label}: {len(shapes)} matrices, {parameters:,} parameters, "
             f"Newton-Schulz {steps} steps; owned scheme sends {ns_bytes}-byte rows",
             f"{'ranks':>6} {'scheme':>7} {'NS TFLOP/rank':>14} {'GB in/rank':>11} {'collectives':>12}"]
    for ranks in rank_counts:
        for scheme in SCHEMES:
            cost = muon_update_cost(shapes, ranks, scheme, steps, ns_bytes if scheme == "owned" else 4)
            lines.append(f"{ranks:>6} {scheme:>7} {cost.ns_flops / 1e12:>14.3f} {cost.bytes_received / 1e9:>11.3f} {cost.collectives:>12}")
    lines.append("gather: every rank all-gathers (fp32) and orthogonalises every matrix, one norm all-reduce per matrix; "
                 "owned: an all-to-all per shape there and back, each matrix orthogonalised once, one norm all-reduce.")
    return "\n".join(lines)
