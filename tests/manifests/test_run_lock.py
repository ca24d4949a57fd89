"""One writer per run directory: a second run fails (or waits) naming the holder; a killed holder frees it."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from manifests.run_lock import RunLocked, run_lock

HOLD = ("import sys, time, pathlib; from manifests.run_lock import run_lock\nwith run_lock(sys.argv[1]):\n    print('held', flush=True)\n"
        "    time.sleep(float(sys.argv[2]))\n    pathlib.Path(sys.argv[1], 'holder-done').touch()\n")


def hold_in_child(run: Path, seconds: float) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(run), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    return child


def test_second_run_fails_naming_the_holder_and_a_sigkilled_holder_frees_the_directory(tmp_path: Path) -> None:
    child = hold_in_child(tmp_path / "run", 120)
    try:
        with pytest.raises(RunLocked) as caught:
            with run_lock(tmp_path / "run", wait_s=0):
                pass
        message = str(caught.value)
        assert f"pid {child.pid}" in message and socket.gethostname() in message and "run_lock(sys.argv[1])" in message
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    with run_lock(tmp_path / "run", wait_s=0) as lock_path:  # the OS dropped the dead holder's lock
        assert str(os.getpid()) in lock_path.read_text()


def test_a_waiting_run_gets_the_directory_when_the_holder_finishes(tmp_path: Path) -> None:
    child = hold_in_child(tmp_path / "run", 1.5)
    with run_lock(tmp_path / "run", wait_s=120):
        assert (tmp_path / "run" / "holder-done").exists()  # we only got in after the holder was done
    assert child.wait() == 0


def test_the_lock_is_reentrant_within_one_process(tmp_path: Path) -> None:
    with run_lock(tmp_path / "run", wait_s=0):
        with run_lock(tmp_path / "run", wait_s=0):
            pass
        child = subprocess.run([sys.executable, "-c", HOLD, str(tmp_path / "run"), "0"], capture_output=True, text=True)
        assert child.returncode != 0 and "RunLocked" in child.stderr  # still held after the inner block
