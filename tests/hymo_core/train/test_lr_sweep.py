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
    v_low, v_high = fit["vertex_interval_log_lr"]
    assert v_low <= true <= v_high and v_high - v_low < 0.6  # the parabola's own interval, when the curve is one
    # What the grid shows without assuming the shape: between the best point's neighbours, no more, when the best is stable.
    step = x[1] - x[0]
    assert low <= true <= high and high - low == pytest.approx(2 * step) and fit["open_ends"] == [False, False]
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


def asymmetric_sweep(seed: int, true: float) -> tuple[np.ndarray, np.ndarray]:
    """A realistic LR curve: a slow rise below the optimum, a steep one above it (9 points, 2 seeds, 16 windows)."""
    x = np.log(np.asarray(log_grid(1e-3, 1e-1, 9)))
    curve = 3.0 + np.where(x < true, 0.01 * (true - x) ** 2, 0.2 * (x - true) ** 2)
    return x, curve[:, None, None] + np.random.default_rng(seed).normal(0, 0.01, (len(x), 2, 16))


def test_the_interval_covers_an_asymmetric_curves_optimum_that_the_vertex_misses():
    true = math.log(8e-3)
    covered = vertex_covered = 0
    for seed in range(20):
        x, losses_LSW = asymmetric_sweep(seed, true)
        fit = bootstrap_optimum(x, losses_LSW, draws=200, seed=seed)
        low, high = fit["interval_log_lr"]
        covered += low <= true <= high
        v_low, v_high = fit["vertex_interval_log_lr"]
        vertex_covered += v_low <= true <= v_high
        assert low <= v_low and v_high <= high and fit["open_ends"] == [False, False]
    assert covered == 20 and vertex_covered < 10  # the parabola's own interval is biased; the bracket is not


def test_the_interval_reaches_past_the_neighbours_when_resampling_moves_the_best_point_and_flags_an_open_end():
    x = np.log(np.asarray(log_grid(1e-3, 1e-1, 9)))
    rng = np.random.default_rng(3)
    flat = 3.0 + 0.002 * (x - x[4]) ** 2  # a basin much flatter than the noise
    fit = bootstrap_optimum(x, flat[:, None, None] + rng.normal(0, 0.02, (9, 2, 8)), draws=300)
    low, high = fit["interval_log_lr"]
    best = fit["best_index"]
    step = x[1] - x[0]
    assert high - low > 2 * step + 1e-9  # wider than the best point's two neighbours
    assert low < x[max(best - 1, 0)] - 1e-9 or high > x[min(best + 1, 8)] + 1e-9
    falling = 3.0 - 0.05 * (x - x[0])  # the loss still falls at the largest LR: the optimum is above the grid
    falling[-2] = falling[-1] - 0.001  # ...though the mean's best point is just inside it
    edge = bootstrap_optimum(x, falling[:, None, None] + rng.normal(0, 0.01, (9, 2, 8)), draws=300)
    assert edge["open_ends"][1] and edge["edge_fraction"][1] > 0.025 and edge["interval_log_lr"][1] == pytest.approx(x[-1])
