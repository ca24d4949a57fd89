"""One writer per --out, an explicit resume, and one exit-code table for every entry point (issue 58, parts 3-4).

Real processes where the property is about processes: two `python -m hymo_core.train` on one directory, and
torchrun's ranks stopped by a NaN injected through a sitecustomize (tests/hymo_core/train/nan_fault.py).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.cli import main
from tests.conftest import TINY_MODEL_KEYS, write_pipeline_config
from tests.hymo_core.train.nan_fault import nan_site, poison

ROOT = Path(__file__).resolve().parents[2]
RECIPE = """
[train]
batch_size = 4
seq_len = 16
max_steps = 30
warmup_steps = 1
log_interval = 1
eval_interval = 10
checkpoint_interval = 10
eval_batches = 2

[model]
""" + TINY_MODEL_KEYS


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    path = tmp_path / "recipe.toml"
    path.write_text(RECIPE)
    return path


def environment(*front: Path) -> dict[str, str]:
    paths = [str(p) for p in front] + [str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "HYMO_PROGRESS": "0", "HYMO_THREADS": "1"}


def test_a_second_training_run_on_one_out_is_refused_naming_the_first(tiny_run: Path, tmp_path: Path, capsys):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(RECIPE.replace("max_steps = 30", "max_steps = 100000").replace("checkpoint_interval = 10", "checkpoint_interval = 100000"))
    out = tmp_path / "out"
    train = [sys.executable, "-m", "hymo_core.train", "--corpus", str(tiny_run), "--config", str(recipe), "--out", str(out), "--cloze", ""]
    first = subprocess.Popen(train, env=environment(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (out / "metrics.jsonl").is_file() or not (out / "metrics.jsonl").read_text():  # training, lock held
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read() if first.poll() is not None else "timeout"
            time.sleep(0.5)
        holder = json.loads((out / ".lock").read_text())
        assert holder["pid"] == first.pid and holder["host"] == socket.gethostname() and holder["since"]
        second = subprocess.run(train + ["--resume-or-start"], env=environment(), cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert second.returncode == 2, second.stderr
        error = second.stderr.strip().splitlines()[-1]
        assert f"pid {first.pid} on {socket.gethostname()} since {holder['since']}" in error, error
        capsys.readouterr()
        assert main(["train", "--corpus", str(tiny_run), "--config", str(recipe), "--out", str(out), "--resume"]) == 2  # `hymo train`
        assert f"pid {first.pid}" in capsys.readouterr().err
        assert first.poll() is None  # the first run was left alone
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    # The OS lock died with its holder: a requeued run takes the directory over (and starts, having no checkpoint).
    assert main(["train", "--corpus", str(tiny_run), "--config", str(recipe), "--out", str(out), "--resume-or-start",
                 "--max-steps", "1"]) == 0


def test_resume_without_a_checkpoint_is_refused_and_resume_or_start_starts(tiny_run: Path, tmp_path: Path, recipe: Path, capsys):
    out = tmp_path / "typo"
    common = ["train", "--corpus", str(tiny_run), "--config", str(recipe), "--out", str(out), "--max-steps", "2"]
    assert main(common + ["--resume"]) == 2
    error = capsys.readouterr().err.strip()
    assert "ResumeRefused" in error and "--resume-or-start" in error and "\n" not in error
    assert not out.exists()  # a mistyped --out is not created
    assert main(common + ["--resume-or-start"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final_step"] == 2 and summary["resumed_from"] is None
    assert main(common[:-1] + ["3", "--resume"]) == 0
    assert json.loads((out / "summary.json").read_text())["resumed_from"].endswith("step-00000002.pt")
    with pytest.raises(SystemExit):  # one or the other
        main(common + ["--resume", "--resume-or-start"])


def test_hymo_train_exits_3_on_a_nan_stop_naming_the_summary(tiny_run: Path, tmp_path: Path, recipe: Path, monkeypatch, capsys):
    from hymo_core.train import run as run_module

    monkeypatch.setattr(run_module, "build_parallel_model", poison(run_module.build_parallel_model, 5))
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["train", "--corpus", str(tiny_run), "--config", str(recipe), "--out", str(out), "--cloze", ""]) == 3
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("stopped: alert 'non-finite loss or gradient' fired at step 5")
    assert line.endswith(str((out / "summary.json").resolve()))
    assert "non-finite" in json.loads((out / "summary.json").read_text())["stopped_by"]


def test_hymo_train_under_torchrun_exits_3_on_a_nan_stop(tiny_run: Path, tmp_path: Path, recipe: Path, monkeypatch, capsys):
    site = nan_site(tmp_path / "site", 5)
    monkeypatch.setenv("PYTHONPATH", environment(site)["PYTHONPATH"])
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["train", "--corpus", str(tiny_run), "--config", str(recipe), "--out", str(out), "--nproc", "2", "--cloze", ""]) == 3
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("stopped: alert 'non-finite loss or gradient' fired at step 5"), line
    assert line.endswith(str((out / "summary.json").resolve()))
    assert json.loads((out / "summary.json").read_text())["world_size"] == 2


def test_hymo_run_exits_3_on_a_nan_stop_naming_the_hidden_summary(tmp_path: Path, monkeypatch, capsys, prefect_harness):
    from hymo_core.train import run as run_module

    monkeypatch.setattr(run_module, "build_parallel_model", poison(run_module.build_parallel_model, 2))
    config = write_pipeline_config(tmp_path)
    run = tmp_path / "run"
    capsys.readouterr()
    assert main(["run", "--config", str(config), "--out", str(run)]) == 3
    line = capsys.readouterr().err.strip().splitlines()[-1]
    summary, = (run / ".pretrain_ckpt").glob("*/summary.json")
    assert line.startswith("stopped: alert 'non-finite loss or gradient' fired at step 2") and line.endswith(str(summary.resolve())), line
