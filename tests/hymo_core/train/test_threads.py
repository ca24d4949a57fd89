"""The trainer's thread count comes from hymo_core/threads.py's one policy: chosen, applied, logged, recorded, handed to ranks."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

import hymo_core.threads as threads_module
from hymo_core.distributed import launch
from hymo_core.models.model import ModelConfig
from hymo_core.threads import choose_threads, usable_cpus
from hymo_core.train.config import SAMPLE_TRAIN
from hymo_core.train.run import main, run_training
from tests.conftest import write_corpus

MODEL = ModelConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, ffn_dim=64, max_seq_len=16)
RECIPE = replace(SAMPLE_TRAIN, batch_size=4, seq_len=16, max_steps=2, warmup_steps=1, log_interval=1, eval_interval=2,
                 checkpoint_interval=2, eval_batches=1, peak_lr=1e-2)
POLICY_VARIABLES = ("HYMO_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "LOCAL_WORLD_SIZE")


@pytest.fixture
def clean_environment(monkeypatch):
    for name in POLICY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_precedence_is_flag_then_hymo_threads_then_omp_then_cpus_over_ranks(monkeypatch):
    monkeypatch.setattr(threads_module, "usable_cpus", lambda: 8)  # a machine with 8 usable CPUs
    both = {"HYMO_THREADS": "3", "OMP_NUM_THREADS": "5"}
    assert choose_threads(2, ranks=4, environ=both).to_json() == {"threads": 2, "source": "--threads", "cpus": 8, "ranks": 4}
    assert choose_threads(None, ranks=4, environ=both).threads == 3
    assert choose_threads(None, ranks=4, environ={"OMP_NUM_THREADS": "5"}).source == "OMP_NUM_THREADS"
    assert choose_threads(None, ranks=4, environ={}).to_json() == {"threads": 2, "source": "cpus/ranks", "cpus": 8, "ranks": 4}
    assert choose_threads(None, ranks=16, environ={}).threads == 1  # never 0
    with pytest.raises(ValueError, match="HYMO_THREADS='two'"):
        choose_threads(None, environ={"HYMO_THREADS": "two"})


def ranks_environment(monkeypatch, nproc: int, env: dict[str, str], threads: int | None = None) -> dict[str, str]:
    """What `launch_training` starts torchrun with (the process group itself is not started here)."""
    seen: dict[str, str] = {}

    def capture(command, on_line, env=None, cwd=None, keep_lines=40):
        seen.update(env)

    monkeypatch.setattr(launch, "run_process_group", capture)
    launch.launch_training(nproc, ["--out", "unused"], env=env, logs=None, threads=threads)
    return seen


def test_each_of_n_ranks_gets_the_usable_cpus_over_n(clean_environment, tmp_path):
    clean_environment.setattr(threads_module, "usable_cpus", lambda: 8)
    clean_environment.chdir(tmp_path)
    assert ranks_environment(clean_environment, 2, {})["OMP_NUM_THREADS"] == "4"
    assert ranks_environment(clean_environment, 4, {})["OMP_NUM_THREADS"] == "2"
    # The user's word wins over the division: --threads, then HYMO_THREADS, then OMP_NUM_THREADS.
    assert ranks_environment(clean_environment, 2, {"OMP_NUM_THREADS": "3"})["OMP_NUM_THREADS"] == "3"
    assert ranks_environment(clean_environment, 2, {"HYMO_THREADS": "1", "OMP_NUM_THREADS": "3"})["OMP_NUM_THREADS"] == "1"
    given = ranks_environment(clean_environment, 2, {"HYMO_THREADS": "1"}, threads=3)
    assert given["OMP_NUM_THREADS"] == given["HYMO_THREADS"] == "3"  # a rank re-running the policy finds --threads' count


def test_a_run_applies_logs_and_records_its_choice_and_restores_the_process(clean_environment, tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    torch.set_num_threads(2)
    during: list[int] = []
    messages: list[str] = []
    summary = run_training(corpus, tmp_path / "run", RECIPE, MODEL, resume=False, cloze_path=None, progress=False,
                           log=messages.append, report=lambda row: during.append(torch.get_num_threads()), threads=1)
    assert set(during) == {1}  # the training ran on the chosen count
    assert summary["threads"] == {"threads": 1, "source": "--threads", "cpus": usable_cpus(), "ranks": 1}
    assert [m for m in messages if m.startswith("threads:")] == [f"threads: 1 thread (--threads; {usable_cpus()} usable CPUs, 1 rank)"]
    assert torch.get_num_threads() == 2 and "OMP_NUM_THREADS" not in __import__("os").environ  # the caller's process as it was


def test_the_environment_decides_without_a_flag_and_the_module_takes_threads(clean_environment, tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus")
    clean_environment.setenv("OMP_NUM_THREADS", "1")
    summary = run_training(corpus, tmp_path / "env", RECIPE, MODEL, resume=False, cloze_path=None, progress=False, log=lambda *_: None)
    assert summary["threads"]["source"] == "OMP_NUM_THREADS" and summary["threads"]["threads"] == 1
    clean_environment.setenv("HYMO_THREADS", "1")
    config = tmp_path / "recipe.toml"
    config.write_text("[train]\nbatch_size = 4\nseq_len = 16\nmax_steps = 2\nwarmup_steps = 1\neval_batches = 1\n"
                      "[model]\nd_model = 32\nn_layers = 1\nn_heads = 2\nn_kv_heads = 2\nffn_dim = 64\nmax_seq_len = 16\n")
    assert main(["--corpus", str(corpus), "--out", str(tmp_path / "cli"), "--config", str(config), "--threads", "1"]) == 0
    recorded = json.loads((tmp_path / "cli" / "summary.json").read_text())["threads"]
    assert recorded["source"] == "--threads" and recorded["threads"] == 1
    assert "threads: 1 thread (--threads" in capsys.readouterr().out
