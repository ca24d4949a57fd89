"""Where users look at a run: `hymo report` in a real headless Chromium, `hymo average`, and `hymo eval A B` paired."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from flows.cli import main
from tests.conftest import TINY_MODEL_KEYS

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

RECIPE = """
[train]
batch_size = 4
seq_len = 16
max_steps = 24
horizon_steps = 48
warmup_steps = 2
log_interval = 2
eval_interval = 4
checkpoint_interval = 8
keep_checkpoints = 3
eval_batches = 2
peak_lr = 0.01

[model]
""" + TINY_MODEL_KEYS + """
[[alerts]]
name = "loss above zero"
metric = "loss"
condition = "> 0"
window = 1
action = "log"
"""


@pytest.fixture(scope="module")
def trained(tiny_run: Path, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("watch")
    (root / "recipe.toml").write_text(RECIPE)
    assert main(["train", "--corpus", str(tiny_run), "--config", str(root / "recipe.toml"), "--out", str(root / "out"), "--cloze", ""]) == 0
    return root / "out"


def test_summary_and_metrics_carry_groups_forecast_and_alerts(trained: Path):
    summary = json.loads((trained / "summary.json").read_text())
    assert {"source:prose", "source:mixed"} <= set(summary["final_val_groups"]) and summary["final_val_bpb"] > 0
    forecast = summary["forecast"]
    assert forecast["points"] == 6 and forecast["low"] <= forecast["forecast"] <= forecast["high"]
    assert forecast["target_tokens"] == 48 * 4 * 16  # the horizon: past the last evaluation (24), so a forecast is due
    assert summary["alerts"] and {a["alert"] for a in summary["alerts"]} == {"loss above zero"}
    assert (trained / "heldout.png").stat().st_size > 1000
    kinds = [json.loads(line)["kind"] for line in (trained / "metrics.jsonl").read_text().splitlines()]
    assert kinds.count("alert") == 12 and kinds.count("eval") == 6


def test_tensorboard_shows_the_runs_scalars_per_source_too(trained: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(trained), size_guidance={"scalars": 0})
    accumulator.Reload()
    tags = set(accumulator.Tags()["scalars"])
    assert {"heldout/source:prose", "heldout/source:mixed", "eval/loss", "train/loss", "throughput/tokens_per_s"} <= tags
    evals = [json.loads(line) for line in (trained / "metrics.jsonl").read_text().splitlines() if '"eval"' in line]
    prose = [(e.step, e.value) for e in accumulator.Scalars("heldout/source:prose")]
    assert [s for s, _ in prose] == [r["step"] for r in evals]
    assert [v for _, v in prose] == pytest.approx([r["groups"]["source:prose"]["loss"] for r in evals], rel=1e-6)


@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(flag)
    options.binary_location = CHROMIUM
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def test_report_page_shows_per_source_curves_and_the_forecast(trained: Path, browser, capsys):
    from selenium.webdriver.common.by import By

    assert main(["report", str(trained)]) == 0
    page = trained / "report.html"
    assert f"wrote {page}" in capsys.readouterr().out
    browser.get(page.resolve().as_uri())
    images = browser.find_elements(By.TAG_NAME, "img")
    assert images[0].get_attribute("id") == "training-loss"  # the training-loss curve comes first
    for element_id in ("training-loss", "per-group-curves", "forecast", "signals"):
        image = browser.find_element(By.ID, element_id)
        assert image.tag_name == "img"
        # Decoded and laid out by the browser: a broken or empty PNG has no natural width.
        assert browser.execute_script("return arguments[0].complete && arguments[0].naturalWidth", image) > 300
    text = browser.find_element(By.TAG_NAME, "body").text
    assert "source:prose" in text and "source:mixed" in text and "lang:" in text  # the per-group table
    assert "planned tokens" in text and "How the forecast moves with the fit window" in text
    assert "loss above zero" in text  # the alerts table names each firing and its action


def test_average_and_paired_eval(trained: Path, tiny_run: Path, tmp_path: Path, capsys):
    checkpoints = sorted(str(p) for p in (trained / "checkpoints").glob("step-*.pt"))
    assert len(checkpoints) == 3
    out = tmp_path / "avg.pt"
    assert main(["average", *checkpoints, "--out", str(out)]) == 0
    averaged = torch.load(out, weights_only=True)
    states = [torch.load(p, weights_only=True)["model"] for p in checkpoints]
    name = "layers.0.ffn.w1.weight" if "layers.0.ffn.w1.weight" in averaged["model"] else next(iter(averaged["model"]))
    assert torch.allclose(averaged["model"][name], sum(s[name] for s in states) / 3, atol=1e-6)
    assert [row["weight"] for row in averaged["averaged_from"]] == pytest.approx([1 / 3] * 3)
    assert main(["average", *checkpoints[-2:], "--out", str(tmp_path / "ema.pt"), "--mode", "ema", "--decay", "0.5"]) == 0
    capsys.readouterr()
    assert main(["eval", checkpoints[-1], str(out), "--corpus", str(tiny_run), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    comparison = result["comparisons"][0]["held_out_loss"]
    assert comparison["n"] == result["windows"] > 0 and comparison["stderr"] >= 0
    losses = [row["val_loss"] for row in result["checkpoints"]]
    assert comparison["mean"] == pytest.approx(losses[1] - losses[0], abs=1e-9)  # same windows: paired mean = difference of means
    assert main(["eval", checkpoints[-1], str(out), "--corpus", str(tiny_run)]) == 0
    assert "paired" in capsys.readouterr().out


def test_average_refuses_another_layout(trained: Path, tmp_path: Path):
    from hymo_core.checkpoint.average import average_checkpoints
    from hymo_core.checkpoint.common import CheckpointError, model_from_config

    checkpoint = sorted((trained / "checkpoints").glob("step-*.pt"))[-1]
    payload = torch.load(checkpoint, weights_only=True)
    payload["model_config"] = {**payload["model_config"], "ffn_dim": 96}
    payload["model"] = model_from_config(payload["model_config"]).state_dict()
    other = tmp_path / "other.pt"
    torch.save(payload, other)
    with pytest.raises(CheckpointError, match="model config differs .*ffn_dim"):
        average_checkpoints([checkpoint, other], tmp_path / "never.pt")
