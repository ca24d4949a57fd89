"""Run by test_owned_muon.py under torchrun (2 or 3 gloo ranks): row-sharded Muon / NorMuon equal one process.

Every rank holds the same full weights and gradients; the sharded copy keeps only this
rank's rows (Shard(0), torch.chunk's uneven split, an empty shard included at 3 ranks), as
FSDP2 does. After a few steps each rank's rows must equal the one-process optimizer's. Each
rank also counts the matrices it orthogonalised: over all ranks every matrix exactly once.
Rank 0 writes the results as JSON to argv[1].
"""
from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

import hymo_core.train.optim as optim
from hymo_core.train.optim import MuonAdamW, NorMuonAdamW, NorMuonConfig, OptimizerConfig

# Rows 7 and 5 split unevenly over 2 and 3 ranks, 2 rows leave rank 2 empty; tall and wide shapes.
SHAPES = [(7, 12), (7, 12), (7, 12), (5, 9), (13, 4), (2, 6), (7, 12)]
NAMES = [f"layers.{i}.attn.q_proj.weight" for i in range(len(SHAPES))]


def counting(function, counter: list[int]):
    def counted(x, *args, **kwargs):
        counter[0] += x.shape[0] if x.ndim == 3 else 1
        return function(x, *args, **kwargs)
    return counted


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(s, generator=generator) for s in SHAPES]
    results = {}
    for label, build, config in (
        ("muon_adamw", MuonAdamW, OptimizerConfig(lr=0.05, ns_dtype="float32", cautious_weight_decay=True)),
        ("normuon", NorMuonAdamW, NorMuonConfig(lr=0.05, muon_lr=0.05, ns_dtype="float32")),
        ("normuon_momentum_norm", NorMuonAdamW, NorMuonConfig(lr=0.05, muon_lr=0.05, ns_dtype="float32",
                                                              update_scale="momentum_norm", row_normalisation=False)),
    ):
        plain = [nn.Parameter(w.clone()) for w in weights]
        sharded = [nn.Parameter(distribute_tensor(w.clone(), mesh, [Shard(0)], src_data_rank=None)) for w in weights]
        one, many = build(zip(NAMES, plain), config), build(zip(NAMES, sharded), config)
        counted = [0]
        for _ in range(3):
            grads = [torch.randn(s, generator=generator) for s in SHAPES]
            for p, s, g in zip(plain, sharded, grads):
                p.grad = g.clone()
                s.grad = distribute_tensor(g.clone(), mesh, [Shard(0)], src_data_rank=None)
            one.step()
            saved = optim.newton_schulz, optim.newton_schulz_batched
            optim.newton_schulz, optim.newton_schulz_batched = counting(saved[0], counted), counting(saved[1], counted)
            try:
                many.step()
            finally:
                optim.newton_schulz, optim.newton_schulz_batched = saved
        rows = [list(s.to_local().shape) for s in sharded]
        difference = max(float((s.to_local() - p.detach().chunk(world)[rank]).abs().max()) if s.to_local().numel() else 0.0
                         for s, p in zip(sharded, plain))
        gathered = [None] * world
        dist.all_gather_object(gathered, {"difference": difference, "orthogonalised": counted[0], "rows": rows})
        results[label] = gathered
    if rank == 0:
        with open(out, "w", encoding="utf-8") as handle:
            json.dump({"world": world, "matrices": len(SHAPES), "steps": 3, "results": results}, handle)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
