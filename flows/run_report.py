"""What long work shows while it runs: a progress artifact per stage, the training curve in the run log
and in a live markdown artifact.

Stage code and hymo_core know nothing of Prefect: they report through tasks.runner.stage_runner.PROGRESS_SINK
and run_training's `report` hook; this module turns those calls into Prefect artifacts and log lines,
throttled so that a fast stage pays nothing and a long one costs a request a second at most.
"""
from __future__ import annotations

import base64
import contextvars
import os
import threading
import time
from typing import Any

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact
from prefect.context import FlowRunContext, TaskRunContext

from flows.artifacts import artifact_key

SHOW_AFTER_S = 3.0  # a stage that ends sooner gets no progress artifact ($HYMO_PROGRESS_AFTER_S overrides)
UPDATE_EVERY_S = 1.0
TRAINING_ROWS = 20  # latest logged steps in the training artifact


class StageProgress:
    """The PROGRESS_SINK of one stage: (label, done, total) calls become one Prefect progress artifact.

    The artifact appears once the stage has run SHOW_AFTER_S (a timer, so a long global pass that reports
    nothing still shows the stage as running), then follows the latest report at most once a second. A
    report names a phase (a label: extraction's documents, a global pass's "candidate bands", "training
    steps") and how far into it the stage is; total 0 is a phase with no count. Each new phase is also one
    line in the run log, so what a stage spent its time on stays readable after it ended.
    """

    def __init__(self, stage: str) -> None:
        self.stage, self.key = stage, artifact_key("hymo", stage, "progress")
        self.label, self.done, self.total, self.fraction, self.sent_at = "running", 0, 0, 0.0, 0.0
        self.artifact_id = None
        self.logger = get_run_logger()  # bound here, in the stage's task run: reports may come from other threads
        self.lock = threading.Lock()
        after_s = float(os.environ.get("HYMO_PROGRESS_AFTER_S", SHOW_AFTER_S))
        self.timer = threading.Timer(after_s, contextvars.copy_context().run, args=(self.show,))
        self.timer.daemon = True

    def __enter__(self) -> "StageProgress":
        self.timer.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.timer.cancel()
        with self.lock:
            if self.artifact_id is not None and exc[0] is None:
                update_progress_artifact(self.artifact_id, 100.0, description=f"{self.stage}: done")

    def show(self) -> None:
        with self.lock:
            if self.artifact_id is None:
                self.artifact_id = create_progress_artifact(100.0 * self.fraction, key=self.key, description=self.describe())
                self.sent_at = time.monotonic()

    def phase(self, label: str) -> str:
        return "documents" if label == self.stage else label  # a stage's own shard map counts documents

    def describe(self) -> str:
        return f"{self.stage}: {self.phase(self.label)} {self.done:,}/{self.total:,}" if self.total else f"{self.stage}: {self.phase(self.label)}"

    def __call__(self, label: str, done: int, total: int) -> None:
        if label != self.label:
            self.logger.info("%s phase: %s%s", self.stage, self.phase(label), f" ({total:,} to do)" if total else "")
        self.label, self.done, self.total = label, done, total
        if total:
            self.fraction = min(1.0, done / total)
        with self.lock:
            if self.artifact_id is None or time.monotonic() - self.sent_at < UPDATE_EVERY_S:
                return
            update_progress_artifact(self.artifact_id, 100.0 * self.fraction, description=self.describe())
            self.sent_at = time.monotonic()


def training_report(max_steps: int, planned_tokens: float | None = None) -> "TrainingReport | None":
    """The pretrain stage's `report` hook inside a Prefect run (None elsewhere, e.g. a plain loop or a probe)."""
    from tasks.runner.stage_runner import PROGRESS_SINK

    if TaskRunContext.get() is None and FlowRunContext.get() is None:
        return None
    sink = PROGRESS_SINK.get()
    return TrainingReport(max_steps, sink if isinstance(sink, StageProgress) else None, planned_tokens)


class TrainingReport:
    """run_training's `report` hook: each logged step to the run log (one compact status line), each alert a
    warning there, and a markdown artifact updated in place: the latest steps, the held-out loss per source
    and language (table and curves), the loss forecast with its band, and the alerts with their actions; plus
    the stage's progress artifact in training steps. Pictures are redrawn at evaluations only."""

    def __init__(self, max_steps: int, progress: StageProgress | None = None, planned_tokens: float | None = None) -> None:
        self.max_steps, self.progress, self.planned_tokens = max_steps, progress, planned_tokens
        self.logger = get_run_logger()
        self.rows: list[dict[str, Any]] = []
        self.evals: list[dict[str, Any]] = []
        self.alerts: list[dict[str, Any]] = []
        self.pictures: list[str] = []
        self.forecast_line = ""
        self.artifact_id = None
        self.sent_at = 0.0

    def __call__(self, record: dict[str, Any]) -> None:
        from hymo_core.train.monitor import status_line

        kind = record.get("kind")
        if kind == "train":
            lr = max(record["lr"].values()) if isinstance(record.get("lr"), dict) and record["lr"] else record.get("lr", 0.0)
            row = {"step": record["step"], "loss": record["loss"], "lr": lr, "tokens_per_s": record.get("tokens_per_s", 0.0)}
            self.rows = (self.rows + [row])[-TRAINING_ROWS:]
            self.logger.info("train %s", status_line(record, self.max_steps))
            if self.progress is not None:
                self.progress("training steps", record["step"], self.max_steps)
        elif kind == "eval":
            self.evals.append(record)
            self.logger.info("validation step %d loss %.4f", record["step"], record["val_loss"])
            self.draw()
        elif kind == "alert":
            self.alerts.append(record)
            self.logger.warning("training alert at step %s: %s (%s = %s, %s) -> action %s", record["step"], record["alert"], record["metric"],
                                record["value"], record["condition"], record["action"])
        elif kind == "note":  # information (a recovered spike, a loss below the forecast band): no warning
            self.logger.info("training note at step %s: %s (%s = %s): %s", record["step"], record["alert"], record["metric"],
                             record["value"], record.get("note", ""))
        elif kind == "event":
            self.logger.warning("training event: %s", {k: v for k, v in record.items() if k != "kind"})
            return
        final = record.get("step") == self.max_steps
        if final or kind == "alert" or time.monotonic() - self.sent_at >= 2 * UPDATE_EVERY_S:
            self.publish()

    def draw(self) -> None:
        """The per-group curves and the forecast band as embedded PNGs (hymo_core.train.run_report draws them)."""
        from hymo_core.train.run_report import plot_forecast, plot_groups, run_forecast

        fitted = run_forecast(self.evals, self.planned_tokens)
        self.pictures = []
        for alt, picture in (("held-out loss per source and language", plot_groups(self.evals)), ("loss forecast", plot_forecast(self.evals, fitted))):
            if picture is not None:
                self.pictures.append(f"![{alt}](data:image/png;base64,{base64.b64encode(picture).decode()})")
        if fitted is not None:
            result = fitted[0]
            self.forecast_line = (f"forecast at the planned {result.target_tokens:,.0f} tokens: {result.forecast:.4f} "
                                  f"(90 % [{result.low:.4f}, {result.high:.4f}]), L(D) = {result.fit.l_inf:.3f} + a D^-{result.fit.gamma:.3f}")

    def markdown(self) -> str:
        lines = [f"### pretrain: {self.rows[-1]['step'] if self.rows else 0} / {self.max_steps} steps", "",
                 "| step | loss | lr | tokens/s |", "|---|---|---|---|"]
        lines += [f"| {r['step']} | {r['loss']:.4f} | {r['lr']:.3g} | {r['tokens_per_s']:,.0f} |" for r in self.rows]
        if self.evals:
            if any(e.get("ema_val_loss") is not None for e in self.evals):  # TrainConfig.ema_decay: the EMA weights, same windows
                lines += ["", "| step | validation loss | EMA weights |", "|---|---|---|"]
                lines += [f"| {e['step']} | {e['val_loss']:.4f} | {e.get('ema_val_loss') or float('nan'):.4f} |" for e in self.evals[-TRAINING_ROWS:]]
            else:
                lines += ["", "| step | validation loss |", "|---|---|"] + [f"| {e['step']} | {e['val_loss']:.4f} |" for e in self.evals[-TRAINING_ROWS:]]
            groups = self.evals[-1].get("groups") or {}
            if groups:
                lines += ["", f"#### held-out loss per group at step {self.evals[-1]['step']}", "", "| group | loss | bits per byte | tokens |",
                          "|---|---|---|---|"]
                lines += [f"| {name} | {g['loss']:.4f} | {'' if g.get('bpb') is None else format(g['bpb'], '.4f')} | {g['tokens']:,} |"
                          for name, g in sorted(groups.items())]
        if self.forecast_line:
            lines += ["", self.forecast_line]
        lines += [""] + self.pictures if self.pictures else []
        if self.alerts:
            lines += ["", "#### alerts", "", "| step | alert | metric | value | condition | action |", "|---|---|---|---|---|---|"]
            lines += [f"| {a['step']} | {a['alert']} | {a['metric']} | {a['value']} | {a['condition']} | {a['action']} |" for a in self.alerts[-TRAINING_ROWS:]]
        return "\n".join(lines)

    def publish(self) -> None:
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.actions import ArtifactUpdate

        if self.artifact_id is None:
            self.artifact_id = create_markdown_artifact(self.markdown(), key=artifact_key("hymo", "pretrain", "training"),
                                                        description="pretrain: loss, held-out loss per source and language, forecast, alerts; updated while it trains")
        else:
            with get_client(sync_client=True) as client:
                client.update_artifact(self.artifact_id, ArtifactUpdate(data=self.markdown()))
        self.sent_at = time.monotonic()
