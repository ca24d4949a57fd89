"""Expert parallelism (issue 24, part 3): EP = 2 equals EP = 1 on the same tokens, and checkpoints reshard.

One torchrun launch with 2 gloo ranks (expert_parallel_checks.py, run by parallel_checks.py) trains the same MoE model (4
routed experts, top-2, a capacity factor that drops assignments) as FSDP only and with the experts
split over an `expert` mesh dimension, and compares logits, loss, every gradient, the clipped norm,
the gate biases and the weights after each of 3 updates; then loads each layout's DCP checkpoint
into the other and takes one more step. The unlogged EP step's only host syncs are the all-to-all
split sizes, one read per MoE layer (variable splits: nothing padded is sent). (The full run under `[parallel] expert = 2`, against one process
and its checkpoint read by one process, is the hybrid test in test_distributed.py.)
"""
from __future__ import annotations

import pytest

from parallel_launch import parallel_checks


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return parallel_checks(tmp_path_factory)["expert_parallel"]  # one 2-rank launch for this file and its neighbour


def test_experts_are_split_over_the_expert_mesh_dimension(ranks):
    for rank in ranks:
        assert rank["expert_local_shape"] == [2, 24, 32]  # 2 of the 4 experts on each rank, whole
        assert rank["expert_mesh"] == ["expert"]  # one expert group (P = W): FSDP leaves the experts alone


def test_ep_2_equals_ep_1_on_the_same_tokens(ranks):
    for rank in ranks:
        for step in rank["steps"]:
            assert step["loss"] < 1e-6 and step["logits"] < 1e-6, step
            assert step["grads"] < 1e-6 and step["norm"] < 1e-6, step
            assert step["bias"] == 0.0, step  # the same counts, all-reduced, the same sign step
            assert step["weights"] < 1e-5, step
            assert step["dropped"][0] == step["dropped"][1] > 0, step  # capacity drops happened, and alike
    assert any(step["bias_norm"] > 0 for step in ranks[0]["steps"])  # the gate bias did move


@pytest.mark.parametrize("direction", ["ep_checkpoint_into_fsdp", "fsdp_checkpoint_into_ep"])
def test_checkpoints_reshard_between_ep_and_fsdp(ranks, direction):
    for rank in ranks:
        figures = rank[direction]
        assert figures["loss"] < 1e-6 and figures["grads"] < 1e-6 and figures["bias"] == 0.0, figures
        assert figures["weights"] < 1e-5, figures  # optimizer state came along too: the step after the load agrees


def test_an_unlogged_ep_step_reads_only_the_split_sizes(ranks):
    """Variable splits need each MoE layer's counts on the host: one read per layer and forward, nothing else."""
    for rank in ranks:
        assert rank["host_syncs"]["fsdp"] == []
        moe_layers = 2  # SHAPE: 2 layers of kind "A", MoE on "A"
        assert len(rank["host_syncs"]["ep"]) == moe_layers, rank["host_syncs"]
        assert all(sync.startswith("Tensor.tolist at expert_parallel.py") for sync in rank["host_syncs"]["ep"])


def test_evaluation_batches_of_different_shapes_per_rank(ranks):
    for rank in ranks:
        assert rank["eval_logits"] < 1e-6


def test_an_expert_degree_that_does_not_divide_the_ranks_is_refused_before_torchrun(tmp_path):
    from hymo_core.distributed.launch import check_batch_plan
    from hymo_core.train.config import TrainConfig
    from hymo_core.train.run import load_run_config

    with pytest.raises(ValueError, match=r"\[parallel\] expert = 3 does not divide 4 ranks"):
        check_batch_plan(TrainConfig(batch_size=4, expert=3), 4)
    assert TrainConfig(expert=2).expert_mesh_shape(8) == (4, 2)
    with pytest.raises(ValueError, match="TrainConfig.expert must be a positive integer"):
        TrainConfig(expert=0)
    recipe = tmp_path / "ep.toml"
    recipe.write_text("[parallel]\nexpert = 2\n", encoding="utf-8")
    assert load_run_config(recipe)[0].expert == 2
