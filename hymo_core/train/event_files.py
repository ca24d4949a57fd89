"""TensorBoard event files beside metrics.jsonl, so `tensorboard --logdir OUT` shows a run as torchtitan's
and OLMo-core's users expect to see theirs.

The writer is the `tensorboard` package's (through torch.utils.tensorboard.SummaryWriter), fed from the
same records metrics.jsonl gets, at the same steps, on rank 0 only. What it writes (`scalars`):

    train/loss                 mean training loss over the logged window (metrics.jsonl "loss")
    train/loss_last_update     the logging update's own loss ("last_loss")
    train/lr/<group>           each optimizer group's learning rate
    train/grad_norm_pre_clip   global gradient norm before clipping
    throughput/tokens_per_s    over the logged window
    throughput/mfu             model FLOPs utilisation (where a peak is known)
    eval/loss, eval/bpb        held-out loss (nats / token) and bits per byte, all groups together
    eval/ema_loss              the EMA weights' held-out loss (ema_decay > 0)
    heldout/<group>            held-out loss per source and per language ("source:web", "lang:en")

A resumed run continues the same files' story: metrics.jsonl drops the records a killed session wrote
past the checkpoint it resumes from, and the writer starts with `purge_step` = that step + 1, so
TensorBoard hides the killed session's events from that step on (no duplicate or backwards steps).
A fresh run (no checkpoint) removes the event files a previous run left, as it truncates metrics.jsonl.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

EVENT_FILE_PREFIX = "events.out.tfevents."


def scalars(record: dict[str, Any]) -> Iterator[tuple[str, float]]:
    """(tag, value) pairs of one metrics.jsonl record; records of other kinds (alerts, events) give none."""
    kind = record.get("kind")
    if kind == "train":
        fields = (("train/loss", "loss"), ("train/loss_last_update", "last_loss"), ("train/grad_norm_pre_clip", "grad_norm_pre_clip"),
                  ("throughput/tokens_per_s", "tokens_per_s"), ("throughput/mfu", "mfu"))
        yield from _numbers(record, fields)
        for group, lr in sorted((record.get("lr") or {}).items()):
            if _is_number(lr):
                yield f"train/lr/{group}", float(lr)
    elif kind == "eval":
        yield from _numbers(record, (("eval/loss", "val_loss"), ("eval/bpb", "val_bpb"), ("eval/ema_loss", "ema_val_loss")))
        for name, group in sorted((record.get("groups") or {}).items()):
            if _is_number(group.get("loss")):
                yield f"heldout/{name}", float(group["loss"])


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _numbers(record: dict[str, Any], fields: tuple[tuple[str, str], ...]) -> Iterator[tuple[str, float]]:
    for tag, key in fields:
        if _is_number(record.get(key)):
            yield tag, float(record[key])


class EventFiles:
    """The run's TensorBoard writer; `write(record)` after each metrics.jsonl line, `close()` at the end."""

    def __init__(self, directory: Path, resumed_step: int):
        from torch.utils.tensorboard import SummaryWriter

        directory.mkdir(parents=True, exist_ok=True)
        if not resumed_step:
            for stale in directory.glob(EVENT_FILE_PREFIX + "*"):
                stale.unlink()
        # flush_secs: a killed run loses at most this much of the curve (metrics.jsonl has every record).
        self.writer = SummaryWriter(log_dir=str(directory), purge_step=resumed_step + 1 if resumed_step else None, flush_secs=10)

    def write(self, record: dict[str, Any]) -> None:
        step = record.get("step")
        if not isinstance(step, int):
            return
        for tag, value in scalars(record):
            self.writer.add_scalar(tag, value, global_step=step)

    def close(self) -> None:
        self.writer.close()
