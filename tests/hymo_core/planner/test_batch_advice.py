"""`hymo plan batch`: McCandlish's step/token trade-off read from a run's logged noise scale, with the seed's caveat."""
from __future__ import annotations

import json

import pytest

from hymo_core.planner import cli as planner_cli
from hymo_core.planner.batch_advice import CAVEAT, advise, latest_noise_scale


def test_advice_follows_the_step_token_trade_off():
    below = advise(b_noise_tokens=40_000, batch_tokens=10_000)
    assert (below.steps_over_min, below.tokens_over_min) == (5.0, 1.25)
    assert below.lr_factor_at_critical == 2.5  # SGD: (1 + B_noise/B) / 2
    assert "below B_noise" in below.verdict
    assert "above B_noise" in advise(1_000, 10_000).verdict
    assert "near the critical batch" in advise(10_000, 10_000).verdict
    with pytest.raises(ValueError, match="positive noise scale"):
        advise(-1.0, 10)


def test_cli_reads_the_last_positive_estimate_and_states_the_caveat(tmp_path, capsys):
    records = [{"step": 10, "noise_scale": {"b_simple_tokens": None, "b_big_tokens": 512}},
               {"step": 20, "noise_scale": {"b_simple_tokens": 4096.0, "b_big_tokens": 512}},
               {"step": 20, "val_loss": 3.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert latest_noise_scale(tmp_path)["step"] == 20
    assert planner_cli.main(["batch", str(tmp_path), "--peak-lr", "0.004"]) == 0
    out = capsys.readouterr().out
    assert "4,096 tokens" in out and "S/S_min = 1 + B_noise/B = 9.00" in out and "0.018 from peak 0.004" in out
    assert CAVEAT in out.replace("\n", " ") or CAVEAT in out
    (tmp_path / "metrics.jsonl").write_text(json.dumps(records[0]) + "\n")
    with pytest.raises(SystemExit, match="no logged step with a positive noise-scale"):
        planner_cli.main(["batch", str(tmp_path)])


def noisy_records(steps: int, noise: float, seed: int = 0, g_sq: float = 1.0, trace: float = 4096.0) -> list[dict]:
    """Logged records whose two gradient norms come from E|G_B|² = |G|² + tr(Σ)/B (B_simple = 4,096 tokens), plus noise."""
    import numpy as np

    generator = np.random.default_rng(seed)
    rows = []
    for step in range(1, steps + 1):
        small = g_sq + trace / 128 + noise * generator.standard_normal() * trace / 128
        big = g_sq + trace / 512 + noise * generator.standard_normal() * trace / 512
        rows.append({"kind": "train", "step": 10 * step, "noise_scale": {"b_small_tokens": 128, "b_big_tokens": 512, "grad_sq_small": small,
                                                                         "grad_sq_big": big, "b_simple_tokens": 4096.0}})
    return rows


def test_spread_gives_per_step_estimates_and_a_bootstrap_interval_around_the_truth(tmp_path, capsys):
    from hymo_core.planner.batch_advice import noise_scale_spread

    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in noisy_records(30, 0.005)))
    spread = noise_scale_spread(tmp_path, last=20)
    assert spread.steps == list(range(110, 310, 10))  # the last 20 logged steps
    low, high = spread.interval
    assert low < spread.ratio_of_means < high and abs(spread.ratio_of_means / 4096 - 1) < 0.05 and high / low < 1.2
    assert spread.per_step_quartiles[0] <= spread.per_step_median <= spread.per_step_quartiles[1]
    assert planner_cli.main(["batch", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "spread over the last 20 logged steps (steps 110-300)" in out and "90 % bootstrap interval" in out
    assert "not settled" not in out


def test_a_noisy_estimate_says_its_interval_spans_verdicts_and_counts_unbounded_steps(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in noisy_records(20, 0.5, seed=1)))
    assert planner_cli.main(["batch", str(tmp_path), "--batch-tokens", "2048"]) == 0
    out = capsys.readouterr().out
    assert "unbounded" in out and "the advice is not settled" in out
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in noisy_records(2, 0.02)))
    assert planner_cli.main(["batch", str(tmp_path)]) == 0
    assert "has no error bar" in capsys.readouterr().out


def test_the_bootstrap_interval_covers_the_true_noise_scale_about_as_often_as_it_says(tmp_path):
    from hymo_core.planner.batch_advice import noise_scale_spread

    covered = 0
    for seed in range(100):
        path = tmp_path / f"{seed}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in noisy_records(20, 0.02, seed=seed)))
        low, high = noise_scale_spread(path, samples=500, seed=seed).interval
        covered += low <= 4096 <= high
    assert 75 <= covered <= 98  # a 90 % interval from 20 steps: percentile bootstraps run a little narrow
