"""One exit-code table for every entry point that trains or judges, so a scheduler can tell an alert's stop
from a crash: `python -m hymo_core.train`, its torchrun ranks, `hymo train` (with and without --nproc),
`hymo run`, `hymo eval` and `hymo cpt run` / `hymo cpt verify` (docs/training.md, "Exit codes").

    0  done
    1  crashed (a bug, a dead machine, a full disk: running it again may help)
    2  refused before training or judging: arguments, recipe, corpus, checkpoint, tokenizer, a held lock
    3  stopped by an alert whose action is `stop`; the message names the summary.json that says why
    4  a verdict failed: a CPT gate not passed, or `hymo cpt verify` could not verify the run
"""
from __future__ import annotations

import sys
from pathlib import Path

DONE, CRASHED, REFUSED, STOPPED, VERDICT_FAILED = 0, 1, 2, 3, 4

STOP_PREFIX = "stopped: "  # how a stop's line starts, on every rank and entry point (the launcher looks for it)


def stop_line(exc: BaseException, summary: str | Path | None) -> str:
    """The one line a stopped run ends with: the alert, its step and value, and where the summary is."""
    where = f"; the run's summary (stopped_by, alerts): {summary}" if summary else ""
    return f"{STOP_PREFIX}{exc}{where}"


def stopped_by_alert(exc: BaseException) -> BaseException | None:
    """The alert's stop behind `exc` (itself, a cause, or a torchrun launch whose ranks stopped), else None."""
    if "hymo_core.train.trainer" not in sys.modules:  # then nothing can have raised one (and torch stays unimported)
        return None
    from hymo_core.train.trainer import TrainingStopped

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, TrainingStopped) or getattr(current, "stopped", False):
            return current
        current = current.__cause__ or current.__context__
    return None
