"""More than one process on CPU: torchrun with 2 gloo ranks, FSDP2, DCP checkpoints (issue 14, part 5).

Launches are the slow part (a few seconds of imports per rank), so a handful
of module-scoped runs serve all assertions: a 2-rank run of 10 updates with a
checkpoint every 5, the same recipe in this process, a 2-rank run whose rank 1
is SIGKILLed after its step-5 checkpoint and then resumed, and one launch of
the optimizer / QK-Clip / load-reduction checks.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import write_corpus
from hymo_core.checkpoint.common import CheckpointError
from hymo_core.checkpoint.load import load_model
from hymo_core.train.data import CorpusReader, TokenLoader
from hymo_core.distributed.launch import LaunchError, launch_training, run_process_group, train_arguments
from hymo_core.models.model import Transformer
from hymo_core.train.optim import build_optimizer
from hymo_core.checkpoint.sharded import load_sharded_checkpoint
from hymo_core.threads import choose_threads
from hymo_core.train.run import load_run_config, run_training

HERE = Path(__file__).resolve().parent
STEPS = 10
# Global batch 2 x 4 = 8 windows: one process accumulates 4 micro-batches, each of 2 ranks 2.
# A low QK-Clip threshold makes the clip act (on DTensor shards) in every update.
RECIPE = f"""
[train]
batch_size = 2
gradient_accumulation_steps = 4
seq_len = 16
max_steps = {STEPS}
warmup_steps = 2
peak_lr = 0.01
qk_clip_threshold = 0.03
log_interval = 1
eval_interval = 5
checkpoint_interval = 5
keep_checkpoints = 3
eval_batches = 2

[model]
d_model = 32
n_layers = 2
n_heads = 2
n_kv_heads = 2
ffn_dim = 64
max_seq_len = 16
"""


def torchrun(script: Path, *args: str, nproc: int = 2, env: dict | None = None) -> list[str]:
    lines: list[str] = []
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", str(script), *args]
    run_process_group(command, lines.append, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    return lines


def train_losses(out: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["last_loss"] for r in rows if r["kind"] == "train"}


# 26 windows of 17 tokens: 26 mod 8 = 2 >= the micro-batch of 2, so an epoch that turned at a micro-batch would
# differ between 1 rank (one more micro-batch of 2 fits) and 2 ranks (4 windows do not); 10 updates span 3 epochs.
WINDOWS = 26
TRAIN_TOKENS = WINDOWS * 16 + 1
FAULT_MODULE = "kill_rank_after_checkpoint"  # tests/hymo_core/distributed/kill_rank_after_checkpoint.py


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("distributed")
    recipe = root / "recipe.toml"
    recipe.write_text(RECIPE, encoding="utf-8")
    return {"root": root, "corpus": write_corpus(root / "corpus", train_tokens=TRAIN_TOKENS), "recipe": recipe}


@pytest.fixture(scope="module")
def two_ranks(setup) -> dict:
    out = setup["root"] / "two"
    lines: list[str] = []
    reported: list[dict] = []
    launch_training(2, train_arguments(setup["corpus"], out, setup["recipe"]), on_line=lines.append, report=reported.append)
    return {"out": out, "lines": lines, "reported": reported}


def fault_env(**faults: int) -> dict[str, str]:
    """The environment that runs the fault-injecting module in place of hymo_core.train."""
    path = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **{f"HYMO_TEST_KILL_{name.upper()}": str(value) for name, value in faults.items()}}


@pytest.fixture(scope="module")
def one_rank(setup) -> Path:
    out = setup["root"] / "one"
    run_training(setup["corpus"], out, *load_run_config(setup["recipe"]), resume=False, progress=False, log=lambda m: None)
    return out


@pytest.fixture(scope="module")
def hybrid_recipe(setup) -> Path:
    """The HyMo stack at toy size, 4 updates with NorMuon: a Gated DeltaNet block, then an MLA block with a
    DeepSeekMoE FFN (gate bias stepped on the token counts of both ranks), and one MTP depth on the root.
    Under torchrun the 4 routed experts are expert-parallel (`[parallel] expert = 2`: 2 per rank, tokens
    moved by all-to-all); one process ignores [parallel]."""
    recipe = setup["root"] / "hybrid.toml"
    hybrid = ('n_layers = 2\nlayer_pattern = "GM"\nmoe_on = "M"\nmoe_n_routed_experts = 4\nmoe_n_activated_experts = 2\n'
              'moe_expert_dim = 16\nmtp_depth = 1')
    recipe.write_text(RECIPE.replace(f"max_steps = {STEPS}", 'max_steps = 4\noptimizer = "normuon"').replace("n_layers = 2", hybrid)
                      + "\n[parallel]\nexpert = 2\n", encoding="utf-8")
    return recipe


def test_hybrid_stack_on_two_ranks_trains_the_one_process_model(setup, hybrid_recipe):
    two, one = setup["root"] / "hybrid_two", setup["root"] / "hybrid_one"
    launch_training(2, train_arguments(setup["corpus"], two, hybrid_recipe), on_line=lambda line: None)
    assert "routed experts over 1 group(s) x 2 ranks (EP)" in (two / "logs" / "rank-0.log").read_text()
    run_training(setup["corpus"], one, *load_run_config(hybrid_recipe), resume=False, progress=False, log=lambda m: None)
    for step, loss in train_losses(one).items():
        assert train_losses(two)[step] == pytest.approx(loss, rel=1e-5), step
    final_two, final_one = state_of(two / "checkpoints" / "step-00000004"), state_of(one / "checkpoints" / "step-00000004.pt")
    assert "layers.0.attn.A_log" in final_one and "layers.1.attn.q_b_proj.weight" in final_one  # GDN then MLA
    assert any(".ffn.experts." in name for name in final_one) and any(name.startswith("mtp") for name in final_one)
    for name in final_one:  # fp32 tolerance: 4 updates of summation-order differences (reductions, norms)
        torch.testing.assert_close(final_two[name], final_one[name], rtol=1e-4, atol=5e-6)


def state_of(checkpoint: Path) -> dict[str, torch.Tensor]:
    return load_model(checkpoint)[0].state_dict()


def test_two_ranks_train_the_one_process_model(two_ranks, one_rank):
    """Also across epoch boundaries that do not fall on a micro-batch boundary of both layouts."""
    two_ranks = two_ranks["out"]
    loader = TokenLoader(CorpusReader(two_ranks.parent / "corpus"), "train", 16, 2, 0)
    assert len(loader.windows) == WINDOWS and WINDOWS % 8 >= 2 and STEPS > 2 * (WINDOWS // 8)
    two, one = train_losses(two_ranks), train_losses(one_rank)
    assert sorted(two) == list(range(1, STEPS + 1)) == sorted(one)
    for step in two:
        assert two[step] == pytest.approx(one[step], rel=1e-5), step
    final_two = state_of(two_ranks / "checkpoints" / f"step-{STEPS:08d}")
    final_one = state_of(one_rank / "checkpoints" / f"step-{STEPS:08d}.pt")
    assert final_two.keys() == final_one.keys()
    for name in final_one:
        torch.testing.assert_close(final_two[name], final_one[name], rtol=1e-4, atol=1e-6)
    metrics = [json.loads(line) for line in (two_ranks / "metrics.jsonl").read_text().splitlines()]
    assert sum(r.get("qk_clipped_heads", 0) for r in metrics if r["kind"] == "train") > 0  # the clip acted on shards
    summary, alone = (json.loads((out / "summary.json").read_text()) for out in (two_ranks, one_rank))
    assert summary["world_size"] == 2 and summary["tokens_seen"] == alone["tokens_seen"]
    # Each rank ran on the thread policy's count for 2 ranks (usable CPUs // 2 unless the environment said otherwise).
    assert summary["threads"]["ranks"] == 2 and summary["threads"]["threads"] == choose_threads(None, ranks=2).threads
    # Validation: each rank scores half the batches, the sums are all-reduced.
    assert summary["final_val_loss"] == pytest.approx(alone["final_val_loss"], rel=1e-6)
    layout = sorted(p.name for p in (two_ranks / "checkpoints" / f"step-{STEPS:08d}").iterdir())
    assert layout == [".metadata", "__0_0.distcp", "__1_0.distcp", "metadata.json"]


def test_rank_0_shows_progress_and_every_rank_keeps_its_log(two_ranks):
    progress = [line for line in two_ranks["lines"] if line.startswith("step ") and "tokens/s" in line]
    assert [line.split()[1] for line in progress] == [f"{step}/{STEPS}" for step in range(1, STEPS + 1)]
    logs = two_ranks["out"] / "logs"
    assert f"step {STEPS}/{STEPS}" in (logs / "rank-0.log").read_text() and (logs / "rank-1.log").is_file()
    assert sum(line.startswith("threads: ") for line in two_ranks["lines"]) == 1  # the choice, logged once (by rank 0)
    assert len(list(two_ranks["out"].glob("events.out.tfevents.*"))) == 1  # TensorBoard: rank 0 writes, once
    # The supervisor saw every record rank 0 wrote, live (the Prefect training artifact reads these).
    reported = two_ranks["reported"]
    assert [r["step"] for r in reported if r["kind"] == "train"] == list(range(1, STEPS + 1))
    assert reported == [json.loads(line) for line in (two_ranks["out"] / "metrics.jsonl").read_text().splitlines()]


def test_checkpoints_are_written_in_the_background_with_hashes_from_the_write(two_ranks):
    written = [r for r in two_ranks["reported"] if r["kind"] == "checkpoint"]
    assert [r["step"] for r in written] == [5, 10]
    assert all(r["write_seconds"] >= r["stage_seconds"] > 0 for r in written)
    assert written[0]["overlapped_updates"] >= 1 and written[0]["step_seconds"] > 0  # updates ran while it was written
    from hymo_core.checkpoint.sharded import read_metadata
    from hymo_core.train.data import _sha256_file

    checkpoint = two_ranks["out"] / "checkpoints" / "step-00000005"
    files = read_metadata(checkpoint)["files"]
    assert sorted(files) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    for name, entry in files.items():
        assert entry == {"sha256": _sha256_file(checkpoint / name), "bytes": (checkpoint / name).stat().st_size}


def test_sigkill_during_a_background_save_leaves_the_previous_checkpoint_and_resume_is_bitwise(setup, two_ranks):
    out, reference = setup["root"] / "killed_writing", two_ranks["out"]
    args = train_arguments(setup["corpus"], out, setup["recipe"])
    with pytest.raises(LaunchError, match="rank 1: exited with signal SIGKILL"):
        launch_training(2, args, on_line=lambda line: None, env=fault_env(writing=STEPS), module=FAULT_MODULE)
    checkpoints = out / "checkpoints"
    assert not (checkpoints / f"step-{STEPS:08d}").exists()  # never published
    model, metadata = load_model(checkpoints / "step-00000005")  # intact: every recorded hash still matches
    assert metadata["state"]["step"] == 5
    lines: list[str] = []
    launch_training(2, train_arguments(setup["corpus"], out, setup["recipe"], resume=True), on_line=lines.append)
    assert any("resumed from" in line and "step-00000005" in line for line in lines)
    assert not (checkpoints / f"step-{STEPS:08d}.tmp").exists()  # the leftover of the killed write was cleared
    resumed = json.loads((out / "summary.json").read_text())
    assert resumed["weights_sha256"] == json.loads((reference / "summary.json").read_text())["weights_sha256"]
    assert train_losses(out) == train_losses(reference)
    # the DCP metadata carries the monitor entry, so the resumed ranks report the alerts the uninterrupted ones did
    assert metadata["monitor"]["alerts"]["fired"] and metadata["monitor"]["alerts"]["history"]
    assert alert_rows(out) == alert_rows(reference) != []


def alert_rows(out: Path) -> list[dict]:
    return [row for row in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if row["kind"] == "alert"]


def test_torchrun_restarts_the_group_after_a_rank_is_killed_and_it_ends_bitwise(setup, two_ranks):
    out, reference = setup["root"] / "restarted", two_ranks["out"]
    lines: list[str] = []
    launch_training(2, train_arguments(setup["corpus"], out, setup["recipe"]), on_line=lines.append, max_restarts=1,
                    env=fault_env(step=5), module=FAULT_MODULE)
    assert any("resumed from" in line and "step-00000005" in line for line in lines)  # the restarted attempt, by itself
    restarted = json.loads((out / "summary.json").read_text())
    assert restarted["weights_sha256"] == json.loads((reference / "summary.json").read_text())["weights_sha256"]
    assert train_losses(out) == train_losses(reference)


def test_two_rank_checkpoint_continues_in_one_process(setup, two_ranks):
    two_ranks = two_ranks["out"]
    out = setup["root"] / "resharded"
    (out / "checkpoints").mkdir(parents=True)
    shutil.copytree(two_ranks / "checkpoints" / "step-00000005", out / "checkpoints" / "step-00000005")
    messages: list[str] = []
    summary = run_training(setup["corpus"], out, *load_run_config(setup["recipe"]), resume=True, progress=False, log=messages.append)
    assert summary["resumed_from"].endswith("step-00000005")
    assert any("resharding from 2 to 1 ranks" in m for m in messages)
    continued, reference = state_of(out / "checkpoints" / f"step-{STEPS:08d}.pt"), state_of(two_ranks / "checkpoints" / f"step-{STEPS:08d}")
    for name in reference:
        torch.testing.assert_close(continued[name], reference[name], rtol=1e-4, atol=1e-6)
    for step in range(6, STEPS + 1):
        assert train_losses(out)[step] == pytest.approx(train_losses(two_ranks)[step], rel=1e-5)


def test_one_process_checkpoint_continues_on_two_ranks(setup, one_rank):
    out = setup["root"] / "one_to_two"
    (out / "checkpoints").mkdir(parents=True)
    shutil.copy2(one_rank / "checkpoints" / "step-00000005.pt", out / "checkpoints" / "step-00000005.pt")
    lines: list[str] = []
    launch_training(2, train_arguments(setup["corpus"], out, setup["recipe"], resume=True), on_line=lines.append)
    assert any("resharding from 1 to 2 ranks" in line for line in lines)
    continued, reference = state_of(out / "checkpoints" / f"step-{STEPS:08d}"), state_of(one_rank / "checkpoints" / f"step-{STEPS:08d}.pt")
    for name in reference:
        torch.testing.assert_close(continued[name], reference[name], rtol=1e-4, atol=1e-6)
    for step in range(6, STEPS + 1):
        assert train_losses(out)[step] == pytest.approx(train_losses(one_rank)[step], rel=1e-5)


def fresh(setup, **model_changes):
    train_config, model_config = load_run_config(setup["recipe"])
    reader = CorpusReader(setup["corpus"])
    from dataclasses import replace

    model = Transformer(replace(model_config, vocab_size=reader.vocab_size, **model_changes))
    optimizer = build_optimizer(model, train_config.optimizer_config(torch.device("cpu")))
    loader = TokenLoader(reader, "train", train_config.seq_len, train_config.batch_size, train_config.seed)
    return model, optimizer, train_config, loader


@pytest.mark.parametrize("damage, message", [
    ("flip a byte in rank 1's shard", "truncated or corrupt.*__1_0.distcp sha256"),
    ("truncate the DCP index", "truncated or corrupt.*.metadata has"),
    ("remove metadata.json", "truncated or corrupt.*metadata.json"),
    ("another model shape", "model config differs in n_layers"),
])
def test_damaged_or_incompatible_dcp_checkpoint_refused_before_anything_changes(setup, two_ranks, tmp_path, damage, message):
    two_ranks = two_ranks["out"]
    checkpoint = tmp_path / "step-00000005"
    shutil.copytree(two_ranks / "checkpoints" / "step-00000005", checkpoint)
    model_changes = {}
    if damage.startswith("flip"):
        data = bytearray((checkpoint / "__1_0.distcp").read_bytes())
        data[len(data) // 2] ^= 0xFF
        (checkpoint / "__1_0.distcp").write_bytes(bytes(data))
    elif damage.startswith("truncate"):
        index = checkpoint / ".metadata"
        index.write_bytes(index.read_bytes()[:100])
    elif damage.startswith("remove"):
        (checkpoint / "metadata.json").unlink()
    else:
        model_changes = {"n_layers": 1}
    model, optimizer, config, loader = fresh(setup, **model_changes)
    before = {name: t.clone() for name, t in model.state_dict().items()}
    cursor, rng = loader.state_dict(), torch.get_rng_state()
    with pytest.raises(CheckpointError, match=message):
        load_sharded_checkpoint(checkpoint, model, optimizer, config, loader)
    assert all(torch.equal(before[name], t) for name, t in model.state_dict().items())
    assert optimizer.state_dict()["state"] == {} and loader.state_dict() == cursor and torch.equal(rng, torch.get_rng_state())


def test_dcp_checkpoint_evaluates_in_one_process_via_the_cli(two_ranks, setup, tmp_path):
    two_ranks = two_ranks["out"]
    checkpoint = two_ranks / "checkpoints" / f"step-{STEPS:08d}"
    model, metadata = load_model(checkpoint)
    assert metadata["state"]["step"] == STEPS and metadata["world_size"] == 2
    assert len(metadata["loaders"]["train_per_rank"]) == 2 and len(metadata["rng_per_rank"]) == 2
    export = tmp_path / "model.safetensors"
    done = subprocess.run([sys.executable, "-m", "flows", "export", str(checkpoint), "--safetensors", str(export)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    from safetensors.torch import load_file

    exported = load_file(export)
    for name, tensor in model.state_dict().items():
        assert torch.equal(exported[name], tensor)


def test_optimizer_and_qk_clip_on_two_rank_shards_equal_the_whole_matrices(tmp_path):
    out = tmp_path / "checks.json"
    torchrun(HERE / "distributed_checks.py", str(out))
    results = json.loads(out.read_text())
    assert results["muon_params_sharded"] >= 8
    assert results["muon_max_difference"] < 1e-5 and results["normuon_max_difference"] < 1e-5
    assert results["shard_orthogonalised_difference"] > 1e-2  # what a shard-wise Newton-Schulz would have done
    assert results["qk_clip_max_difference"] < 1e-6
    assert results["expert_load"] == [3.0, 6.0, 9.0]


def test_process_group_is_taken_down_when_the_caller_stops_reading():
    """A cancelled task: the callback raises, and no process of the group survives."""
    started: list[int] = []

    def cancel(line: str) -> None:
        started.append(int(line))
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_process_group(["sh", "-c", "sleep 60 & echo $!; wait"], cancel)
    import time

    for _ in range(50):
        if not Path(f"/proc/{started[0]}").exists() or "Z" in Path(f"/proc/{started[0]}/stat").read_text().split()[2]:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"sleep {started[0]} outlived its process group")


def test_one_rank_under_torchrun_trains_the_plain_model_and_its_dcp_checkpoint_resumes(setup, one_rank):
    """torchrun with one rank: no FSDP wrapping (the log says so), the one-process run's losses bit for bit,
    and its DCP checkpoint (what a launched run writes) resumes in one process (issue 53)."""
    out = setup["root"] / "torchrun_one"
    lines: list[str] = []
    launch_training(1, train_arguments(setup["corpus"], out, setup["recipe"]), on_line=lines.append)
    assert any("one rank: the model is not wrapped in FSDP2" in line for line in lines)
    assert train_losses(out) == train_losses(one_rank)
    resumed = setup["root"] / "torchrun_one_resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(out / "checkpoints" / "step-00000005", resumed / "checkpoints" / "step-00000005")
    run_training(setup["corpus"], resumed, *load_run_config(setup["recipe"]), resume=True, progress=False, log=lambda m: None)
    for step in range(6, STEPS + 1):
        assert train_losses(resumed)[step] == train_losses(one_rank)[step]
