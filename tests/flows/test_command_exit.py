"""`python -m flows` ends without the interpreter's teardown once its command returned (issue 57: 1-2 s after the
last line of a `hymo run`), after the exit handlers registered while it ran, with the command's exit code; a
command that leaves through SystemExit (argparse's --help) is torn down as usual."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Loaded at start-up: an object only the teardown frees, and an exit handler registered once the command line's
# module is imported (as logging's or multiprocessing's are, by the command).
SITECUSTOMIZE = '''
import atexit, sys

class WritesWhenFreed:
    def __init__(self, path):
        self.path = path

    def __del__(self, open=open):
        with open(self.path, "a") as handle:
            handle.write("torn down\\n")

class OnCliImport:
    def find_spec(self, name, path=None, target=None):
        if name == "flows.cli":
            sys.meta_path.remove(self)
            atexit.register(lambda: open({marker!r}, "a").write("exit handler\\n"))
        return None

sys.HELD_UNTIL_TEARDOWN = WritesWhenFreed({marker!r})
sys.meta_path.insert(0, OnCliImport())
'''


def hymo(tmp_path: Path, *args: str) -> tuple[int, str]:
    marker = tmp_path / "marker"
    marker.unlink(missing_ok=True)
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE.format(marker=str(marker)), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    done = subprocess.run([sys.executable, "-m", "flows", *args], env=env, capture_output=True, text=True, timeout=300)
    return done.returncode, marker.read_text() if marker.exists() else ""


@pytest.mark.parametrize("ok", [True, False])
def test_a_command_that_returns_ends_after_its_exit_handlers_without_teardown(tmp_path: Path, tiny_run: Path, ok: bool) -> None:
    code, marker = hymo(tmp_path, "manifest", "show", str(tiny_run) if ok else str(tmp_path / "no-such-run"))
    assert (code, marker) == (0 if ok else 1, "exit handler\n")


def test_a_command_that_exits_itself_is_torn_down_as_usual(tmp_path: Path) -> None:
    assert hymo(tmp_path, "--help") == (0, "exit handler\ntorn down\n")
