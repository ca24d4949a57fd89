"""Start the trainer under torchrun as one process group, stream its output, and take the group down with us.

`torchrun_command` builds the single-node launch (`python -m
torch.distributed.run --standalone --nproc-per-node N -m hymo_core.train ...`);
multi-node launches are the same module with `--nnodes/--rdzv-*` (infra/README.md).

`run_process_group` starts a command in a new session (its own process
group: torchrun and every rank it spawns), hands each output line to a
callback as it arrives (ranks other than 0 print nothing but errors), and,
whatever ends the wait (the callback raising, a KeyboardInterrupt, Prefect
cancelling the task), signals the whole group: SIGTERM, then SIGKILL after a
grace period. Should the caller's process end without unwinding, an atexit
hook does the same, and torchrun itself gets SIGTERM when its parent dies
(PR_SET_PDEATHSIG), which makes it stop its ranks. No rank outlives its caller.
"""
from __future__ import annotations

import atexit
import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable, Sequence

GRACE_SECONDS = 10.0
PR_SET_PDEATHSIG = 1
_LIVE_GROUPS: set[subprocess.Popen] = set()  # taken down at interpreter exit, whatever ended the caller


class LaunchError(RuntimeError):
    """The process group exited with a non-zero status; the message holds its last output lines."""


def torchrun_command(nproc: int, train_args: Sequence[str], module: str = "hymo_core.train") -> list[str]:
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", module, *train_args]


def train_arguments(corpus: str | Path, out: str | Path, config: str | Path | None = None, max_steps: int | None = None,
                    horizon: int | None = None, resume: bool = False) -> list[str]:
    """The `python -m hymo_core.train` arguments for one run (the same flags as `hymo train`)."""
    args = ["--corpus", str(corpus), "--out", str(out)]
    if config:
        args += ["--config", str(config)]
    if max_steps is not None:
        args += ["--max-steps", str(max_steps)]
    if horizon is not None:
        args += ["--horizon", str(horizon)]
    if resume:
        args.append("--resume")
    return args


def terminate_group(process: subprocess.Popen, grace: float = GRACE_SECONDS) -> None:
    """SIGTERM to the whole group, SIGKILL to what is left after `grace` seconds."""
    if process.poll() is not None:
        _kill_leftovers(process.pid)
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    except ProcessLookupError:
        return
    _kill_leftovers(process.pid)
    process.wait()


def _kill_leftovers(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it if the launching process dies (torchrun then stops its ranks)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the atexit and finally paths still apply
        pass


@atexit.register
def _terminate_live_groups() -> None:
    for process in list(_LIVE_GROUPS):
        terminate_group(process, grace=2.0)


def run_process_group(command: Sequence[str], on_line: Callable[[str], None], env: dict[str, str] | None = None,
                      cwd: str | Path | None = None, keep_lines: int = 40) -> None:
    """Run `command` as its own process group, feeding each output line to `on_line`; raise LaunchError on failure."""
    process = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                               env=env, cwd=cwd, start_new_session=True, preexec_fn=_die_with_parent)
    _LIVE_GROUPS.add(process)
    tail: list[str] = []
    try:
        assert process.stdout is not None
        for line in process.stdout:
            line = line.rstrip("\n")
            tail = (tail + [line])[-keep_lines:]
            on_line(line)
        code = process.wait()
    finally:
        terminate_group(process)
        _LIVE_GROUPS.discard(process)
    if code != 0:
        raise LaunchError(f"{' '.join(command[:6])} … exited with status {code}:\n" + "\n".join(tail))


def launch_training(nproc: int, train_args: Sequence[str], on_line: Callable[[str], None] = print,
                    env: dict[str, str] | None = None) -> None:
    """`python -m hymo_core.train` on `nproc` local ranks (gloo on CPU, nccl on CUDA: each rank picks)."""
    environment = dict(os.environ if env is None else env)
    environment.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    environment.setdefault("HYMO_PROGRESS", "0")  # a live bar through a pipe is noise
    run_process_group(torchrun_command(nproc, train_args), on_line, environment)
