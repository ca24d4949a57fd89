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
