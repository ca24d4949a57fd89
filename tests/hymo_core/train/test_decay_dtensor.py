"""Cautious decay on FSDP2's DTensor parameters needs no DTensor rule for any foreach op.

The first GPU run (torch 2.11) stopped in NorMuon's first step: DTensor had no sharding strategy for
aten._foreach_sign_. The decay is elementwise, so it runs on each rank's shard; this test takes the
rule away from this torch's DTensor and checks the decay still equals the plain-tensor result.
"""
import os

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard, distribute_tensor, init_device_mesh

from hymo_core.train.optim import decay_


@pytest.fixture
def one_rank_mesh(tmp_path):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def test_cautious_decay_on_dtensors_without_a_foreach_sign_rule(one_rank_mesh, monkeypatch):
    propagator = DTensor._op_dispatcher.sharding_propagator
    for table in ("op_strategy_funcs", "op_single_dim_strategy_funcs", "op_to_rules"):
        if hasattr(propagator, table):
            monkeypatch.delitem(getattr(propagator, table), torch.ops.aten._foreach_sign_.default, raising=False)
    torch.manual_seed(0)
    plain = [torch.randn(8, 4), torch.randn(6, 3)]
    before = [p.clone() for p in plain]
    signal = [torch.randn(8, 4), torch.randn(6, 3)]
    params = [distribute_tensor(p.clone(), one_rank_mesh, [Shard(0)]) for p in plain]
    signals = [distribute_tensor(s.clone(), one_rank_mesh, [Shard(0)]) for s in signal]
    decay_(params, signals, 0.1, cautious=True)
    decay_(plain, signal, 0.1, cautious=True)
    for got, want in zip(params, plain):
        assert torch.equal(got.to_local(), want)
    assert not any(torch.equal(a, b) for a, b in zip(plain, before))  # the decay did act
