"""Checks that need a real process group, run by test_distributed.py under torchrun with 2 ranks.

Each rank builds the same plain model and an FSDP2-sharded copy, gives both the
same full gradients, and compares what the optimizer, QK-Clip and the MoE load
reduction make of them. Rank 0 writes the measured differences as JSON to argv[1].
"""
from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, distribute_tensor

from hymo_core.models.configs import ModelConfig
from hymo_core.train.config import TrainConfig
from hymo_core.distributed.process_group import close_runtime, init_runtime, reduce_expert_load_
from hymo_core.models.model import Transformer
from hymo_core.train.optim import build_optimizer, newton_schulz
from hymo_core.train.optim_config import NorMuonConfig, OptimizerConfig
from hymo_core.distributed.parallelize import apply_fsdp

SHAPE = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48, max_seq_len=16)


def full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone() for name, p in model.named_parameters()}


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[name] - b[name]).abs().max()) for name in a)


def main(out: str) -> None:
    runtime = init_runtime()
    torch.manual_seed(0)
    plain = Transformer(SHAPE)
    sharded = Transformer(SHAPE)
    sharded.load_state_dict(plain.state_dict())
    apply_fsdp(sharded, runtime, TrainConfig())
    generator = torch.Generator().manual_seed(1)  # the same full gradients on every rank
    results = {"muon_params_sharded": sum(isinstance(p, DTensor) and p.ndim == 2 for p in sharded.parameters())}
    for label, config in (("muon", OptimizerConfig(lr=0.02, ns_dtype="float32")),
                          ("normuon", NorMuonConfig(lr=0.02, muon_lr=0.02, ns_dtype="float32"))):
        optimizers = build_optimizer(plain, config), build_optimizer(sharded, config)
        for _ in range(3):
            for (name, p), (_, s) in zip(plain.named_parameters(), sharded.named_parameters()):
                grad = torch.randn(p.shape, generator=generator)
                p.grad = grad.clone()
                s.grad = distribute_tensor(grad.clone(), s.device_mesh, s.placements, src_data_rank=None)
            for optimizer in optimizers:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        results[f"{label}_max_difference"] = max_difference(full_state(plain), full_state(sharded))

    # The bug the gather prevents: Newton-Schulz of a row shard is not a shard of Newton-Schulz.
    matrix = torch.randn(32, 32, generator=generator)
    whole = newton_schulz(matrix, dtype=torch.float32)
    rows = matrix.shape[0] // runtime.world_size
    mine = slice(runtime.rank * rows, (runtime.rank + 1) * rows)
    results["shard_orthogonalised_difference"] = float((newton_schulz(matrix[mine], dtype=torch.float32) - whole[mine]).abs().max())

    # QK-Clip rescales the same rows of the whole matrix and of every shard.
    scale_LH = torch.rand(SHAPE.n_layers, SHAPE.n_heads, generator=generator).clamp(min=0.1)
    for model in (plain, sharded):
        for block, scale_H in zip(model.layers, scale_LH):
            block.attn.qk_clip_(scale_H)
    results["qk_clip_max_difference"] = max_difference(full_state(plain), full_state(sharded))

    # MoE gate-bias load: every rank sees the sum of all ranks' token counts.
    load_E = torch.tensor([1.0, 2.0, 3.0]) * (runtime.rank + 1)
    reduce_expert_load_(load_E)
    results["expert_load"] = load_E.tolist()
    if runtime.rank == 0:
        with open(out, "w", encoding="utf-8") as handle:
            json.dump(results, handle)
    dist.barrier()
    close_runtime(runtime)


if __name__ == "__main__":
    main(sys.argv[1])
