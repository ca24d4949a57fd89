"""The default alerts on the sample recipe's model and optimizer: silent on a healthy run, loud by step 20 at 100x its LR.

Issue 44, parts 1-2. The sample recipe (hymo_core.train.config.SAMPLE_TRAIN, SAMPLE_MODEL) trains on the
`tiny_run` fixture's real-text shards (a 400-token BPE vocabulary; the sample's is 8,192). The healthy run
uses the recipe unchanged for its first 60 updates (warmup and the start of the cosine, the updates where
the old ratio rule fired); the blow-up is the same recipe at 100x its peak LR.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from hymo_core.models.configs import SAMPLE_MODEL
from hymo_core.train.config import SAMPLE_TRAIN
from hymo_core.train.run import run_training


def sample_run(corpus: Path, out: Path, **overrides) -> list[dict]:
    config = replace(SAMPLE_TRAIN, horizon_steps=SAMPLE_TRAIN.max_steps, **overrides)  # the sample's own LR schedule
    run_training(corpus, out, config, SAMPLE_MODEL, resume=False, cloze_path=None, device=torch.device("cpu"),
                 log=lambda *_: None, progress=False)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_healthy_sample_run_logs_no_alert(tiny_run: Path, tmp_path: Path, one_torch_thread):
    records = sample_run(tiny_run, tmp_path / "healthy", max_steps=60)
    train_rows = [r for r in records if r["kind"] == "train"]
    assert len(train_rows) == 6 and all(r["max_attention_logit"] > 0 for r in train_rows)
    logits = [r["max_attention_logit"] for r in train_rows]
    assert max(logits) > 2 * min(logits) and max(logits) < 10  # what made the old ratio rule fire: small logits that double
    assert [r for r in records if r["kind"] == "alert"] == [], (logits, [r["last_loss"] for r in train_rows])


def test_the_sample_recipe_at_100x_its_lr_alerts_by_step_20(tiny_run: Path, tmp_path: Path, one_torch_thread):
    records = sample_run(tiny_run, tmp_path / "blowup", max_steps=20, peak_lr=100 * SAMPLE_TRAIN.peak_lr)
    signals = [(r["step"], r["last_loss"], r["log_z"], r["max_attention_logit"]) for r in records if r["kind"] == "train"]
    early = {a["alert"] for a in records if a["kind"] == "alert" and a["step"] <= 20}
    assert early & {"loss above ln V", "log-Z far above ln V", "attention logits near QK-Clip's tau"}, signals


def test_a_nan_leaves_its_alert_row_and_a_summary_that_says_what_stopped_the_run(tiny_run: Path, tmp_path: Path, monkeypatch,
                                                                                  one_torch_thread, capsys):
    """Fault injected on purpose: the final norm's output turns NaN on update 13's forward (between two logging steps)."""
    from hymo_core.train import run as run_module

    build = run_module.build_parallel_model

    def poisoned(*args, **kwargs):
        model = build(*args, **kwargs)
        calls = [0]

        def hook(module, inputs, output):
            calls[0] += 1
            return output * float("nan") if calls[0] == 13 and module.training else output

        model.norm.register_forward_hook(hook)  # the head is fused into the loss
        return model

    monkeypatch.setattr(run_module, "build_parallel_model", poisoned)
    out = tmp_path / "nan"
    code = run_module.main(["--corpus", str(tiny_run), "--out", str(out), "--max-steps", "30", "--cloze", ""])
    assert code == 3
    assert "stopped: alert 'non-finite loss or gradient' fired at step 13" in capsys.readouterr().err
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    alert, = [r for r in rows if r["kind"] == "alert"]
    assert (alert["alert"], alert["metric"], alert["step"], alert["action"], alert["value"]) == (
        "non-finite loss or gradient", "last_loss", 13, "stop", "nan")
    summary = json.loads((out / "summary.json").read_text())
    # found at step 20, the next step that reads the device (trainer.DeferredChecks): no record or checkpoint after 13 was written
    assert summary["final_step"] == 19 and not list((out / "checkpoints").glob("*.pt"))
    assert [r["step"] for r in rows if r["kind"] == "train"] == [10]
    assert summary["alerts"] == [{k: v for k, v in alert.items() if k != "kind"}]
    assert "'non-finite loss or gradient' fired at step 13" in summary["stopped_by"]
    assert "non-finite training loss" in summary["stopped_by"]
