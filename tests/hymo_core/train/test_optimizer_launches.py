"""The optimizer step's kernel launches do not grow with the number of layers (issue 53, part 1).

Momentum, row normalisation, the update scales, cautious decay and the update run once per shape group
or as foreach ops over the whole group, not once per matrix. Counted with the launch counter on the meta
device (the preset's shapes, no memory): the ops the host dispatches for a step are the same at 2 and at 8
layers; only foreach lists longer than one launch's tensors add launches (as CUDA's multi_tensor_apply does).
Under FSDP2 on one rank (DTensor parameters) a step launches what it launches on plain tensors: no
per-matrix gather or redistribution.
"""
from dataclasses import replace

import pytest
import torch
import torch.nn as nn

from hymo_core.models.configs import SAMPLE_MODEL
from hymo_core.models.init import build_on_meta
from hymo_core.models.presets import PRESETS
from hymo_core.train.launch_count import LaunchCounter
from hymo_core.train.optim import NorMuonAdamW, build_optimizer
from hymo_core.train.optim_config import NorMuonConfig, OptimizerConfig

OPTIMIZERS = {"normuon": NorMuonConfig(lr=1e-3, muon_lr=1e-3, ns_dtype="bfloat16"),
              "muon_adamw": OptimizerConfig(lr=1e-3, cautious_weight_decay=True)}


def step_count(model: nn.Module, config) -> LaunchCounter:
    """Launches of the second step (the first also creates the state)."""
    for param in model.parameters():
        param.grad = torch.empty_like(param)
    optimizer = build_optimizer(model, config)
    optimizer.step()
    counter = LaunchCounter()
    with counter, counter.phase("optimizer"):
        optimizer.step()
    return counter


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("model,depths", [("dense", (2, 8)), ("hymo-tiny", (4, 8))])
def test_step_dispatches_the_same_ops_at_any_depth(model, depths, optimizer):
    base = SAMPLE_MODEL if model == "dense" else PRESETS[model]
    shallow, deep = (step_count(build_on_meta(replace(base, n_layers=n), seed=0), OPTIMIZERS[optimizer]) for n in depths)
    assert deep.calls("optimizer") == shallow.calls("optimizer"), (shallow.top(8), deep.top(8))
    non_foreach = lambda c: sum(n for op, n in c.top(1000) if "_foreach_" not in op and "fused_adam" not in op)  # noqa: E731
    assert non_foreach(deep) == non_foreach(shallow)


def test_batched_step_equals_one_matrix_at_a_time():
    """Batching mixes no matrix with another: one optimizer over all equals one optimizer per matrix, bit for bit."""
    shapes = [(6, 10), (6, 10), (12, 5), (6, 10), (7, 7)]
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(s, generator=generator) for s in shapes]
    grads = [[torch.randn(s, generator=generator) for s in shapes] for _ in range(3)]
    names = [f"layers.{i}.attn.q_proj.weight" for i in range(len(shapes))]
    config = NorMuonConfig(lr=0.05, muon_lr=0.05, muon_weight_decay=0.3)
    together = [nn.Parameter(w.clone()) for w in weights]
    alone = [nn.Parameter(w.clone()) for w in weights]
    one = NorMuonAdamW(zip(names, together), config)
    each = [NorMuonAdamW([(n, p)], config) for n, p in zip(names, alone)]
    for step_grads in grads:
        for p, q, g in zip(together, alone, step_grads):
            p.grad, q.grad = g.clone(), g.clone()
        one.step()
        for optimizer in each:
            optimizer.step()
    for p, q in zip(together, alone):
        assert torch.equal(p.detach(), q.detach())


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_fsdp2_on_one_rank_launches_what_plain_tensors_do(single_rank_mesh, optimizer):
    """A DTensor on a one-rank mesh is the whole matrix: no full_tensor / distribute_tensor per matrix."""
    from torch.distributed.tensor import Shard, distribute_tensor

    torch.manual_seed(0)
    shapes = [(24, 40), (24, 40), (40, 24), (24, 40)]
    names = [f"layers.{i}.attn.q_proj.weight" for i in range(len(shapes))]
    counts = []
    for sharded in (False, True):
        wrap = (lambda t: distribute_tensor(t, single_rank_mesh, [Shard(0)])) if sharded else (lambda t: t)
        params = [nn.Parameter(wrap(torch.randn(s))) for s in shapes]
        optimizer_ = build_optimizer(_Named(names, params), OPTIMIZERS[optimizer])
        for _ in range(2):
            for p, s in zip(params, shapes):
                p.grad = wrap(torch.randn(s))
            counter = LaunchCounter()
            with counter, counter.phase("optimizer"):
                optimizer_.step()
        counts.append(counter.top(100))
    assert counts[1] == counts[0]


class _Named(nn.Module):
    """Parameters under the given dotted names (what build_optimizer partitions by)."""

    def __init__(self, names, params):
        super().__init__()
        self._pairs = list(zip(names, params))

    def named_parameters(self, *args, **kwargs):
        return iter(self._pairs)
