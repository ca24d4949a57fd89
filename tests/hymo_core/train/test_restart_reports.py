"""A run killed with SIGKILL after its step-100 checkpoint and resumed to 200 reports what an uninterrupted run to 200 reports.

Issue 44, part 4: per-source token totals and the alert history are checkpointed (the checkpoint's "monitor"
entry). Real subprocesses (`python -m hymo_core.train`), a real SIGKILL once the step-100 checkpoint file has
landed, real shards with two sources (the `tiny_run` fixture). The recipe's alerts all read history: the
loss against its window's median, logit growth against its window, and the held-out loss against the forecast
fitted to every earlier evaluation, so a resume that forgot the history would fire differently. Logging every
3 updates puts the checkpoint (100) between two logging steps (99, 102): the windows counted per source since
step 99 must be counted once, at 102, in both runs.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from tests.conftest import TINY_MODEL_KEYS

RECIPE = """
[train]
batch_size = 4
seq_len = 16
max_steps = 200
warmup_steps = 5
peak_lr = 0.01
log_interval = 3
eval_interval = 10
eval_batches = 2
checkpoint_interval = 100
keep_checkpoints = 3

[model]
""" + TINY_MODEL_KEYS + """
[[alerts]]
name = "loss below its window's median"
metric = "last_loss"
condition = "zscore < 0"
window = 5

[[alerts]]
name = "logit growth"
metric = "max_attention_logit"
condition = "growth > 1.05"
window = 4

[[alerts]]
metric = "val_loss"
condition = "outside_forecast"
"""

ROOT = Path(__file__).resolve().parents[3]


def command(corpus: Path, recipe: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "hymo_core.train", "--corpus", str(corpus), "--config", str(recipe), "--out", str(out),
            "--cloze", "", *extra]


def environment() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HYMO_THREADS": "1", "HYMO_PROGRESS": "0"}


def records(out: Path, kind: str) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == kind]


def test_sigkill_at_100_and_resume_to_200_reports_what_an_uninterrupted_run_reports(tiny_run: Path, tmp_path: Path):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(RECIPE)
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    subprocess.run(command(tiny_run, recipe, whole), env=environment(), check=True, capture_output=True, timeout=600)

    process = subprocess.Popen(command(tiny_run, recipe, killed), env=environment(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    landed = killed / "checkpoints" / "step-00000100.pt"
    deadline = time.monotonic() + 600
    while not landed.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    assert process.poll() is None, "the run ended before it could be killed after its step-100 checkpoint"
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL
    assert landed.exists() and not (killed / "checkpoints" / "step-00000200.pt").exists()
    assert "monitor" in torch.load(landed, map_location="cpu", weights_only=True)  # plain types: weights_only loads it

    resumed = subprocess.run(command(tiny_run, recipe, killed, "--resume"), env=environment(), capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from" in resumed.stdout + resumed.stderr

    # The same alert rows, in the same order, with the same values.
    alerts_whole, alerts_killed = records(whole, "alert"), records(killed, "alert")
    assert any(a["step"] > 100 for a in alerts_whole) and {a["alert"] for a in alerts_whole} >= {"loss below its window's median"}
    assert alerts_killed == alerts_whole
    summaries = [json.loads((out / "summary.json").read_text()) for out in (whole, killed)]
    assert summaries[1]["alerts"] == summaries[0]["alerts"]
    # The same per-source totals at every logging step, the last one counting every token the run consumed.
    totals = [[(r["step"], r["tokens_per_source"], r["tokens_per_source_total"]) for r in records(out, "train")]
              for out in (whole, killed)]
    assert totals[1] == totals[0]
    last = records(whole, "train")[-1]
    assert len(last["tokens_per_source_total"]) == 2 and sum(last["tokens_per_source_total"].values()) == 200 * 4 * 16
