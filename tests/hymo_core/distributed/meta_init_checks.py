"""Part of parallel_checks.py (2 gloo ranks, test_meta_init_launch.py reads it): the run's model is built on meta.

Each rank counts the bytes of every tensor created while its model is made (torch's MemTracker,
peak over the whole build), once the way `run_training` does it (`build_parallel_model`: meta ->
FSDP2 -> materialise this rank's shards) and once eagerly (a full fp32 model, then sharded), and
computes one loss and its gradient norm on the same tokens with both.
"""
from __future__ import annotations

import torch
from torch.distributed._tools.mem_tracker import MemTracker

from hymo_core.distributed.parallelize import build_parallel_model, parallelize
from hymo_core.distributed.process_group import full_value
from hymo_core.models.configs import ModelConfig
from hymo_core.models.model import Transformer
from hymo_core.train.config import TrainConfig

# Four MoE blocks, a small vocabulary: no single init unit comes near the whole model.
SHAPE = ModelConfig(vocab_size=64, d_model=64, n_layers=4, n_heads=4, n_kv_heads=4, ffn_dim=128, max_seq_len=16,
                    layer_pattern="A", moe_on="A", moe_n_routed_experts=4, moe_expert_dim=32, tie_embeddings=False)


def peak_bytes(build) -> tuple[torch.nn.Module, int]:
    tracker = MemTracker()
    with tracker:
        model = build()
    return model, int(tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])


def held_bytes(model: torch.nn.Module) -> int:
    """This rank's parameter and buffer storage (local shards of DTensors)."""
    tensors = list(model.parameters()) + list(model.buffers())
    return sum((t.to_local() if hasattr(t, "to_local") else t).untyped_storage().nbytes() for t in tensors)


def loss_and_grad_norm(model: torch.nn.Module, tokens: torch.Tensor) -> tuple[float, float]:
    _, loss = model(tokens[:, :-1], tokens[:, 1:])
    loss.backward()
    norm = full_value(torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")))
    return float(loss), float(norm)


def figures(runtime) -> dict:
    """This rank's figures."""
    config = TrainConfig()
    torch.manual_seed(3)
    meta, meta_peak = peak_bytes(lambda: build_parallel_model(SHAPE, runtime, config))
    torch.manual_seed(3)
    eager, eager_peak = peak_bytes(lambda: parallelize(Transformer(SHAPE), runtime, config))
    reference = Transformer(SHAPE)
    full_bytes = sum(p.numel() * p.element_size() for p in reference.parameters())
    largest_unit = max(sum(p.numel() * p.element_size() for p in unit.parameters()) for _, unit, _ in reference.init_units())
    tokens = torch.randint(0, SHAPE.vocab_size, (2, 17), generator=torch.Generator().manual_seed(runtime.rank))
    return {"rank": runtime.rank, "meta_peak": meta_peak, "eager_peak": eager_peak, "full_bytes": full_bytes, "largest_unit": largest_unit,
               "meta_held": held_bytes(meta), "eager_held": held_bytes(eager),
               "meta_loss": loss_and_grad_norm(meta, tokens), "eager_loss": loss_and_grad_norm(eager, tokens),
               "weights_equal": all(torch.equal(a.to_local(), b.to_local()) for a, b in zip(meta.parameters(), eager.parameters()))}
