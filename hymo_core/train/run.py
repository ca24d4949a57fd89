"""One training run on a corpus: model, optimizer, loaders, checkpoints, metrics, pictures, summary.

`run_training` is what `hymo train`, the pretrain stage and the `hymo-train`
flow call; `python -m hymo_core.train` runs it without Prefect. It writes into
`out/`:

    checkpoints/step-NNNNNNNN.pt   the last K and the best by validation loss (+ checkpoints.json)
    metrics.jsonl                  one record per logged step, validation (per source / language), skip event, alert
    events.out.tfevents.*          the same steps' scalars for TensorBoard (hymo_core/train/event_files.py)
    loss.png                       train and validation loss, and the LR (as Lab 2 plots them)
    heldout.png                    held-out loss per source and per language (hymo_core.eval.heldout)
    ema.pt                         with ema_decay > 0: the EMA weights as a checkpoint, for `hymo eval` (not for resuming)
    summary.json                   final step, final train / validation loss, sha256 of the final weights, the corpus
                                   (absolute path, digest, tokenizer sha256)

`resume` says what to do with `out`'s checkpoints (RESUME_MODES): "never" refuses a directory
that holds some, "required" (`--resume`) refuses one that holds none (a typo in `--out` is not a
fresh run), "if-any" (`--resume-or-start`, and `True` for callers in code: the pipeline, a requeue)
continues when there is one and starts at step 0 when there is none. A resume continues from the
newest readable checkpoint (an unreadable newest one is reported and the previous one is used);
metrics logged after that checkpoint by a killed session are dropped, so the file reads as one
uninterrupted run.

One writer per `out`: the run holds `out/.lock` (manifests.run_lock: an OS lock that names its
holder's host, pid and start time and dies with the process), so a second run on the same
directory (a requeue beside a manual relaunch) is refused at once naming the first.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from hymo_core.models.configs import SAMPLE_MODEL
from hymo_core.threads import ThreadChoice, choose_threads, local_ranks, using_threads
from hymo_core.train.config import (CHECKPOINT_DIR, EMA_CHECKPOINT, EXPERT_LOAD_PICTURE, LOSS_PICTURE, METRICS_FILE, SAMPLE_TRAIN,
                                    SUMMARY_FILE)
from hymo_core.checkpoint.common import CheckpointError, list_checkpoints, weights_sha256
from hymo_core.checkpoint.single import CheckpointDirectory, load_checkpoint, save_checkpoint
from hymo_core.checkpoint.tokenizer_identity import corpus_tokenizer_sha256
from hymo_core.train.ema import WeightEMA
from hymo_core.train.event_files import EventFiles
from hymo_core.eval.heldout import HeldOutSet
from hymo_core.train.data import CorpusError, CorpusReader, TokenLoader
from hymo_core.train.monitor import status_line
from hymo_core.train.run_report import HELDOUT_PICTURE, run_forecast, write_group_plot
from hymo_core.distributed.process_group import Runtime, broadcast_object, close_runtime, init_runtime
from hymo_core.eval.evaluation import SAMPLE_CLOZE, load_cloze, load_tokenizer, score_cloze
from hymo_core.models.model import ModelConfig
from hymo_core.train.optim import build_optimizer
from hymo_core.distributed.parallelize import build_parallel_model, reshard, wraps_in_fsdp
from hymo_core.checkpoint.background import BackgroundCheckpoints
from hymo_core.checkpoint.sharded import load_sharded_checkpoint, load_single_file_into_shards
from hymo_core.train.config import TrainConfig
from hymo_core.train.arguments import add_train_arguments  # noqa: F401 (re-exported: the trainer's arguments)
from hymo_core.train.recipe import PARALLEL_KEYS, load_run_config  # noqa: F401 (re-exported: read without torch by the CLI)
from hymo_core.train.trainer import TrainHooks, TrainingStopped, TrainState, continuations_over_ranks, seed_training_rng, train
from hymo_core.exit_codes import REFUSED, STOPPED, stop_line


def seed_everything(seed: int) -> None:
    """The global generators (for code around the trainer) and the trainer's own (what checkpoints store)."""
    random.seed(seed)
    np.random.seed(seed)
    seed_training_rng(seed)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def written_at(record: dict[str, Any]) -> int:
    """The step a record was written at: its own, or for a held spike's row the later step that judged it (alerts.py)."""
    return int(record.get("judged_at", record.get("step", 0)))


class MetricsLog:
    """metrics.jsonl, append-only; on resume, records past the resumed step are dropped first."""

    def __init__(self, path: Path, resumed_step: int):
        self.path = path
        kept = []
        if resumed_step and path.is_file():
            kept = [line for line in path.read_text(encoding="utf-8").splitlines()
                    if line.strip() and written_at(json.loads(line)) <= resumed_step]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")

    def records(self, kind: str | None = None) -> list[dict[str, Any]]:
        rows = [json.loads(line) for line in self.path.read_text(encoding="utf-8").splitlines() if line.strip()]
        return [r for r in rows if kind is None or r.get("kind") == kind]


def plot_loss(records: list[dict[str, Any]], path: Path, vocab_size: int) -> None:
    """Train loss per logged step, validation loss, ln(V) for reference, and the LR on a second axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train_rows = [r for r in records if r.get("kind") == "train"]
    val_rows = [r for r in records if r.get("kind") == "eval"]
    figure, loss_axis = plt.subplots(figsize=(8, 4.5))
    loss_axis.plot([r["step"] for r in train_rows], [r["loss"] for r in train_rows], label="train loss (mean over each logged window)", color="tab:blue")
    loss_axis.plot([r["step"] for r in val_rows], [r["val_loss"] for r in val_rows], "o-", label="validation loss", color="tab:orange")
    loss_axis.axhline(math.log(vocab_size), linestyle=":", color="grey", label=f"ln V = {math.log(vocab_size):.2f}")
    loss_axis.set_xlabel("successful update")
    loss_axis.set_ylabel("cross-entropy (nats / token)")
    lr_axis = loss_axis.twinx()
    lr_axis.plot([r["step"] for r in train_rows], [max(r["lr"].values()) for r in train_rows], color="tab:green", alpha=0.5, label="LR")
    lr_axis.set_ylabel("learning rate")
    lines = loss_axis.get_legend_handles_labels()
    extra = lr_axis.get_legend_handles_labels()
    loss_axis.legend(lines[0] + extra[0], lines[1] + extra[1], loc="upper right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_expert_load(records: list[dict[str, Any]], path: Path) -> None:
    """Per MoE layer: the most and least loaded expert (1.0 = an even share) per logged update, and the bias norm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in records if r.get("kind") == "train" and r.get("moe")]
    layers = list(rows[0]["moe"])
    figure, (load_axis, bias_axis) = plt.subplots(1, 2, figsize=(11, 4.5))
    steps = [r["step"] for r in rows]
    for index, layer in enumerate(layers):
        colour = f"C{index % 10}"
        load_axis.plot(steps, [r["moe"][layer]["load_max"] for r in rows], color=colour, label=f"{layer} max")
        load_axis.plot(steps, [r["moe"][layer]["load_min"] for r in rows], color=colour, linestyle="--", label=f"{layer} min")
        bias_axis.plot(steps, [r["moe"][layer]["bias_norm"] for r in rows], color=colour, label=layer)
    load_axis.axhline(1.0, linestyle=":", color="grey")
    load_axis.set_xlabel("successful update")
    load_axis.set_ylabel("expert load / even share")
    load_axis.legend(fontsize="small")
    bias_axis.set_xlabel("successful update")
    bias_axis.set_ylabel("gate-bias norm")
    bias_axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


class ProgressLine:
    """A live rich line (step, loss, LR, tokens/s) on a terminal or with HYMO_PROGRESS=1; silent otherwise."""

    def __init__(self, total: int, start: int, enabled: bool | None = None):
        self.enabled = (sys.stderr.isatty() or os.environ.get("HYMO_PROGRESS") == "1") if enabled is None else enabled
        self.progress = None
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self.progress = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[status]}"),
                                     TimeElapsedColumn(), TimeRemainingColumn())
            self.progress.start()
            self.task = self.progress.add_task("train", total=total, completed=start, status="")
        self.started, self.tokens = time.perf_counter(), 0
        self.logged_loss: float | None = None

    def update(self, state: TrainState, lr: float, tokens: int) -> None:
        """After every update; the loss shown is the last logged one (reading each update's would sync the device)."""
        if self.progress is None:
            return
        self.tokens += tokens
        rate = self.tokens / max(time.perf_counter() - self.started, 1e-9)
        loss = f"loss {self.logged_loss:.3f} " if self.logged_loss is not None else ""
        self.progress.update(self.task, completed=state.step, status=f"{loss}lr {lr:.2e} {rate:,.0f} tok/s")

    def logged(self, record: dict) -> None:
        self.logged_loss = record["loss"]

    def print(self, line: str, log: Any) -> None:
        """A status line above the live bar (rich keeps the bar at the bottom), else through `log`."""
        if self.progress is not None:
            self.progress.console.print(line, markup=False, highlight=False)
        else:
            log(line)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


RESUME_MODES = ("never", "required", "if-any")


def resume_mode(resume: bool | str) -> str:
    """A RESUME_MODES entry; True (what code has always passed: the pipeline, a requeue) is "if-any", False "never"."""
    mode = {True: "if-any", False: "never"}.get(resume, resume) if isinstance(resume, bool) else resume
    if mode not in RESUME_MODES:
        raise ValueError(f"resume {resume!r}: one of {', '.join(RESUME_MODES)} (or True / False)")
    return mode


def resume_of_args(args: argparse.Namespace) -> str:
    """--resume: a checkpoint must be there; --resume-or-start: continue or start; neither: a fresh directory."""
    return "required" if args.resume else "if-any" if getattr(args, "resume_or_start", False) else "never"


class ResumeRefused(CheckpointError):
    """--resume on a directory with no (readable) checkpoint."""


def refuse_missing_resume(directory: Path, found: str) -> ResumeRefused:
    return ResumeRefused(f"{directory}: --resume, but {found}; check --out, or pass --resume-or-start to start at step 0 "
                         "when there is no checkpoint (what a requeued job wants)")


def _resume(directory: CheckpointDirectory, load: Any, log: Any) -> tuple[TrainState, Path | None]:
    """Newest readable checkpoint; an unreadable one is reported and the previous one offered and used."""
    for path in reversed(list_checkpoints(directory.directory)):
        try:
            return load(path), path
        except CheckpointError as exc:
            if "truncated or corrupt" not in str(exc):
                raise  # an incompatible checkpoint is a configuration error, not something to skip
            log(f"warning: {exc}")
    return TrainState(), None


TRAINING_SPLITS = ("train", "validation")


def open_corpus(corpus: str | Path, runtime: Runtime) -> CorpusReader:
    """The corpus with its shard digests checked once, by rank 0; the other ranks take its verdict, not a re-hash.
    A corpus with a stale stage is refused first, on every rank (it reads only manifests)."""
    from manifests.staleness import refuse_stale_corpus  # here, not at import: the core imports no pipeline code
    refuse_stale_corpus(corpus, "training")
    reader = CorpusReader(corpus, verify=runtime.is_writer)
    problem = None
    if runtime.is_writer:
        try:
            for split in TRAINING_SPLITS:
                if split in reader.manifest["shards"]:
                    reader.open_all(split)
        except CorpusError as exc:
            problem = str(exc)
    problem = broadcast_object(problem)
    if problem:
        raise CorpusError(problem)
    return reader


def run_training(
    corpus: str | Path,
    out: str | Path,
    train_config: TrainConfig | None = None,
    model_config: ModelConfig | None = None,
    *,
    resume: bool | str = True,
    checkpoint_dir: str | Path | None = None,
    cloze_path: str | Path | None = SAMPLE_CLOZE,
    device: torch.device | None = None,
    progress: bool | None = None,
    log: Any = print,
    report: Callable[[dict[str, Any]], None] | None = None,
    runtime: Runtime | None = None,
    strict_resume: bool = False,
    threads: int | None = None,
) -> dict[str, Any]:
    """Train (or continue) to `train_config.max_steps` and write checkpoints, metrics, loss.png and summary.json.

    Under torchrun every rank calls this: the model is sharded with FSDP2, each
    rank reads its slice of every global batch, checkpoints are DCP directories,
    and rank 0 alone writes metrics, pictures and the summary (and logs).
    `report(record)`: called on that rank with every metrics record (train rows at log_interval,
    evaluations, events) as it is written; how an orchestrator shows training live without this
    package knowing about it.
    `strict_resume`: refuse a checkpoint written under another torch version or device (default: warn).
    `threads`: intra-op threads (`--threads`); default: hymo_core.threads' policy (HYMO_THREADS >
    OMP_NUM_THREADS > usable CPUs // ranks on this machine), logged and recorded in summary.json
    ("threads"); the process's own count is restored when the run returns.
    """
    runtime = runtime or init_runtime(device)
    if not runtime.is_writer:
        log, progress = (lambda *args, **kwargs: None), False
    resume = resume_mode(resume)
    directory = Path(checkpoint_dir or Path(out) / CHECKPOINT_DIR)
    if resume == "required" and not list_checkpoints(directory):  # before anything is created: a mistyped --out stays absent
        raise refuse_missing_resume(directory, "it holds no checkpoint" if directory.is_dir() else "it does not exist")
    choice = choose_threads(threads, ranks=local_ranks())
    log(f"threads: {choice.describe()}")
    # Rank 0 alone holds the lock: the other ranks are its own processes, not a second writer. Imported here: the
    # training core imports no pipeline code (tests/hymo_core/train/test_trainer.py), and the lock is one small module.
    from manifests.run_lock import run_lock

    with (run_lock(Path(out)) if runtime.is_writer else contextlib.nullcontext()), using_threads(choice):
        return _run_training(corpus, out, train_config, model_config, resume=resume, checkpoint_dir=checkpoint_dir,
                             cloze_path=cloze_path, progress=progress, log=log, report=report, runtime=runtime,
                             strict_resume=strict_resume, threads=choice)


def _run_training(corpus, out, train_config, model_config, *, resume, checkpoint_dir, cloze_path, progress, log, report,
                  runtime: Runtime, strict_resume: bool, threads: ThreadChoice) -> dict[str, Any]:
    config = train_config or SAMPLE_TRAIN
    device = runtime.device
    reader = open_corpus(corpus, runtime)
    model_config = replace(model_config or SAMPLE_MODEL, vocab_size=reader.vocab_size)
    if model_config.max_seq_len < config.seq_len:
        model_config = replace(model_config, max_seq_len=config.seq_len)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    checkpoints = CheckpointDirectory(checkpoint_dir or out / CHECKPOINT_DIR, config.keep_checkpoints, writer=runtime.is_writer)
    if resume == "never" and list_checkpoints(checkpoints.directory):
        raise FileExistsError(f"{checkpoints.directory} already holds checkpoints; pass --resume (or --resume-or-start) "
                              "or choose another --out")

    seed_everything(config.seed)
    model = build_parallel_model(model_config, runtime, config)  # meta -> sharded -> this rank's shards only
    if runtime.launched and not wraps_in_fsdp(runtime):
        log("one rank: the model is not wrapped in FSDP2 (nothing to shard)")
    elif runtime.launched:
        replicate, shard = config.mesh_shape(runtime.world_size)
        groups, experts = config.expert_mesh_shape(runtime.world_size)
        log(f"mesh: {replicate} replica group(s) x {shard} shards" + (" (HSDP)" if replicate > 1 else " (FSDP)")
            + (f"; routed experts over {groups} group(s) x {experts} ranks (EP)" if experts > 1 else ""))
    optimizer = build_optimizer(model, config.optimizer_config(device))
    ema = WeightEMA(model, config.ema_decay) if config.ema_decay else None  # refuses FSDP-sharded weights
    micro_batch, _ = runtime.batch_plan(config)
    train_loader = TokenLoader(reader, "train", config.seq_len, micro_batch, config.seed, rank=runtime.rank, world_size=runtime.world_size)
    # The held-out windows: eval_batches batches chosen round-robin over the sources and languages that lead them.
    val_loader = HeldOutSet.from_corpus(reader, config.seq_len, config.batch_size, max_batches=config.eval_batches)
    if len(val_loader) == 0:
        log(f"warning: {reader.path}: the validation split has no full batch of {config.batch_size} x {config.seq_len + 1} tokens; no validation")
        val_loader = None
    state, resumed_from = TrainState(), None
    if resume != "never":
        state, resumed_from = _resume(checkpoints, lambda p: _load_any(p, model, optimizer, config, train_loader, runtime, log, strict_resume, ema),
                                       log)
        if resumed_from is None and resume == "required":
            raise refuse_missing_resume(checkpoints.directory, "no checkpoint in it is readable")
        if resumed_from:
            log(f"resumed from {resumed_from} at step {state.step} ({state.tokens_seen:,} tokens seen)")

    metrics = MetricsLog(out / METRICS_FILE, state.step) if runtime.is_writer else None
    events = EventFiles(out, state.step) if runtime.is_writer else None  # TensorBoard, from the same records

    bar = ProgressLine(config.max_steps, state.step, progress)

    def record(row: dict[str, Any]) -> None:
        if metrics is None:
            return
        metrics.write(row)
        events.write(row)
        if report is not None:
            report(row)
        elif row["kind"] in ("train", "alert", "note"):
            bar.print(status_line(row, config.max_steps), log)  # one compact line per logging step, and per alert

    last_val: list[float | None] = [None]

    def on_eval(step: int, val: dict[str, Any]) -> None:
        last_val[0] = val["val_loss"]
        record({"kind": "eval", "step": step, **val, "val_perplexity": math.exp(min(val["val_loss"], 50))})

    background = BackgroundCheckpoints(checkpoints, runtime, record) if runtime.launched else None

    def on_checkpoint(current: TrainState) -> None:
        objects = dict(model=model, optimizer=optimizer, state=current, config=config, train_loader=train_loader,
                       val_loader=val_loader, **({"ema": ema} if ema is not None else {}))
        if background is not None:  # DCP: staged to CPU now, written while the next updates run
            background.save(current.step, last_val[0], **objects)
        else:
            checkpoints.save(current.step, last_val[0], **objects)

    def on_update(current: TrainState, loss: torch.Tensor, lr: float) -> None:
        bar.update(current, lr, config.tokens_per_update)
        if background is not None:
            background.poll()

    def on_log(row: dict[str, Any]) -> None:
        bar.logged(row)
        record({"kind": "train", **row})

    hooks = TrainHooks(
        on_log=on_log,
        on_eval=on_eval,
        on_checkpoint=on_checkpoint,
        on_event=lambda event: record({"kind": "event", **event}),
        on_alert=record,
        on_update=on_update,
    )
    started = time.perf_counter()
    stopped: TrainingStopped | None = None
    try:
        try:
            train(model, optimizer, train_loader, val_loader, config, state, device, hooks, runtime, ema)
        except TrainingStopped as exc:  # an alert's `stop`: the summary and pictures are still written, then it is raised
            stopped = exc
            reshard(model)  # the stop may come mid-step, with the blocks gathered
        if background is not None:
            background.close()  # the final checkpoint is published before anything reports it
    finally:
        bar.close()
        if events is not None:
            events.close()
    seconds = time.perf_counter() - started
    weights_digest = full_weights_sha256(model)  # a collective under FSDP: every rank takes part
    tokenizer_entry = reader.manifest.get("tokenizer", {})
    cloze = None
    if cloze_path and tokenizer_entry.get("path") and (reader.root / tokenizer_entry["path"]).is_file():
        cloze = score_cloze(model, load_tokenizer(reader.root / tokenizer_entry["path"]), load_cloze(cloze_path), device,
                            scorer=continuations_over_ranks(model, device, runtime))
    if not runtime.is_writer:
        return {"final_step": state.step}  # rank 0 holds the full weights, writes and reports

    records = metrics.records()
    train_rows = [r for r in records if r.get("kind") == "train"]
    val_rows = [r for r in records if r.get("kind") == "eval"]
    plot_loss(records, out / LOSS_PICTURE, reader.vocab_size)
    write_group_plot(records, out / HELDOUT_PICTURE)
    forecast = run_forecast(records, config.tokens_per_update * (config.horizon_steps or config.max_steps))
    if any(r.get("moe") for r in train_rows):
        plot_expert_load(records, out / EXPERT_LOAD_PICTURE)
    summary: dict[str, Any] = {
        "final_step": state.step,
        "final_train_loss": train_rows[-1]["last_loss"] if train_rows else None,
        "final_mtp_ce": train_rows[-1].get("mtp_ce") if train_rows else None,  # per MTP depth
        "final_expert_load": train_rows[-1].get("moe") if train_rows else None,  # per MoE layer
        "final_val_loss": val_rows[-1]["val_loss"] if val_rows else None,
        "final_val_perplexity": val_rows[-1]["val_perplexity"] if val_rows else None,
        "final_val_bpb": val_rows[-1].get("val_bpb") if val_rows else None,
        "final_val_groups": val_rows[-1].get("groups") if val_rows else None,  # per source and language
        "forecast": forecast[0].to_dict() if forecast else None,  # L(D) fitted to the held-out losses, at the planned tokens
        "alerts": [{k: v for k, v in r.items() if k != "kind"} for r in records if r.get("kind") == "alert"],
        "notes": [{k: v for k, v in r.items() if k != "kind"} for r in records if r.get("kind") == "note"],  # information
        "stopped_by": str(stopped) if stopped else None,
        "best_val_loss": state.best_val_loss,
        "ln_vocab": math.log(reader.vocab_size),
        "weights_sha256": weights_digest,
        "tokens_seen": state.tokens_seen,
        "skipped_updates": state.skipped_updates,
        "parameters": sum(p.numel() for p in model.parameters()),
        "session_seconds": seconds,
        "resumed_from": str(resumed_from) if resumed_from else None,
        "checkpoint": str(checkpoints.latest()) if checkpoints.latest() else None,
        "best_checkpoint": (checkpoints.index.get("best") or {}).get("path"),
        "corpus_digest": reader.digest,
        # Where the corpus is: `hymo trace OUT` and `hymo export` of OUT's checkpoints find it from here.
        "corpus": {"path": str(reader.path.resolve()), "digest": reader.digest, "tokenizer_sha256": corpus_tokenizer_sha256(reader)},
        "train_config": config.to_dict(),
        "model_config": asdict(model_config),
        "device": device.type,
        "threads": threads.to_json(),  # the choice and what made it (hymo_core/threads.py)
        "world_size": runtime.world_size,
    }
    if cloze is not None:
        summary["cloze"] = {k: v for k, v in cloze.items() if k != "per_item"}
    if ema is not None:  # the EMA weights as a checkpoint `hymo eval LAST ema.pt` pairs with the last one
        with ema.swapped_in():
            summary["ema_checkpoint"] = str(save_checkpoint(out / EMA_CHECKPOINT, model, optimizer, state, config, train_loader, val_loader))
            summary["ema_weights_sha256"] = weights_sha256(model)
        summary["final_ema_val_loss"] = val_rows[-1].get("ema_val_loss") if val_rows else None
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    if stopped is not None:
        stopped.summary_path = str((out / SUMMARY_FILE).resolve())  # what every entry point's stop line names
        raise stopped
    return summary


def _load_any(path: Path, model, optimizer, config: TrainConfig, train_loader: TokenLoader, runtime: Runtime, log: Any,
              strict: bool = False, ema: WeightEMA | None = None) -> TrainState:
    """A DCP directory (any world size, also into one plain process) or a single-file checkpoint (one process)."""
    warn = lambda message: log(f"warning: {message}")  # noqa: E731
    if ema is not None and (path.is_dir() or runtime.launched):
        raise CheckpointError(f"{path}: a DCP or torchrun resume carries no EMA of the weights (ema_decay {ema.decay}); refusing to resume")
    if path.is_dir():
        return load_sharded_checkpoint(path, model, optimizer, config, train_loader, runtime, warn=warn, strict=strict)
    if runtime.launched:  # one process -> W ranks: every rank reads the file and keeps its rows
        return load_single_file_into_shards(path, model, optimizer, config, train_loader, runtime, warn=warn, strict=strict)
    return load_checkpoint(path, model, optimizer, config, train_loader, warn=warn, strict=strict, ema=ema)


def full_weights_sha256(model) -> str:
    """weights_sha256 of the whole model, also when FSDP holds it in shards (then every rank must call this)."""
    from hymo_core.distributed.parallelize import is_sharded

    if not is_sharded(model):
        return weights_sha256(model)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from hymo_core.checkpoint.common import state_dict_sha256

    return state_dict_sha256(get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hymo_core.train", description="Pretrain on a corpus (no Prefect needed).")
    add_train_arguments(parser)
    return parser


def session_config(train_config: TrainConfig, max_steps: int | None = None, horizon: int | None = None) -> TrainConfig:
    """Apply --max-steps / --horizon: stopping early never moves the schedule, only --horizon does."""
    values = train_config.to_dict()
    if horizon is not None:
        values["horizon_steps"] = horizon
    elif max_steps is not None and not train_config.horizon_steps:
        values["horizon_steps"] = train_config.max_steps  # the recipe's own horizon, pinned
    if max_steps is not None:
        values["max_steps"] = max_steps
    try:
        return TrainConfig.from_dict(values)
    except ValueError as exc:
        raise ValueError(f"--max-steps {max_steps} / --horizon {horizon}: {exc}") from None


def train_from_args(args: argparse.Namespace) -> dict[str, Any]:
    return run_training(args.corpus, args.out, *_configs(args), resume=resume_of_args(args), cloze_path=args.cloze or SAMPLE_CLOZE,
                        strict_resume=args.strict_resume, threads=getattr(args, "threads", None))


def main(argv: list[str] | None = None) -> int:
    """Also each rank's entry point under torchrun (`torchrun -m hymo_core.train ...`)."""
    from manifests.run_lock import RunLocked

    args = build_parser().parse_args(argv)
    runtime = init_runtime()
    try:
        summary = run_training(args.corpus, args.out, *_configs(args), resume="if-any" if restarted_by_torchrun() else resume_of_args(args),
                               cloze_path=args.cloze or SAMPLE_CLOZE, runtime=runtime, strict_resume=args.strict_resume,
                               threads=args.threads)
    except (ValueError, FileExistsError, RunLocked) as exc:  # configuration, corpus, checkpoint, lock: one line, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return REFUSED
    except TrainingStopped as exc:  # an alert's `stop`: its row and summary.json (stopped_by) are written already
        print(stop_line(exc, getattr(exc, "summary_path", Path(args.out).resolve() / SUMMARY_FILE)), file=sys.stderr)
        return STOPPED
    finally:
        close_runtime(runtime)
    if runtime.is_writer:
        print(json.dumps({k: summary[k] for k in ("final_step", "final_train_loss", "final_val_loss", "weights_sha256")}, indent=2))
    return 0


def restarted_by_torchrun() -> bool:
    """torchrun --max-restarts restarted this group after a rank failed: continue from the newest complete checkpoint."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0


def _configs(args: argparse.Namespace) -> tuple[TrainConfig, ModelConfig]:
    train_config, model_config = load_run_config(args.config, getattr(args, "set", None))
    return session_config(train_config, args.max_steps, getattr(args, "horizon", None)), model_config


if __name__ == "__main__":
    sys.exit(main())
