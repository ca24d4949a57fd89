"""Named ranges of the trainer's step, for whoever measures it; free when nobody does.

The trainer marks each part of an update: `step` (the whole update) and inside it `data`, `forward`,
`backward` (once per micro-batch), `clip`, `optimizer`, `after_step` (QK-Clip, MoE bookkeeping, zero_grad)
and `log` (a logging step's weight snapshot, update ratios and record). A measurer installs an observer, a
function from a range's name to a context manager: bench/gpu_check.py's profile rows open a
`record_function` range (and synchronise at its end, so the phases sum to the step); the launch counts open
a LaunchCounter phase. Without an observer a range is one shared null context.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import ContextManager

Observer = Callable[[str], ContextManager]
_NULL = contextlib.nullcontext()
_observer: Observer | None = None


def step_range(name: str) -> ContextManager:
    return _NULL if _observer is None else _observer(name)


@contextlib.contextmanager
def observing(observer: Observer) -> Iterator[None]:
    """Route the trainer's ranges to `observer` while inside."""
    global _observer
    previous, _observer = _observer, observer
    try:
        yield
    finally:
        _observer = previous
