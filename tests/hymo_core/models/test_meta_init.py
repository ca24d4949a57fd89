"""Meta-device construction and per-unit materialisation (hymo_core/models/init.py).

Scale is checked by counting: hymo-750m (1.5 B parameters, ~6 GB in fp32) is built on the meta
device in a fresh process whose peak resident memory is read from the OS; no timing is asserted.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from hymo_core.models.model import ModelConfig, Transformer
from hymo_core.models.init import build_on_meta, materialise_
from hymo_core.models.materialise import materialise_unit_, unit_generator

HYBRID_FIELDS = dict(vocab_size=61, d_model=32, n_layers=4, n_heads=4, n_kv_heads=4, ffn_dim=48, max_seq_len=16,
                     layer_pattern="GM", moe_on="M", moe_n_routed_experts=4, moe_expert_dim=16, mtp_depth=2,
                     tie_embeddings=False)
HYBRID = ModelConfig(**HYBRID_FIELDS)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def run_python(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_hymo_750m_builds_on_meta_without_storage():
    # VmHWM, this process's own peak: ru_maxrss survives exec, so it would report the pytest parent's peak
    result = run_python("""
        import json
        import torch
        from hymo_core.models.init import build_on_meta
        from hymo_core.models.presets import PRESETS
        from hymo_core.planner.planner import count_parameters, model_shape

        def peak_mb():
            status = open("/proc/self/status").read().split("VmHWM:")[1]
            return int(status.split()[0]) / 1024

        base = peak_mb()
        model = build_on_meta(PRESETS["hymo-750m"])
        tensors = list(model.parameters()) + list(model.buffers())
        print(json.dumps({"peak_mb": peak_mb(), "after_import_mb": base,
                          "params": sum(p.numel() for p in model.parameters()),
                          "planned": count_parameters(model_shape(PRESETS["hymo-750m"])).total,
                          "devices": sorted({t.device.type for t in tensors})}))
    """)
    assert result["devices"] == ["meta"]
    assert result["params"] == result["planned"] > 1_000_000_000  # fp32 storage would be > 4 GB
    assert result["peak_mb"] < 1024, result  # the whole process, torch included
    assert result["peak_mb"] - result["after_import_mb"] < 256, result  # building held no parameter storage


@pytest.mark.parametrize("config", [HYBRID, ModelConfig(vocab_size=61, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                                                          ffn_dim=48, max_seq_len=16)])
def test_materialised_model_equals_eager_init_under_the_same_seed(config):
    torch.manual_seed(7)
    eager = Transformer(config)
    torch.manual_seed(7)
    meta = build_on_meta(config)
    assert all(p.is_meta for p in meta.parameters())
    materialise_(meta, "cpu")
    assert eager.state_dict().keys() == meta.state_dict().keys()
    for name, value in eager.state_dict().items():
        assert torch.equal(value, meta.state_dict()[name]), name
    for name, value in eager.named_buffers():  # RoPE tables (not saved) too
        assert torch.equal(value, dict(meta.named_buffers())[name]), name
    if config.tie_embeddings:
        assert meta.output.weight is meta.tok_embeddings.weight
    assert meta.init_seed == eager.init_seed
    torch.manual_seed(8)
    assert not torch.equal(Transformer(config).tok_embeddings.weight, eager.tok_embeddings.weight)


def test_one_block_materialised_alone_equals_the_eager_block():
    """A unit's values depend only on (init seed, its index): what lets each rank initialise its own shards."""
    torch.manual_seed(3)
    eager = Transformer(HYBRID)
    model = build_on_meta(HYBRID, seed=eager.init_seed)
    model.to_empty(device="cpu")
    units = model.init_units()
    names = [name for name, _, _ in units]
    assert names[:6] == ["tok_embeddings", "layers.0", "layers.1", "layers.2", "layers.3", "norm"]
    for index in (4, 2, len(units) - 1):  # out of order: the last MTP depth, then a trunk block
        name, unit, init = units[index]
        materialise_unit_(unit, init, unit_generator(model.init_seed, index), torch.device("cpu"))
        for param_name, value in unit.state_dict().items():
            if param_name.endswith(("_E", "dropped_assignments")):
                continue  # MoE buffers: set by init_buffers_, not by the unit's init
            assert torch.equal(value, eager.get_submodule(name).state_dict()[param_name]), f"{name}.{param_name}"


@pytest.mark.parametrize("rank", [0, 1])
def test_fsdp2_sharded_materialisation_keeps_each_ranks_slice_of_eager_init(rank):
    """FSDP2 over 2 ranks (torch's fake process group: one real process per rank, no peers needed)."""
    result = run_python(f"""
        import json
        import torch, torch.distributed as dist
        from torch.testing._internal.distributed.fake_pg import FakeStore
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor import DTensor, distribute_tensor
        from hymo_core.models.model import ModelConfig, Transformer
        from hymo_core.models.init import build_on_meta, materialise_
        config = ModelConfig(**{HYBRID_FIELDS!r})
        torch.manual_seed(0)
        eager = Transformer(config)
        dist.init_process_group("fake", store=FakeStore(), rank={rank}, world_size=2)
        mesh = init_device_mesh("cpu", (2,))
        torch.manual_seed(0)
        model = build_on_meta(config)
        for block in model.blocks():
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        materialise_(model, "cpu")
        wrong, sharded = [], 0
        for (name, param), (_, full) in zip(model.named_parameters(), eager.named_parameters()):
            sharded += isinstance(param, DTensor)
            want = distribute_tensor(full.detach(), mesh, param.placements, src_data_rank=None).to_local()
            if not torch.equal(param.to_local(), want):
                wrong.append(name)
        print(json.dumps({{"wrong": wrong, "sharded": sharded, "params": len(list(eager.parameters()))}}))
    """)
    assert result["wrong"] == [] and result["sharded"] == result["params"]
