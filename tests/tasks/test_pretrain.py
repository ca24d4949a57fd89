"""The pretrain stage: publishes summary, metrics, picture and checkpoint; a killed attempt resumes, not restarts."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from hymo_core.checkpoint.single import CheckpointDirectory
from hymo_core.models.model import ModelConfig
from hymo_core.train.config import TrainConfig
from manifests.stage_manifest import read_manifest
from tasks.pretrain import CHECKPOINT_ROOT, PretrainConfig, checkpoint_home, run_pretrain

TINY = PretrainConfig(
    train=TrainConfig(batch_size=4, seq_len=16, max_steps=4, warmup_steps=1, log_interval=1, eval_interval=2,
                      checkpoint_interval=2, eval_batches=2),
    model=ModelConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, ffn_dim=64, max_seq_len=16),
)


class Killed(BaseException):
    """Stands in for SIGKILL: nothing after it runs, nothing catches it."""


def test_killed_pretrain_resumes_from_its_checkpoint_then_publishes(tiny_run: Path, tmp_path: Path, monkeypatch):
    shards = tiny_run / "07_shards"
    out = tmp_path / "run" / "08_pretrain"
    out.parent.mkdir()
    original = CheckpointDirectory.save

    def save_then_die(self, step, val_loss, **objects):
        path = original(self, step, val_loss, **objects)
        if step == 2:
            raise Killed()
        return path

    monkeypatch.setattr(CheckpointDirectory, "save", save_then_die)
    with pytest.raises(Killed):
        run_pretrain(TINY, shards, out)
    assert not out.exists()  # nothing published by the killed attempt
    home = checkpoint_home(out, shards, TINY)
    assert (home / "checkpoints" / "step-00000002.pt").is_file()
    monkeypatch.setattr(CheckpointDirectory, "save", original)

    manifest = run_pretrain(TINY, shards, out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from"].endswith("step-00000002.pt") and summary["final_step"] == 4
    assert summary["checkpoint"] == "checkpoints/step-00000004.pt" and (out / summary["checkpoint"]).is_file()
    assert summary["final_val_loss"] is not None and len(summary["weights_sha256"]) == 64
    assert 0 <= summary["cloze"]["accuracy"] <= 1 and summary["cloze"]["items"] == 40
    paths = {o.path for o in manifest.files("artifact")}
    assert {"summary.json", "metrics.jsonl", "loss.png", "checkpoints/step-00000004.pt"} <= paths
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "train"]
    assert steps == [1, 2, 3, 4]  # the killed session's records are kept, nothing twice
    assert manifest.extra["final_step"] == 4 and manifest.extra["checkpoint"] == "checkpoints/step-00000004.pt"
    assert not (tmp_path / "run" / CHECKPOINT_ROOT).exists()  # cleaned once published

    again = run_pretrain(TINY, shards, out)  # same key: a no-op
    assert again.digest == read_manifest(out).digest == manifest.digest


def test_pretrain_stage_with_nproc_2_runs_torchrun_and_publishes_the_dcp_checkpoint(tiny_run: Path, tmp_path: Path, capsys):
    from dataclasses import replace

    from flows.config import load_config
    from hymo_core.checkpoint.load import load_model

    toml = tmp_path / "pipeline.toml"
    toml.write_text("[pretrain]\nnproc = 2\n")
    assert load_config(toml).pretrain.nproc == 2
    config = replace(TINY, nproc=2)
    out = tmp_path / "run" / "08_pretrain"
    out.parent.mkdir()
    manifest = run_pretrain(config, tiny_run / "07_shards", out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["final_step"] == 4 and summary["checkpoint"] == "checkpoints/step-00000004"
    paths = {o.path for o in manifest.files("artifact")}
    assert {"checkpoints/step-00000004/metadata.json", "checkpoints/step-00000004/__0_0.distcp",
            "checkpoints/step-00000004/__1_0.distcp", "checkpoints/step-00000004/.metadata"} <= paths
    assert '"final_step": 4' in capsys.readouterr().out  # rank 0's lines reach the caller's log (Prefect logs prints)
    model, metadata = load_model(out / summary["checkpoint"])
    assert metadata["world_size"] == 2 and sum(p.numel() for p in model.parameters()) == summary["parameters"]
    assert not (tmp_path / "run" / CHECKPOINT_ROOT).exists()


def test_pretrain_stage_trains_and_publishes_the_hybrid(tiny_run: Path, tmp_path: Path):
    """GDN + MLA layers through the same stage: checkpoint, summary, curve; the checkpoint reloads as the hybrid."""
    from dataclasses import replace

    from hymo_core.checkpoint.load import load_model

    config = replace(TINY, model=replace(TINY.model, n_layers=2, layer_pattern="GM"))
    out = tmp_path / "run" / "08_pretrain"
    out.parent.mkdir()
    run_pretrain(config, tiny_run / "07_shards", out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final_step"] == 4 and (out / "loss.png").is_file()
    model, _ = load_model(out / summary["checkpoint"])
    assert [block.kind for block in model.layers] == ["G", "M"]
