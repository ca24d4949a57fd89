"""Checkpoints written while training goes on: start at a checkpoint step, publish when every rank is done.

`BackgroundCheckpoints.save` (all ranks, at a checkpoint step) stages the state
to CPU and starts the DCP write (hymo_core.checkpoint.sharded); the next
update proceeds at once. After every update `poll` asks the ranks (one small
all-reduce, only while a write is in flight) whether all of them have
finished; then the directory is published (metadata.json last, rename) and
entered in the index. A save that finds the previous one still writing waits
for it first, and `close` waits for the last one before the run reports.

A run killed mid-write leaves `step-N.tmp/`, never a published `step-N/`: the
resume takes the previous checkpoint, and the next save of step N clears the
leftover. Each publication reports the staging and writing seconds next to
the mean update time of the steps it overlapped.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from hymo_core.checkpoint.common import checkpoint_path
from hymo_core.checkpoint.single import CheckpointDirectory
from hymo_core.distributed.process_group import Runtime, any_rank
from hymo_core.checkpoint.sharded import PendingSave, finish_sharded_checkpoint, start_sharded_checkpoint


class BackgroundCheckpoints:
    def __init__(self, directory: CheckpointDirectory, runtime: Runtime, report: Callable[[dict[str, Any]], None] | None = None):
        self.directory, self.runtime, self.report = directory, runtime, report
        self.pending: PendingSave | None = None
        self.val_loss: float | None = None
        self.overlapped_updates, self.overlapped_seconds, self.last_update = 0, 0.0, time.perf_counter()

    def save(self, step: int, val_loss: float | None, **objects: Any) -> None:
        """Start writing the checkpoint of update `step` (after waiting for a previous one)."""
        if self.pending is not None:
            self._publish()
        self.pending = start_sharded_checkpoint(checkpoint_path(self.directory.directory, step, sharded=True),
                                                runtime=self.runtime, **objects)
        self.val_loss = val_loss
        self.overlapped_updates, self.overlapped_seconds, self.last_update = 0, 0.0, time.perf_counter()

    def poll(self) -> None:
        """After an update: publish the pending checkpoint once every rank has written its files."""
        if self.pending is None:
            return
        now = time.perf_counter()
        self.overlapped_updates += 1
        self.overlapped_seconds += now - self.last_update
        self.last_update = now
        if not any_rank(not self.pending.done(), self.runtime.device):
            self._publish()

    def close(self) -> Path | None:
        """Wait for and publish the last checkpoint; returns its path (None when nothing was pending)."""
        if self.pending is None:
            return None
        return self._publish()

    def _publish(self) -> Path:
        pending, self.pending = self.pending, None
        path = finish_sharded_checkpoint(pending, self.runtime)
        write_seconds = time.perf_counter() - pending.started
        self.directory.record(pending.step, self.val_loss, path)
        if self.report is not None:
            step_seconds = self.overlapped_seconds / self.overlapped_updates if self.overlapped_updates else None
            self.report({"kind": "checkpoint", "step": pending.step, "path": path.name, "stage_seconds": pending.stage_seconds,
                         "write_seconds": write_seconds, "overlapped_updates": self.overlapped_updates,
                         "step_seconds": step_seconds})
        return path
