"""`python -m hymo_core.train` with one injected fault: rank 1 SIGKILLs itself right after the checkpoint at step
$HYMO_TEST_KILL_STEP is published (test_distributed.py launches this under torchrun in place of the trainer)."""
from __future__ import annotations

import os
import signal
import sys

from hymo_core.train import run as train
from hymo_core.checkpoint.single import CheckpointDirectory

KILL_STEP = int(os.environ["HYMO_TEST_KILL_STEP"])
original_save = CheckpointDirectory.save


def save_then_die(self, step, val_loss, save=None, **objects):
    path = original_save(self, step, val_loss, save, **objects)
    if step == KILL_STEP and os.environ.get("RANK") == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    return path


CheckpointDirectory.save = save_then_die

if __name__ == "__main__":
    sys.exit(train.main())
