"""`python -m hymo_core.train` with one injected fault on rank 1, in the first attempt only (a torchrun
restart runs clean); test_distributed.py launches this module in place of the trainer.

- HYMO_TEST_KILL_STEP=N: SIGKILL right after the checkpoint of step N is published (entered in the index);
- HYMO_TEST_KILL_WRITING=N: SIGKILL while the background write of step N's checkpoint opens its files.
"""
from __future__ import annotations

import os
import signal
import sys

from hymo_core.checkpoint.hashing_writer import HashingFileSystem
from hymo_core.checkpoint.single import CheckpointDirectory
from hymo_core.train import run as train

FAULTY = os.environ.get("RANK") == "1" and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
KILL_STEP = int(os.environ.get("HYMO_TEST_KILL_STEP", "0"))
KILL_WRITING = int(os.environ.get("HYMO_TEST_KILL_WRITING", "0"))
original_record = CheckpointDirectory.record
original_create_stream = HashingFileSystem.create_stream


def record_then_die(self, step, val_loss, path):
    path = original_record(self, step, val_loss, path)
    if FAULTY and step == KILL_STEP:
        os.kill(os.getpid(), signal.SIGKILL)
    return path


def die_while_writing(self, path, mode):
    if FAULTY and f"step-{KILL_WRITING:08d}.tmp" in str(path) and "w" in mode:
        os.kill(os.getpid(), signal.SIGKILL)
    return original_create_stream(self, path, mode)


CheckpointDirectory.record = record_then_die
HashingFileSystem.create_stream = die_while_writing

if __name__ == "__main__":
    sys.exit(train.main())
