"""One process on one device pays nothing for sharding (issue 53, part 3 of the issue: FSDP2 on one rank).

Under torchrun with one rank the trainer used to wrap every block in FSDP2: per-unit hooks, resharding
after forward, a re-gather in backward, and DTensor parameters through the optimizer, for nothing to
shard. bench/launch_budget.py measures what the wrapping cost on one gloo rank.
"""
from hymo_core.distributed.parallelize import build_parallel_model, is_sharded, wraps_in_fsdp
from hymo_core.distributed.process_group import Runtime
from hymo_core.models.configs import SAMPLE_MODEL
from hymo_core.train.config import TrainConfig


def fsdp_units(model) -> int:
    from torch.distributed.fsdp import FSDPModule

    return sum(isinstance(module, FSDPModule) for module in model.modules())


def test_one_launched_rank_builds_no_fsdp_units(single_rank_mesh):
    runtime = Runtime(launched=True, world_size=1)
    model = build_parallel_model(SAMPLE_MODEL, runtime, TrainConfig())
    assert not wraps_in_fsdp(runtime) and fsdp_units(model) == 0 and not is_sharded(model)
    assert wraps_in_fsdp(Runtime(launched=True, world_size=2, rank=0)) and not wraps_in_fsdp(Runtime())
