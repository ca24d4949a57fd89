"""`hymo report RUN`: one HTML page a person looks at instead of reading metrics.jsonl.

Everything comes from the training directory (metrics.jsonl, summary.json):
the training-loss curve first (the logged window mean and the logging update's
own loss, labelled apart), held-out loss per source and per language, the loss
forecast at the planned token budget (its band only where the forecast has one), the run signals (gradient and
update norms, clip fraction, activation RMS, log-Z, attention logits, memory,
data wait), tokens per source, and every alert with the action it took. Above
them, what decides whether to continue (issue 58): progress against the planned
steps and the ETA, training and wall time, the learning rate and tokens/s over
time, parameters, peak memory in GiB, the checkpoints with the best one; below,
the notes (information: recovered spikes, losses below the forecast band) and
the recipe. The
plots are matplotlib PNGs embedded in the page, so the file travels alone.
"""
from __future__ import annotations

import base64
import html
import io
import json
import math
from pathlib import Path
from typing import Any

from hymo_core.train.forecast import MIN_FORECAST_POINTS, forecast_if_due

REPORT_FILE = "report.html"
HELDOUT_PICTURE = "heldout.png"


def read_records(run: Path) -> list[dict[str, Any]]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        raise ValueError(f"{run}: no metrics.jsonl (give a training output directory, e.g. RUN/NN_pretrain or --out of hymo train)")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def planned_tokens(summary: dict[str, Any]) -> float | None:
    config = summary.get("train_config") or {}
    steps = config.get("horizon_steps") or config.get("max_steps")
    per_update = (config.get("batch_size") or 0) * (config.get("seq_len") or 0) * (config.get("gradient_accumulation_steps") or 1)
    return float(steps * per_update) if steps and per_update else None


def run_forecast(records: list[dict[str, Any]], target: float | None) -> tuple[Any, Any] | None:
    evals = [r for r in records if r.get("kind") == "eval" and r.get("tokens_seen") and math.isfinite(r.get("val_loss", math.nan))]
    return forecast_if_due([r["tokens_seen"] for r in evals], [r["val_loss"] for r in evals], target)  # None: too few, or observed


def _figure(width: float = 7.5, height: float = 4.2):
    from matplotlib.figure import Figure  # no pyplot: no global state shared with another thread's plot

    figure = Figure(figsize=(width, height), dpi=100)
    return figure


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.tight_layout()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def plot_groups(records: list[dict[str, Any]]) -> bytes | None:
    evals = [r for r in records if r.get("kind") == "eval" and r.get("groups")]
    if not evals:
        return None
    figure = _figure(9, 4.2)
    source_axis, lang_axis = figure.subplots(1, 2, sharey=True)
    names = sorted({name for r in evals for name in r["groups"]})
    steps_all = [r["step"] for r in evals]
    for axis, prefix in ((source_axis, "source:"), (lang_axis, "lang:")):
        axis.plot(steps_all, [r["val_loss"] for r in evals], color="black", linestyle=":", label="all")
        for name in (n for n in names if n.startswith(prefix)):
            rows = [r for r in evals if name in r["groups"]]
            axis.plot([r["step"] for r in rows], [r["groups"][name]["loss"] for r in rows], marker="o", markersize=3, label=name.removeprefix(prefix))
        axis.set_title(f"held-out loss per {prefix.rstrip(':')}")
        axis.set_xlabel("successful update")
        axis.legend(fontsize=7)
    source_axis.set_ylabel("cross-entropy (nats / token)")
    return _png(figure)


WINDOW_MEAN_LABEL = "training loss: mean over each logged window"
LAST_UPDATE_LABEL = "training loss: the logging update's batch alone"


def training_loss_figure(records: list[dict[str, Any]], ln_vocab: float | None = None):
    """The training-loss curve: the logged window mean as a line, the logging update's own loss (what
    summary.json's final_train_loss is) as separate markers, the held-out loss, and ln V for reference."""
    rows = [r for r in records if r.get("kind") == "train" and _finite(r.get("loss"))]
    if not rows:
        return None
    figure = _figure(9, 4.5)
    axis = figure.subplots()
    window = max(1, rows[0]["step"]) if len(rows) < 2 else rows[1]["step"] - rows[0]["step"]
    axis.plot([r["step"] for r in rows], [r["loss"] for r in rows], color="tab:blue", label=f"{WINDOW_MEAN_LABEL} ({window} updates)")
    last = [(r["step"], r["last_loss"]) for r in rows if _finite(r.get("last_loss"))]
    if last:
        axis.plot(*zip(*last), ".", color="tab:cyan", markersize=4, label=LAST_UPDATE_LABEL)
    evals = [(r["step"], r["val_loss"]) for r in records if r.get("kind") == "eval" and _finite(r.get("val_loss"))]
    if evals:
        axis.plot(*zip(*evals), "o-", color="tab:orange", markersize=3, label="held-out loss")
    if ln_vocab:
        axis.axhline(ln_vocab, linestyle=":", color="grey", label=f"ln V = {ln_vocab:.2f} (a uniform guess)")
    axis.set_xlabel("successful update")
    axis.set_ylabel("cross-entropy (nats / token)")
    axis.legend(fontsize=7)
    return figure


def plot_training_loss(records: list[dict[str, Any]], ln_vocab: float | None = None) -> bytes | None:
    figure = training_loss_figure(records, ln_vocab)
    return None if figure is None else _png(figure)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def forecast_band(fitted: tuple[Any, Any] | None) -> tuple[Any, Any] | None:
    """(the forecast's interval at the target, the band along D) when the forecast has one, else None: a
    forecast without a band, or with a degenerate one, is drawn as a curve alone."""
    if fitted is None:
        return None
    result, fits = fitted
    low, high = getattr(result, "low", None), getattr(result, "high", None)
    if fits is None or not hasattr(fits, "band") or not (_finite(low) and _finite(high)) or not high > low:
        return None
    return (low, high), fits.band


def forecast_figure(records: list[dict[str, Any]], fitted: tuple[Any, Any] | None):
    """The held-out points against tokens seen; with a forecast, the fitted L(D) and (only when one exists) its band."""
    import numpy as np

    evals = [r for r in records if r.get("kind") == "eval" and r.get("tokens_seen") and _finite(r.get("val_loss"))]
    if not evals:
        return None
    figure = _figure()
    axis = figure.subplots()
    x = np.array([r["tokens_seen"] for r in evals], dtype=float)
    axis.plot(x, [r["val_loss"] for r in evals], "o", color="tab:orange", label="held-out loss")
    ema = [(t, r["ema_val_loss"]) for t, r in zip(x, evals) if r.get("ema_val_loss") is not None]
    if ema:  # TrainConfig.ema_decay: the EMA weights on the same windows
        axis.plot(*zip(*ema), "x", color="tab:green", label="held-out loss, EMA weights")
    if fitted is not None:
        result = fitted[0]
        grid = np.geomspace(x.min(), max(result.target_tokens, x.max()), 80)
        axis.plot(grid, result.fit(grid), color="tab:blue", label=f"L(D) = {result.fit.l_inf:.3f} + a D^-{result.fit.gamma:.3f}")
        band = forecast_band(fitted)
        label = f"forecast at planned {result.target_tokens:,.0f} tokens"
        if band is not None:
            (low, high), band_at = band
            bands = np.array([band_at(t) for t in grid])
            axis.fill_between(grid, bands[:, 0], bands[:, 1], color="tab:blue", alpha=0.2, label="90 % band")
            axis.errorbar([result.target_tokens], [result.forecast], yerr=[[result.forecast - low], [high - result.forecast]],
                          fmt="s", color="tab:red", capsize=4, label=label)
        else:
            axis.plot([result.target_tokens], [result.forecast], "s", color="tab:red", label=f"{label} (no band)")
    axis.set_xscale("log")
    axis.set_xlabel("tokens seen D")
    axis.set_ylabel("held-out loss")
    axis.legend(fontsize=7)
    return figure


def plot_forecast(records: list[dict[str, Any]], fitted: tuple[Any, Any] | None) -> bytes | None:
    figure = forecast_figure(records, fitted)
    return None if figure is None else _png(figure)


def plot_signals(records: list[dict[str, Any]]) -> bytes | None:
    rows = [r for r in records if r.get("kind") == "train"]
    if not rows:
        return None
    figure = _figure(11, 6.5)
    axes = figure.subplots(2, 3).flatten()
    steps = [r["step"] for r in rows]

    def series(axis, title, getter, label=None):
        values = [getter(r) for r in rows]
        pairs = [(s, v) for s, v in zip(steps, values) if isinstance(v, (int, float)) and math.isfinite(v)]
        if pairs:
            axis.plot(*zip(*pairs), label=label)
        axis.set_title(title, fontsize=9)

    series(axes[0], "gradient norm (pre-clip)", lambda r: r.get("grad_norm_pre_clip"))
    series(axes[1], "clip fraction", lambda r: r.get("clip_fraction"))
    for group in sorted({g for r in rows for g in (r.get("update_rms_ratio") or {})}):
        series(axes[2], "update RMS / weight RMS", lambda r, g=group: (r.get("update_rms_ratio") or {}).get(g), group)
    for block in sorted({b for r in rows for b in (r.get("activation_rms") or {})}, key=lambda b: int(b.split("_")[-1])):
        series(axes[3], "activation RMS per block", lambda r, b=block: (r.get("activation_rms") or {}).get(b), block)
    series(axes[4], "log-Z and max attention logit", lambda r: r.get("log_z"), "log-Z")
    series(axes[4], "log-Z and max attention logit", lambda r: r.get("max_attention_logit"), "max attention logit")
    series(axes[5], "data wait fraction", lambda r: r.get("data_wait_fraction"))
    for axis in axes:
        axis.set_xlabel("update", fontsize=8)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=6)
    return _png(figure)


def plot_schedule(records: list[dict[str, Any]]) -> bytes | None:
    """The learning rate per optimizer group and tokens/s against the update: the two curves that say where the run is."""
    rows = [r for r in records if r.get("kind") == "train"]
    if not rows:
        return None
    figure = _figure(11, 3.4)
    lr_axis, speed_axis = figure.subplots(1, 2)
    for group in sorted({g for r in rows if isinstance(r.get("lr"), dict) for g in r["lr"]}):
        pairs = [(r["step"], r["lr"][group]) for r in rows if isinstance(r.get("lr"), dict) and group in r["lr"]]
        lr_axis.plot(*zip(*pairs), label=group)
    lr_axis.set_title("learning rate per group", fontsize=9)
    if lr_axis.get_legend_handles_labels()[0]:
        lr_axis.legend(fontsize=6)
    speed = [(r["step"], r["tokens_per_s"]) for r in rows if isinstance(r.get("tokens_per_s"), (int, float))]
    if speed:
        speed_axis.plot(*zip(*speed))
    speed_axis.set_title("tokens/s per logged window", fontsize=9)
    for axis in (lr_axis, speed_axis):
        axis.set_xlabel("update", fontsize=8)
    return _png(figure)


def gib(value: Any) -> str | None:
    """Bytes as GiB for a person (the records keep bytes)."""
    return f"{value / 2**30:.2f} GiB" if isinstance(value, (int, float)) else None


def duration(seconds: float | None) -> str | None:
    if seconds is None or not math.isfinite(seconds):
        return None
    hours, rest = divmod(int(round(seconds)), 3600)
    return f"{hours} h {rest // 60:02d} min" if hours else f"{rest // 60} min {rest % 60:02d} s"


def progress_facts(summary: dict[str, Any], trains: list[dict[str, Any]]) -> list[list[Any]]:
    """Step against the planned steps, the ETA at the recent tokens/s, wall and training time, learning rate, parameters."""
    config = summary.get("train_config") or {}
    step = summary.get("final_step", trains[-1]["step"] if trains else 0) or 0
    planned = config.get("horizon_steps") or config.get("max_steps")
    per_update = (config.get("batch_size") or 0) * (config.get("seq_len") or 0) * (config.get("gradient_accumulation_steps") or 1)
    facts: list[list[Any]] = []
    if planned:
        facts.append(["progress", f"step {step:,} of {planned:,} planned ({100 * step / planned:.1f} %)"])
    recent = sorted(r["tokens_per_s"] for r in trains[-5:] if isinstance(r.get("tokens_per_s"), (int, float)) and r["tokens_per_s"] > 0)
    if planned and per_update and recent and step < planned:
        speed = recent[len(recent) // 2]
        facts.append(["ETA at the recent tokens/s", f"{duration((planned - step) * per_update / speed)} for {planned - step:,} updates "
                                                     f"at {speed:,.0f} tokens/s (median of the last {len(recent)} logs)"])
    elif planned and step >= planned:
        facts.append(["ETA at the recent tokens/s", "done"])
    if per_update and trains:
        spans, previous = [], 0
        for row in trains:
            if isinstance(row.get("tokens_per_s"), (int, float)) and row["tokens_per_s"] > 0:
                spans.append((row["step"] - previous) * per_update / row["tokens_per_s"])
            previous = row["step"]
        facts.append(["training time (logged windows)", duration(sum(spans))])
    if summary.get("session_seconds") is not None:
        facts.append(["wall time of the last session", duration(summary["session_seconds"])])
    if trains and isinstance(trains[-1].get("lr"), dict):
        facts.append(["learning rate (latest log)", ", ".join(f"{g} {v:.3g}" for g, v in sorted(trains[-1]["lr"].items()))])
    if summary.get("parameters"):
        facts.append(["parameters", f"{summary['parameters']:,}"])
    if trains and trains[-1].get("peak_memory_bytes") is not None:
        facts.append(["peak memory (latest log window)", f"{gib(trains[-1]['peak_memory_bytes'])} ({trains[-1].get('peak_memory_kind', '')})"])
    return facts


def checkpoint_rows(run: Path, summary: dict[str, Any]) -> tuple[list[list[Any]], str | None]:
    """The checkpoints the run's index keeps, the best (lowest held-out loss) marked; and the index's path."""
    from hymo_core.checkpoint.common import INDEX_FILE

    candidates = [run / "checkpoints"]
    if summary.get("checkpoint"):
        latest = Path(summary["checkpoint"])
        candidates = [latest.parent, run / latest.parent] + candidates
    for directory in candidates:
        index_path = directory / INDEX_FILE
        if index_path.is_file():
            index = json.loads(index_path.read_text(encoding="utf-8"))
            best = (index.get("best") or {}).get("path")
            rows = [[name, "best" if name == best else "", (index["best"] or {}).get("val_loss") if name == best else None,
                     "latest" if name == index.get("latest") else ""] for name in index.get("checkpoints", [])]
            return rows, str(index_path)
    return [], None


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.4g}"
        return html.escape("" if value is None else str(value))

    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _image(data: bytes | None, alt: str, element_id: str) -> str:
    if data is None:
        return f"<p id='{element_id}'>(no data for: {html.escape(alt)})</p>"
    return f"<img id='{element_id}' alt='{html.escape(alt)}' src='data:image/png;base64,{base64.b64encode(data).decode()}'>"


def write_group_plot(records: list[dict[str, Any]], path: Path) -> Path | None:
    """heldout.png beside loss.png: each source's and language's held-out curve (nothing without groups)."""
    data = plot_groups(records)
    if data is None:
        return None
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_bytes(data)
    temporary.replace(path)
    return path


def render_report(run: str | Path) -> str:
    run = Path(run)
    records = read_records(run)
    summary_path = run / "summary.json"
    summary = json.loads(summary_path.read_text(encoding="utf-8")) if summary_path.is_file() else {}
    fitted = run_forecast(records, planned_tokens(summary))
    evals = [r for r in records if r.get("kind") == "eval"]
    trains = [r for r in records if r.get("kind") == "train"]
    alerts = [r for r in records if r.get("kind") == "alert"]
    notes = [r for r in records if r.get("kind") == "note"]  # information: recovered spikes, losses below the forecast band
    parts = [f"<h1>HyMo training run <code>{html.escape(str(run.resolve()))}</code></h1>"]
    facts = [["final step", summary.get("final_step", trains[-1]["step"] if trains else None)],
             ["tokens seen", summary.get("tokens_seen")],
             ["final train loss, mean of the last logged window", trains[-1].get("loss") if trains else None],
             ["final train loss, the last update's batch alone", summary.get("final_train_loss", trains[-1].get("last_loss") if trains else None)],
             ["final held-out loss", summary.get("final_val_loss")], ["skipped updates", summary.get("skipped_updates")],
             ["alerts fired", len(alerts)], ["notes (information, no alarm)", len(notes)]]
    facts[1:1] = progress_facts(summary, trains)
    if summary.get("final_ema_val_loss") is not None:
        facts.insert(5, ["final held-out loss, EMA weights (ema.pt)", summary["final_ema_val_loss"]])
    if summary.get("stopped_by"):
        facts.insert(1, ["stopped by", summary["stopped_by"]])
    threads = summary.get("threads")
    if isinstance(threads, dict):  # hymo_core/threads.py's choice, per process
        facts.append(["threads per process", f"{threads['threads']} ({threads['source']}; {threads['cpus']} usable CPUs, "
                                              f"{threads['ranks']} rank(s), world size {summary.get('world_size', 1)})"])
    parts.append(_table(["", "value"], facts))
    parts.append("<h2>Training loss</h2>")
    parts.append(_image(plot_training_loss(records, summary.get("ln_vocab")), "training loss", "training-loss"))
    parts.append(f"<p id='training-loss-legend'>The line is the <b>{html.escape(WINDOW_MEAN_LABEL)}</b> (what the console prints "
                 f"and metrics.jsonl's <code>loss</code> holds); the dots are the <b>{html.escape(LAST_UPDATE_LABEL)}</b> "
                 "(metrics.jsonl's <code>last_loss</code>, summary.json's <code>final_train_loss</code>): one batch, so noisier.</p>")
    parts.append("<h2>Learning rate and throughput</h2>")
    parts.append(_image(plot_schedule(records), "learning rate and tokens/s", "schedule"))
    parts.append("<h2>Checkpoints</h2>")
    checkpoints, index_path = checkpoint_rows(run, summary)
    parts.append(_table(["checkpoint", "best", "held-out loss", "latest"], checkpoints) + f"<p>from <code>{html.escape(index_path)}</code></p>"
                 if checkpoints else "<p id='no-checkpoints'>No checkpoint index found beside this run.</p>")
    parts.append("<h2>Held-out loss per source and language</h2>")
    parts.append(_image(plot_groups(records), "held-out loss per source and language", "per-group-curves"))
    if evals and evals[-1].get("groups"):
        last = evals[-1]
        parts.append(_table(["group", "loss", "bits per byte", "tokens"],
                            [["all", last["val_loss"], last.get("val_bpb"), None]]
                            + [[name, g["loss"], g.get("bpb"), g.get("tokens")] for name, g in sorted(last["groups"].items())]))
    parts.append("<h2>Loss forecast</h2>")
    parts.append(_image(plot_forecast(records, fitted), "held-out loss and its forecast", "forecast"))
    if fitted is not None:
        result = fitted[0]
        band = forecast_band(fitted)
        low, high = band[0] if band is not None else (None, None)
        parts.append(_table(["planned tokens", "forecast", "5 %", "95 %", "L_inf", "a", "gamma", "points"],
                            [[result.target_tokens, result.forecast, low, high, result.fit.l_inf, result.fit.a, result.fit.gamma, result.points]]))
        if band is None:
            parts.append("<p id='no-band'>No band: the forecast has no interval the evaluations support.</p>")
        parts.append("<p>How the forecast moves with the fit window:</p>")
        parts.append(_table(["points (latest)", "from tokens", "forecast", "L_inf", "gamma"],
                            [[w["points"], w["from_tokens"], w["forecast"], w["l_inf"], w["gamma"]] for w in result.window_sensitivity]))
        parts.append(_table(["eval", "residual"], [[i + 1, r] for i, r in enumerate(result.residuals)]))
    else:
        parts.append(f"<p id='no-forecast'>No forecast: it needs at least {MIN_FORECAST_POINTS} held-out evaluations with tokens seen "
                     f"({len([r for r in evals if r.get('tokens_seen')])} here) and a planned token budget the evaluations have not "
                     "already reached.</p>")
    parts.append("<h2>Run signals</h2>")
    parts.append(_image(plot_signals(records), "run signals", "signals"))
    if trains:
        last = trains[-1]
        parts.append(_table(["signal", "latest"], [[k, gib(last.get(k)) if k == "peak_memory_bytes" else last.get(k)] for k in (
            "loss", "grad_norm_pre_clip", "clip_fraction", "log_z", "max_attention_logit", "tokens_per_s", "mfu", "mfu_reference",
            "peak_memory_bytes", "peak_memory_kind", "data_wait_fraction", "documents_per_window", "skipped_updates")]))
        totals = last.get("tokens_per_source_total") or {}
        if totals:
            parts.append("<h3>Tokens per source (whole run)</h3>")
            parts.append(_table(["source", "tokens"], [[k, v] for k, v in sorted(totals.items())]))
    parts.append("<h2>Alerts</h2>")
    parts.append(_table(["step", "alert", "metric", "value", "statistic", "condition", "action"],
                        [[a.get("step"), a.get("alert"), a.get("metric"), a.get("value"), a.get("statistic"), a.get("condition"), a.get("action")]
                         for a in alerts]) if alerts else "<p id='no-alerts'>No alert fired.</p>")
    parts.append("<h2>Notes</h2><p>Information, not alarms: a spike that recovered by the next log, a held-out loss below the "
                 "forecast band (better than forecast).</p>")
    parts.append(_table(["step", "alert", "metric", "value", "note"],
                        [[n.get("step"), n.get("alert"), n.get("metric"), n.get("value"), n.get("note")] for n in notes])
                 if notes else "<p id='no-notes'>None.</p>")
    recipe = [[f"train.{k}", v] for k, v in sorted((summary.get("train_config") or {}).items())]
    recipe += [[f"model.{k}", v] for k, v in sorted((summary.get("model_config") or {}).items())]
    parts.append("<h2>Recipe</h2>")
    parts.append(f"<details id='recipe'><summary>{len(recipe)} settings (summary.json)</summary>{_table(['key', 'value'], recipe)}</details>"
                 if recipe else "<p>No recipe recorded (no summary.json).</p>")
    style = ("body{font-family:sans-serif;margin:2em;max-width:1200px} table{border-collapse:collapse;margin:0.5em 0}"
             " td,th{border:1px solid #ccc;padding:2px 8px;font-size:13px} img{max-width:100%}")
    return f"<!doctype html><html><head><meta charset='utf-8'><title>HyMo run report</title><style>{style}</style></head><body>{''.join(parts)}</body></html>"


def write_report(run: str | Path, out: str | Path | None = None) -> Path:
    """RUN/report.html (or `out`), written atomically."""
    target = Path(out) if out else Path(run) / REPORT_FILE
    page = render_report(run)
    temporary = target.with_name(target.name + ".tmp")
    temporary.write_text(page, encoding="utf-8")
    temporary.replace(target)
    return target
