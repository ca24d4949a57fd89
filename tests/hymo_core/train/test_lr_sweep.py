"""`hymo sweep lr` (hymo_core/train/lr_sweep.py): the fit, its bootstrap, and a tiny sweep through the CLI."""
from __future__ import annotations

import json
import math

from dataclasses import replace

import numpy as np
import pytest

from hymo_core.train.lr_sweep import SWEEP_FILE, SWEEP_PICTURE, bootstrap_optimum, fit_optimum, log_grid, run_sweep
from hymo_core.train.run import load_run_config, run_training

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_quadratic_fit_recovers_the_optimum_and_its_interval_covers_it():
    lrs = np.asarray(log_grid(1e-3, 1e-1, 9))
    x = np.log(lrs)
    true = math.log(8e-3)
    rng = np.random.default_rng(0)
    losses_LSW = 3.0 + 0.05 * (x - true)[:, None, None] ** 2 + rng.normal(0, 0.01, (len(x), 3, 40))
    fit = bootstrap_optimum(x, losses_LSW, draws=200)
    assert fit["bracketed"]
    low, high = fit["interval_log_lr"]
    assert low <= true <= high and high - low < 0.6
    assert abs(fit["log_lr"] - true) < 0.2


def test_optimum_on_the_grid_edge_or_diverged_neighbours_is_not_bracketed():
    x = np.log(np.asarray(log_grid(1e-3, 1e-1, 5)))
    assert not fit_optimum(x, np.asarray([1.0, 2.0, 3.0, 4.0, 5.0]))["bracketed"]  # best at the smallest LR
    fit = fit_optimum(x, np.asarray([5.0, 4.0, 3.0, math.inf, math.inf]))  # best next to a diverged run
    assert not fit["bracketed"] and fit["best_index"] == 2
    assert fit_optimum(x, np.full(5, math.inf))["log_lr"] is None


def test_sweep_lr_cli_trains_each_lr_and_seed_once_and_reuses_finished_runs(tiny_corpus, tmp_path, capsys):
    from flows.cli import main

    recipe = tmp_path / "proxy.toml"
    recipe.write_text("[train]\nbatch_size = 2\nseq_len = 16\nwarmup_steps = 1\nlog_interval = 2\neval_batches = 2\n"
                      "[model]\nd_model = 16\nn_layers = 1\nn_heads = 2\nn_kv_heads = 2\nffn_dim = 32\nmax_seq_len = 16\n"
                      "parametrisation = \"mup\"\n", encoding="utf-8")
    out = tmp_path / "sweep"
    assert main(["sweep", "lr", "--corpus", str(tiny_corpus), "--out", str(out), "--config", str(recipe),
                 "--lrs", "1e-3,1e-2,1e-1", "--seeds", "0", "--max-steps", "4"]) == 0
    result = json.loads((out / SWEEP_FILE).read_text(encoding="utf-8"))
    assert (out / SWEEP_PICTURE).stat().st_size > 0
    assert [(r["lr"], r["seed"]) for r in result["runs"]] == [(1e-3, 0), (1e-2, 0), (1e-1, 0)]
    assert result["windows"] == 4  # 2 batches x 2 windows per run, resampled by the bootstrap
    assert result["optimum_lr"] in (1e-3, 1e-2, 1e-1) or result["bracketed"]
    assert "optimum" in capsys.readouterr().out
    calls = []

    def counting(*args, **kwargs):
        calls.append(args[1])
        return run_training(*args, **kwargs)

    train_config, model_config = load_run_config(recipe)
    train_config = replace(train_config, max_steps=4, checkpoint_interval=4, eval_interval=4)
    again = run_sweep(tiny_corpus, out, train_config, model_config, [1e-3, 1e-2, 1e-1], [0], train=counting, plot=False)
    assert calls == [] and again["mean_loss"] == result["mean_loss"]  # finished runs are scored, not retrained
