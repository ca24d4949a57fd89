"""`hymo report`'s page: the training-loss curve first, the window mean and the last update's loss labelled apart,
and a forecast band drawn only when the forecast has one (none at all with too few evaluations)."""
from __future__ import annotations

import json
import math
from pathlib import Path

from hymo_core.train.forecast import forecast_loss
from hymo_core.train.run_report import (LAST_UPDATE_LABEL, WINDOW_MEAN_LABEL, forecast_band, forecast_figure, render_report,
                                         training_loss_figure)


def records(evaluations: int) -> list[dict]:
    rows = []
    for step in range(10, 110, 10):
        rows.append({"kind": "train", "step": step, "loss": 6.0 - step / 50, "last_loss": 6.1 - step / 50, "lr": {"adamw": 1e-3},
                     "grad_norm_pre_clip": 1.0, "tokens_per_s": 100.0})
    for index in range(evaluations):
        step = 100 * (index + 1) // evaluations
        rows.append({"kind": "eval", "step": step, "val_loss": 3.0 + 2.0 * (step * 512) ** -0.3 + 0.01 * (-1) ** index,
                     "tokens_seen": step * 512})
    return rows


def write_run(directory: Path, rows: list[dict], planned_steps: int = 400) -> Path:
    directory.mkdir(parents=True)
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"final_step": 100, "final_train_loss": rows[9]["last_loss"], "ln_vocab": math.log(4096),
               "train_config": {"max_steps": planned_steps, "batch_size": 8, "seq_len": 64, "gradient_accumulation_steps": 1},
               "threads": {"threads": 1, "source": "cpus/ranks", "cpus": 2, "ranks": 2}, "world_size": 2}
    (directory / "summary.json").write_text(json.dumps(summary))
    return directory


def legend_labels(figure) -> list[str]:
    return [text.get_text() for axis in figure.axes if axis.get_legend() for text in axis.get_legend().get_texts()]


def test_training_loss_comes_first_with_the_window_mean_and_the_last_update_labelled_apart(tmp_path):
    figure = training_loss_figure(records(2), math.log(4096))
    labels = legend_labels(figure)
    assert f"{WINDOW_MEAN_LABEL} (10 updates)" in labels and LAST_UPDATE_LABEL in labels and "held-out loss" in labels
    page = render_report(write_run(tmp_path / "run", records(2)))
    first_image = page.index("<img id=")
    assert page.index("<img id='training-loss'") == first_image  # the first picture on the page
    assert page.index("Training loss") < page.index("Held-out loss per source")
    assert "the last update&#x27;s batch alone" in page and "mean of the last logged window" in page
    assert "1 (cpus/ranks; 2 usable CPUs, 2 rank(s), world size 2)" in page  # the thread choice the run recorded


def test_no_forecast_and_no_band_with_too_few_evaluations_but_the_points_are_shown(tmp_path):
    page = render_report(write_run(tmp_path / "run", records(3)))
    assert "id='no-forecast'" in page and "90 % band" not in page
    figure = forecast_figure(records(3), None)
    assert not figure.axes[0].collections and legend_labels(figure) == ["held-out loss"]  # no band, no fit


def test_a_band_is_drawn_only_when_the_forecast_has_one():
    rows = records(8)
    evals = [r for r in rows if r["kind"] == "eval"]
    fitted = forecast_loss([r["tokens_seen"] for r in evals], [r["val_loss"] for r in evals], 400 * 512)
    assert forecast_band(fitted) is not None
    banded = forecast_figure(rows, fitted)
    assert banded.axes[0].collections and "90 % band" in legend_labels(banded)
    result, _ = fitted
    for without in ((result, None), (type(result)(**{**result.__dict__, "low": result.forecast, "high": result.forecast}), fitted[1])):
        assert forecast_band(without) is None  # no bootstrap fits, or a zero-width interval: not a band
        figure = forecast_figure(rows, without)
        assert "90 % band" not in legend_labels(figure) and any("(no band)" in label for label in legend_labels(figure))


def test_the_page_says_progress_eta_lr_throughput_checkpoints_parameters_recipe_and_memory_in_gib(tmp_path):
    """Issue 58: what decides whether to continue a run; peak memory printed as raw bytes (824139776) before."""
    rows = records(2)
    for row in rows:
        if row["kind"] == "train":
            row.update(peak_memory_bytes=824139776, peak_memory_kind="process_peak_rss")
    rows.append({"kind": "note", "step": 60, "alert": "gradient-norm spike", "metric": "grad_norm_pre_clip", "value": 4.7,
                 "statistic": 19.6, "condition": "zscore > 6", "action": "log", "note": "recovered by step 70", "judged_at": 70})
    run = write_run(tmp_path / "run", rows)
    summary = json.loads((run / "summary.json").read_text())
    summary.update(parameters=1_891_608, session_seconds=75.0, model_config={"d_model": 128, "n_layers": 2})
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "checkpoints.json").write_text(json.dumps({
        "best": {"path": "step-00000050.pt", "step": 50, "val_loss": 3.21},
        "checkpoints": ["step-00000050.pt", "step-00000100.pt"], "latest": "step-00000100.pt"}))
    page = render_report(run)
    assert "step 100 of 400 planned (25.0 %)" in page
    # 300 updates x 512 tokens at 100 tokens/s
    assert "ETA at the recent tokens/s" in page and "0 h" not in page and "25 min 36 s for 300 updates at 100 tokens/s" in page
    assert "training time (logged windows)" in page and "wall time of the last session</td><td>1 min 15 s" in page
    assert "adamw 0.001" in page and "1,891,608" in page
    assert "0.77 GiB" in page and "824139776" not in page
    assert "<td>step-00000050.pt</td><td>best</td><td>3.21</td>" in page and "<td>step-00000100.pt</td><td></td><td></td><td>latest</td>" in page
    assert "id='schedule'" in page and "id='recipe'" in page and "train.max_steps" in page and "model.d_model" in page
    assert "recovered by step 70" in page and "No alert fired." in page
