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

`launch_training` runs torchrun with `--tee 3`, so every line a rank prints
reaches us prefixed with its rank; `RankLogs` writes each rank's full output to
`OUT/logs/rank-N.log` (torchrun's own lines to `OUT/logs/torchrun.log`), passes
rank 0's lines on, and keeps the first error line of any rank: a failed launch
raises LaunchError naming that rank and its line, not torchrun's traceback.
`--max-restarts N` lets torchrun restart the whole group after a rank dies; a
restarted rank resumes from the newest complete checkpoint (hymo_core.train.main).
"""
from __future__ import annotations

import atexit
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Sequence

from hymo_core.distributed.process_group import Runtime
from hymo_core.exit_codes import STOP_PREFIX, STOPPED
from hymo_core.threads import child_environment, choose_threads
from hymo_core.train.config import METRICS_FILE, TrainConfig

GRACE_SECONDS = 10.0
PR_SET_PDEATHSIG = 1
_LIVE_GROUPS: set[subprocess.Popen] = set()  # taken down at interpreter exit, whatever ended the caller


class LaunchError(RuntimeError):
    """The process group exited with a non-zero status; the message holds its last output lines,
    or, from `launch_training`, the first error line of the rank that failed first."""

    def __init__(self, message: str, rank: int | None = None, log: Path | None = None, code: int | None = None,
                 stopped: bool = False, refused: bool = False):
        super().__init__(message)
        self.rank, self.log, self.code = rank, log, code
        self.stopped = stopped  # a rank ended on an alert's `stop` (exit 3), not on an error: hymo_core.exit_codes
        self.refused = refused  # a rank refused its inputs in one `error:` line (exit 2), rather than crashing


def torchrun_command(nproc: int, train_args: Sequence[str], module: str = "hymo_core.train", max_restarts: int = 0,
                     log_dir: str | Path | None = None) -> list[str]:
    """Single-node torchrun; with `log_dir` every rank's output is teed, each line prefixed with its rank."""
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    if max_restarts < 0:
        raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
    options = [f"--max-restarts={max_restarts}"] if max_restarts else []
    if log_dir is not None:
        options += ["--tee=3", f"--log-dir={log_dir}"]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *options, "-m", module,
            *train_args]


RANK_PREFIX = re.compile(r"^\[default(\d+)\]:(?:\[rank\d+\]: ?)?")  # torchrun --tee: "[default<local rank>]:"
ERROR_LINE = re.compile(r"^error: ")
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b.*")
CHILD_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)")


class RankLogs:
    """Demultiplexes torchrun's teed output: OUT/logs/rank-N.log per rank, rank 0's lines passed on, first error kept."""

    def __init__(self, directory: Path, on_line: Callable[[str], None], ranks: int = 0):
        self.directory, self.on_line = Path(directory), on_line
        self.directory.mkdir(parents=True, exist_ok=True)
        self.files: dict[str, object] = {}
        for rank in range(ranks):  # a rank that prints nothing still has its (empty) log
            self._open(rank)
        self.first_error: tuple[int, str] | None = None
        self.stop: tuple[int, str] | None = None  # a rank's `stopped: ...` line (hymo_core.exit_codes.stop_line)
        self.in_traceback: set[int] = set()
        self.exception: dict[int, str] = {}
        self.exit_codes: dict[int, int] = {}

    def path(self, rank: int | None) -> Path:
        return self.directory / ("torchrun.log" if rank is None else f"rank-{rank}.log")

    def _open(self, rank: int | None):
        key = str(rank)
        if key not in self.files:
            self.files[key] = open(self.path(rank), "a", encoding="utf-8")
        return self.files[key]

    def _write(self, rank: int | None, line: str) -> None:
        handle = self._open(rank)
        handle.write(line + "\n")
        handle.flush()

    def __call__(self, line: str) -> None:
        match = RANK_PREFIX.match(line)
        if match is None:
            self._write(None, line)
            failed = CHILD_FAILED.search(line)
            if failed:
                self.exit_codes.setdefault(int(failed.group(2)), int(failed.group(1)))
            return
        rank, text = int(match.group(1)), line[match.end():]
        self._write(rank, text)
        if ERROR_LINE.match(text) and self.first_error is None:
            self.first_error = (rank, text.removeprefix("error: "))
        if text.startswith(STOP_PREFIX) and self.stop is None:
            self.stop = (rank, text)
        if text.startswith("Traceback (most recent call last)"):
            self.in_traceback.add(rank)
        elif rank in self.in_traceback and EXCEPTION_LINE.match(text):
            self.in_traceback.discard(rank)
            self.exception.setdefault(rank, text)
        if rank == 0:
            self.on_line(text)

    def failure(self, code: int | None) -> LaunchError:
        """The error a failed launch raises: the first `error:` line of any rank, else a rank killed by a signal,
        else the first exception, else the first non-zero exit torchrun reported."""
        killed = {rank: status for rank, status in self.exit_codes.items() if status < 0 and -status != signal.SIGTERM}
        if self.stop is not None and self.first_error is None and not killed and set(self.exit_codes.values()) <= {STOPPED}:
            rank, line = self.stop  # an alert stopped the run: the rank's own line, which names the summary
            return LaunchError(line, rank, self.path(rank), code, stopped=True)
        refused = self.first_error is not None and not killed
        if self.first_error is not None:
            rank, message = self.first_error
        elif killed:  # killed from outside (OOM killer, SIGKILL): the others' errors are only its consequences
            rank, status = next(iter(killed.items()))
            message = f"exited with {_describe_status(status)}"
        elif self.exception:
            rank = next(iter(self.exception))
            message = self.exception[rank]
        elif self.exit_codes:
            rank, status = next(iter(self.exit_codes.items()))
            message = f"exited with {_describe_status(status)}"
        else:
            return LaunchError(f"torchrun exited with status {code} before any rank failed (see {self.path(None)})", None,
                               self.path(None), code)
        return LaunchError(f"rank {rank}: {message} (full output: {self.path(rank)})", rank, self.path(rank), code, refused=refused)

    def close(self) -> None:
        for handle in self.files.values():
            handle.close()
        self.files.clear()


def _describe_status(status: int) -> str:
    if status < 0:
        try:
            return f"signal {signal.Signals(-status).name}"
        except ValueError:
            return f"signal {-status}"
    return f"status {status}"


def train_arguments(corpus: str | Path, out: str | Path, config: str | Path | None = None, max_steps: int | None = None,
                    horizon: int | None = None, resume: bool | str = False, strict_resume: bool = False) -> list[str]:
    """The `python -m hymo_core.train` arguments for one run (the same flags as `hymo train`).
    `resume`: a hymo_core.train.run.RESUME_MODES entry, or True ("if-any": the pipeline's) / False ("never")."""
    args = ["--corpus", str(corpus), "--out", str(out)]
    if config:
        args += ["--config", str(config)]
    if max_steps is not None:
        args += ["--max-steps", str(max_steps)]
    if horizon is not None:
        args += ["--horizon", str(horizon)]
    mode = {True: "if-any", False: "never"}.get(resume, resume) if isinstance(resume, bool) else resume
    args += {"never": [], "required": ["--resume"], "if-any": ["--resume-or-start"]}[mode]
    if strict_resume:
        args.append("--strict-resume")
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
        raise LaunchError(f"{' '.join(command[:6])} … exited with status {code}:\n" + "\n".join(tail), code=code)


class MetricsFollower:
    """Reads the records rank 0 appends to OUT/metrics.jsonl and hands each complete one to `report`, once.

    How a supervising process (the CLI, the Prefect pretrain stage) sees the run live without
    parsing console lines. A resumed run rewrites the file shorter: reading starts over.
    """

    def __init__(self, path: Path, report: Callable[[dict], None]):
        self.path, self.report, self.offset = Path(path), report, 0

    def __call__(self) -> None:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return
        if size < self.offset:
            self.offset = 0
        if size == self.offset:
            return
        with open(self.path, "rb") as handle:
            handle.seek(self.offset)
            chunk = handle.read(size - self.offset)
        complete = chunk[:chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.decode("utf-8").splitlines():
            if line.strip():
                self.report(json.loads(line))


def check_batch_plan(config: TrainConfig, nproc: int) -> None:
    """Before torchrun starts: the global batch must split over `nproc` ranks, and the mesh make `nproc` ranks."""
    Runtime(world_size=nproc).batch_plan(config)
    config.mesh_shape(nproc)
    config.expert_mesh_shape(nproc)


def rank_environment(nproc: int, threads: int | None, environment: dict[str, str]) -> dict[str, str]:
    """`environment` plus each rank's thread count: the policy's choice for `nproc` ranks sharing this
    machine's usable CPUs (usable // nproc), unless --threads, HYMO_THREADS or OMP_NUM_THREADS says otherwise."""
    choice = choose_threads(threads, ranks=nproc, environ=environment)
    return {**environment, **child_environment(choice)}


def launch_training(nproc: int, train_args: Sequence[str], on_line: Callable[[str], None] = print,
                    env: dict[str, str] | None = None, max_restarts: int = 0, logs: str | Path | None = None,
                    report: Callable[[dict], None] | None = None, module: str = "hymo_core.train",
                    threads: int | None = None) -> None:
    """`python -m hymo_core.train` on `nproc` local ranks (gloo on CPU, nccl on CUDA: each rank picks).

    Each rank's output goes to `logs/rank-N.log` (default OUT/logs, OUT from `--out`), rank 0's
    lines to `on_line`, and every metrics record rank 0 writes to `report` as it appears. A
    failure raises LaunchError naming the rank that failed first and its first error line.
    `max_restarts`: torchrun restarts the whole group that often after a rank dies.
    `threads`: per rank (`--threads`); default: the thread policy's (hymo_core/threads.py) for `nproc` ranks.
    """
    environment = rank_environment(nproc, threads, dict(os.environ if env is None else env))
    environment.setdefault("HYMO_PROGRESS", "0")  # a live bar through a pipe is noise
    environment.setdefault("PYTHONUNBUFFERED", "1")  # lines reach the tee as they are printed
    args = list(train_args)
    out = Path(args[args.index("--out") + 1])
    rank_logs = RankLogs(Path(logs) if logs is not None else out / "logs", on_line, nproc)
    if max_restarts:
        # A restarted group must not read the previous attempt's addresses from the rendezvous store it would
        # otherwise share (pytorch/pytorch#135712): gloo then connects to a dead rank and the restart fails.
        environment.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    follow = MetricsFollower(out / METRICS_FILE, report) if report is not None else None
    tee_dir = tempfile.mkdtemp(prefix="hymo-torchrun-")

    def each_line(line: str) -> None:
        rank_logs(line)
        if follow is not None:
            follow()

    try:
        run_process_group(torchrun_command(nproc, args, module, max_restarts, tee_dir), each_line, environment)
    except LaunchError as exc:
        raise rank_logs.failure(exc.code) from None
    finally:
        rank_logs.close()
        shutil.rmtree(tee_dir, ignore_errors=True)
        if follow is not None:
            follow()
