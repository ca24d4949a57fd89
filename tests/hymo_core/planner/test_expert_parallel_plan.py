"""The planner's expert-parallel costs (hymo_core/planner/expert_parallel.py): by hand, and against the built model."""
from __future__ import annotations

import pytest

from hymo_core.planner.expert_parallel import (STATE_BYTES, expert_parallel_cost, format_expert_parallel,
                                               routed_expert_parameters)
from hymo_core.planner.planner import ModelShape, count_parameters, model_shape

SHAPE = ModelShape(n_layers=2, d_model=8, n_heads=2, n_kv_heads=2, ffn_dim=16, vocab_size=10, layer_pattern="A", moe_on="A",
                   moe_routed_experts=4, moe_activated_experts=2, moe_shared_experts=0, moe_expert_dim=6)


def test_costs_by_hand():
    assert routed_expert_parameters(SHAPE) == 2 * 4 * 3 * 8 * 6
    rest = count_parameters(SHAPE).total - 1152
    no_drop = expert_parallel_cost(SHAPE, ranks=4, expert=2, tokens=10)
    assert no_drop.state_bytes == (rest + 1152) * STATE_BYTES / 4  # experts over P = 2, then FSDP over the 2 groups
    # dropless, variable splits: the 20 assignments' rows of 8 bf16 values, half of them leave, 4 exchanges, 2 layers
    assert no_drop.alltoall_bytes == 4 * (20 * 8 * 2) / 2 * 2
    assert no_drop.padding == 1.0  # no padding on the wire (the old fixed stack sent E / k = 2 times this)
    assert no_drop.gathered_bytes == 1152 / 2 / 2 * 2  # one layer's 2 experts, bf16, while its block runs
    assert no_drop.expert_weight_bytes == 1152 / 2 * (2 + 2 + 4) * (1 / 2)  # FSDP of its 2 experts over the 2 groups
    assert expert_parallel_cost(SHAPE, ranks=4, expert=4, tokens=10).expert_weight_bytes == 0  # P = W: experts stay put
    capped = expert_parallel_cost(SHAPE, ranks=4, expert=2, tokens=10, capacity_factor=0.5)
    assert capped.alltoall_bytes == no_drop.alltoall_bytes * 12 / 20  # C = ceil(0.5 x 10 x 2 / 4) = 3: at most 12 kept
    assert capped.padding == 12 / 20
    fsdp = expert_parallel_cost(SHAPE, ranks=4, expert=1, tokens=10)
    assert fsdp.alltoall_bytes == 0 and fsdp.expert_state_bytes == 1152 * STATE_BYTES / 4
    assert fsdp.expert_weight_bytes == 1152 * (2 + 2 + 4) * 3 / 4
    assert fsdp.gathered_bytes == 1152 / 2 * 2  # all 4 experts of a layer
    with pytest.raises(ValueError, match="must divide"):
        expert_parallel_cost(SHAPE, ranks=4, expert=3, tokens=10)


@pytest.mark.parametrize("preset", ["hymo-tiny", "hymo-750m"])
def test_routed_expert_count_is_the_built_models(preset):
    from hymo_core.models.init import build_on_meta
    from hymo_core.models.presets import PRESETS

    model = build_on_meta(PRESETS[preset])
    built = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
    assert routed_expert_parameters(model_shape(PRESETS[preset])) == built > 0


def test_table_lists_every_expert_degree():
    table = format_expert_parallel("toy", SHAPE, [4], tokens=10)
    assert "| 4 | 1 |" in table and "| 4 | 2 |" in table and "| 4 | 4 |" in table
