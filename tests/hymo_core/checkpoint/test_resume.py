"""Exact resume (Lab 2 of seed 001): N steps == N/2 steps + save + a new process + load + N/2 steps, bit for bit."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hymo_core.checkpoint.common import rng_from_payload, weights_sha256
from hymo_core.checkpoint.single import read_checkpoint
from hymo_core.train.data import CorpusReader, TokenLoader
from hymo_core.models.model import ModelConfig, Transformer
from hymo_core.train.optim import build_optimizer
from hymo_core.train.run import load_run_config, run_training
from hymo_core.train.config import TrainConfig
from hymo_core.train.trainer import TrainHooks, TrainState, restore_rng, train


REPO = Path(__file__).resolve().parents[3]
N = 8
RECIPE = f"""
[train]
batch_size = 4
seq_len = 16
max_steps = {N}
horizon_steps = {N}
warmup_steps = 2
peak_lr = 0.01
log_interval = 1
eval_interval = 4
checkpoint_interval = 4
eval_batches = 2

[model]
d_model = 32
n_layers = 2
n_heads = 2
n_kv_heads = 2
ffn_dim = 64
max_seq_len = 16
"""


# The full HyMo recipe in miniature (issue 13): GDN + MLA, MoE on the MLA layer, MTP 2, NorMuon + CautiousAdamW.
FULL_RECIPE = RECIPE.replace("[model]\n", '[model]\nlayer_pattern = "GM"\nmoe_on = "M"\nmoe_n_routed_experts = 4\n'
                             "moe_expert_dim = 16\nmtp_depth = 2\n").replace(
    "[train]\n", '[train]\noptimizer = "normuon"\ncautious_weight_decay = true\n')


def losses(out: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["last_loss"] for r in rows if r["kind"] == "train"}


@pytest.mark.parametrize("recipe_text", [RECIPE, FULL_RECIPE], ids=["dense", "hymo-full-recipe"])
def test_split_run_in_a_new_process_equals_uninterrupted_run(tiny_corpus, tmp_path, recipe_text):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(recipe_text)
    train_config, model_config = load_run_config(recipe)

    whole = run_training(tiny_corpus, tmp_path / "whole", train_config, model_config, resume=False, progress=False)

    half_config = TrainConfig.from_dict({**train_config.to_dict(), "max_steps": N // 2})  # same horizon: same schedule
    run_training(tiny_corpus, tmp_path / "split", half_config, model_config, resume=False, progress=False)
    # The resumed process must run with this process's thread count (part of the runtime signature).
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(torch.get_num_threads())}
    done = subprocess.run([sys.executable, "-m", "hymo_core.train", "--corpus", str(tiny_corpus), "--config", str(recipe),
                           "--out", str(tmp_path / "split"), "--resume"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    split = json.loads((tmp_path / "split" / "summary.json").read_text())

    assert split["resumed_from"].endswith(f"step-{N // 2:08d}.pt")
    whole_losses, split_losses = losses(tmp_path / "whole"), losses(tmp_path / "split")
    assert sorted(whole_losses) == sorted(split_losses) == list(range(1, N + 1))
    assert max(abs(whole_losses[s] - split_losses[s]) for s in whole_losses) == 0.0  # Lab 2: maximum loss error 0
    assert split["weights_sha256"] == whole["weights_sha256"]
    assert split["final_val_loss"] == whole["final_val_loss"] and split["tokens_seen"] == whole["tokens_seen"]

    # Control: the same weights, cursor and RNG but a fresh optimizer (no momentum / Adam moments) diverge.
    payload = read_checkpoint(tmp_path / "split" / "checkpoints" / f"step-{N // 2:08d}.pt")
    model = Transformer(ModelConfig(**payload["model_config"]))
    model.load_state_dict(payload["model"])
    optimizer = build_optimizer(model, train_config.optimizer_config(torch.device("cpu")))
    loader = TokenLoader(CorpusReader(tiny_corpus), "train", train_config.seq_len, train_config.batch_size, train_config.seed)
    loader.load_state_dict(payload["loaders"]["train"])
    restore_rng(rng_from_payload(payload["rng"]))
    control_losses = {}
    hooks = TrainHooks(on_update=lambda s, loss, lr: control_losses.__setitem__(s.step, float(loss)))
    train(model, optimizer, loader, None, train_config, TrainState.from_dict(payload["state"]), torch.device("cpu"), hooks)
    assert control_losses[N // 2 + 1] == whole_losses[N // 2 + 1]  # same weights and data: the first loss agrees
    assert any(control_losses[s] != whole_losses[s] for s in range(N // 2 + 2, N + 1))
    assert weights_sha256(model) != whole["weights_sha256"]


def test_corrupt_newest_checkpoint_is_reported_and_the_previous_one_resumed(tiny_corpus, tmp_path):
    config = TrainConfig(batch_size=4, seq_len=16, max_steps=4, warmup_steps=1, log_interval=1, eval_interval=2,
                         checkpoint_interval=2, eval_batches=1)
    model = ModelConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, ffn_dim=64, max_seq_len=16)
    first = run_training(tiny_corpus, tmp_path / "out", config, model, resume=False, progress=False)
    newest = tmp_path / "out" / "checkpoints" / "step-00000004.pt"
    newest.write_bytes(newest.read_bytes()[:1000])
    messages = []
    again = run_training(tiny_corpus, tmp_path / "out", config, model, resume=True, progress=False, log=messages.append)
    assert any("truncated or corrupt" in m and "step-00000002.pt" in m for m in messages)
    assert again["resumed_from"].endswith("step-00000002.pt")
    assert again["weights_sha256"] == first["weights_sha256"]  # steps 3-4 replayed bit for bit
