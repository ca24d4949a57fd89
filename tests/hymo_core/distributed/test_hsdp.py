"""HSDP (issue 24, part 2): `[parallel] replicate = 2, shard = 2` on 4 CPU ranks trains the one-process model.

Kept short: 4 gloo ranks of the tiny model, 3 updates of the recipe's 10-step schedule, compared step
by step with one plain process. The model's FFNs are MoE and the 4 ranks also run expert parallelism
(`expert = 2`, part 3): 2 expert groups of 2 ranks, each rank holding 2 of the 4 experts, FSDP-sharded
over the 2 groups.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import write_corpus
from hymo_core.distributed.launch import launch_training, train_arguments
from hymo_core.train.run import load_run_config, run_training

RECIPE = """
[train]
batch_size = 2
gradient_accumulation_steps = 4
seq_len = 16
max_steps = 10
warmup_steps = 2
peak_lr = 0.01
optimizer = "normuon"
log_interval = 1
eval_interval = 3
checkpoint_interval = 3
eval_batches = 2

[model]
d_model = 32
n_layers = 2
n_heads = 2
n_kv_heads = 2
ffn_dim = 64
max_seq_len = 16
moe_on = "A"
moe_n_routed_experts = 4
moe_expert_dim = 16
"""
STEPS = 3


def train_losses(out: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["last_loss"] for r in rows if r["kind"] == "train"}


def test_two_replicas_of_two_shards_equal_one_process(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    one_process, hsdp = tmp_path / "recipe.toml", tmp_path / "hsdp.toml"
    one_process.write_text(RECIPE)
    hsdp.write_text(RECIPE + "\n[parallel]\nreplicate = 2\nshard = 2\nexpert = 2\n")
    lines: list[str] = []
    launch_training(4, train_arguments(corpus, tmp_path / "four", hsdp, max_steps=STEPS), on_line=lines.append)
    assert "mesh: 2 replica group(s) x 2 shards (HSDP); routed experts over 2 group(s) x 2 ranks (EP)" in lines
    train_config, model_config = load_run_config(one_process)
    train_config = train_config.__class__.from_dict({**train_config.to_dict(), "max_steps": STEPS, "horizon_steps": 10})
    run_training(corpus, tmp_path / "one", train_config, model_config, resume=False, progress=False, log=lambda m: None)
    four, one = train_losses(tmp_path / "four"), train_losses(tmp_path / "one")
    assert sorted(four) == list(range(1, STEPS + 1)) == sorted(one)
    for step in one:
        assert four[step] == pytest.approx(one[step], rel=1e-5), step
    # Each rank held a quarter of every expert weight: 2 of the 4 experts (EP), half of their rows (FSDP over the groups).
    from torch.distributed.checkpoint import FileSystemReader

    metadata = FileSystemReader(str(tmp_path / "four" / "checkpoints" / f"step-{STEPS:08d}")).read_metadata()
    expert = next(value for key, value in metadata.state_dict_metadata.items() if key.endswith("layers.0.ffn.experts.w1.weight"))
    assert list(expert.size) == [4, 16, 32]
    assert sorted(list(chunk.sizes) for chunk in expert.chunks) == [[2, 8, 32]] * 4
    summaries = [json.loads((tmp_path / name / "summary.json").read_text()) for name in ("four", "one")]
    assert summaries[0]["world_size"] == 4
    assert summaries[0]["final_val_loss"] == pytest.approx(summaries[1]["final_val_loss"], rel=1e-5)


def test_a_mesh_that_does_not_make_the_world_size_is_refused_before_launch():
    from hymo_core.distributed.launch import check_batch_plan
    from hymo_core.train.config import TrainConfig

    with pytest.raises(ValueError, match=r"\[parallel\] replicate = 3 x shard = auto does not make 4 ranks"):
        check_batch_plan(TrainConfig(batch_size=4, replicate=3), 4)
    with pytest.raises(ValueError, match=r"replicate = 2 x shard = 3 does not make 4 ranks"):
        TrainConfig(replicate=2, shard=3).mesh_shape(4)
    assert TrainConfig(replicate=2).mesh_shape(8) == (2, 4) and TrainConfig().mesh_shape(3) == (1, 3)
