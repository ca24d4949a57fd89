"""Part of parallel_checks.py (2 gloo ranks, test_expert_parallel.py reads it): EP = 2 against EP = 1 on the same tokens.

Both models are built the way a run builds them (meta -> parallelise -> materialise, one seed);
EP = 1 is FSDP over the 2 ranks (experts sharded like any weight), EP = 2 splits the 4 routed
experts over the ranks and moves tokens by all-to-all. Each rank feeds both the same tokens
(its own, as data parallelism does), with a capacity factor that drops assignments. Per step:
logits, loss, every gradient, the clipped norm, the gate-bias update and the weights after the
optimizer step. Then DCP checkpoints are written under one layout and loaded under the other (both
directions, into `root`), and one more step must agree.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor

from hymo_core.distributed.parallelize import build_parallel_model
from hymo_core.distributed.process_group import clip_grad_norm_, reduce_expert_load_
from hymo_core.models.configs import ModelConfig
from hymo_core.train.host_sync import HostSyncCounter
from hymo_core.train.config import TrainConfig
from hymo_core.train.optim import build_optimizer

SHAPE = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48, max_seq_len=16,
                    layer_pattern="A", moe_on="A", moe_n_routed_experts=4, moe_n_activated_experts=2, moe_expert_dim=24,
                    moe_capacity_factor=1.0, moe_bias_update_rate=0.01)
FSDP, EP = TrainConfig(), TrainConfig(expert=2)


def full(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().clone()


def build(config: TrainConfig, runtime, seed: int = 5):
    torch.manual_seed(seed)
    model = build_parallel_model(SHAPE, runtime, config)
    return model, build_optimizer(model, config.optimizer_config(runtime.device))


def step(model, optimizer, tokens: torch.Tensor) -> dict:
    logits, loss = model(tokens[:, :-1], tokens[:, 1:], return_logits=True)
    loss.backward()
    grads = {name: full(p.grad) for name, p in model.named_parameters()}
    norm = clip_grad_norm_(model.parameters(), 0.5)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    figures = model.after_optimizer_step(reduce_expert_load_, read=True)
    return {"logits": logits.detach(), "loss": loss.detach(), "grads": grads, "norm": full(norm),
            "bias": {name: full(b) for name, b in model.named_buffers() if name.endswith("expert_bias_E")},
            "dropped": sum(layer["dropped_tokens"] for layer in figures.values()),
            "weights": {name: full(p) for name, p in model.named_parameters()}}


def host_syncs_of_an_unlogged_step(model, optimizer, tokens: torch.Tensor) -> list[str]:
    """Host syncs (hymo_core/train/host_sync.py: aten-level and tolist/numpy) during one training step that logs nothing."""
    with HostSyncCounter() as syncs:
        _, loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        model.after_optimizer_step(reduce_expert_load_, read=False)
    return [f"{event.op} at {Path(event.where).name}" for event in syncs.events]


def difference(a: dict, b: dict) -> dict:
    def most(x, y):
        if isinstance(x, dict):
            return max(most(x[k], y[k]) for k in x)
        return float((x - y).abs().max())

    return {key: most(a[key], b[key]) for key in ("logits", "loss", "grads", "norm", "bias", "weights")}


def save(model, optimizer, path: str) -> None:
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=path)


def load(model, optimizer, path: str) -> None:
    model_state, optimizer_state = get_state_dict(model, optimizer)
    states = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(states, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=states["model"], optim_state_dict=states["optimizer"])


def figures(runtime, root: Path) -> dict:
    """This rank's figures."""
    generator = torch.Generator().manual_seed(100 + runtime.rank)
    batches = [torch.randint(0, SHAPE.vocab_size, (2, 9), generator=generator) for _ in range(5)]
    fsdp, ep = build(FSDP, runtime), build(EP, runtime)
    expert = ep[0].layers[0].ffn.experts.w1.weight
    figures = {"rank": runtime.rank, "expert_local_shape": list(expert.to_local().shape),
               "expert_mesh": list(expert.device_mesh.mesh_dim_names), "steps": []}
    for tokens in batches[:3]:
        a, b = step(*fsdp, tokens), step(*ep, tokens)
        figures["steps"].append({**difference(a, b), "dropped": [a["dropped"], b["dropped"]], "bias_norm": float(a["bias"]["layers.0.ffn.expert_bias_E"].norm())})

    # Evaluation: the ranks' batches differ in shape (as cloze continuations do); the group agrees on the rows first.
    shape = (1, 5) if runtime.rank == 0 else (2, 8)
    tokens = torch.randint(0, SHAPE.vocab_size, shape, generator=generator)
    with torch.no_grad():
        outputs = [model.eval()(tokens)[0] for model, _ in (fsdp, ep)]
    figures["eval_logits"] = float((outputs[0] - outputs[1]).abs().max())
    for model, _ in (fsdp, ep):
        model.train()
    figures["host_syncs"] = {"fsdp": host_syncs_of_an_unlogged_step(*fsdp, batches[4]),
                             "ep": host_syncs_of_an_unlogged_step(*ep, batches[4])}
    save(*ep, str(root / "under-ep"))
    save(*fsdp, str(root / "under-fsdp"))
    fsdp_from_ep, ep_from_fsdp = build(FSDP, runtime, seed=9), build(EP, runtime, seed=9)
    load(*fsdp_from_ep, str(root / "under-ep"))
    load(*ep_from_fsdp, str(root / "under-fsdp"))
    tokens = batches[3]
    reference = step(*ep, tokens)  # the EP model's 5th step; both loaded copies are at the same point
    figures["ep_checkpoint_into_fsdp"] = difference(step(*fsdp_from_ep, tokens), reference)
    figures["fsdp_checkpoint_into_ep"] = difference(step(*ep_from_fsdp, tokens), reference)
    return figures
