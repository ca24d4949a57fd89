"""Run untrusted generated Python (HumanEval completions) in a separate process, bounded in time, memory and network.

What it guarantees, by isolation mode (the mode is recorded in eval.json):

* ``netns`` (``unshare -n``, or ``unshare -rn`` for an unprivileged user, when
  the kernel allows it): the program runs in a fresh network namespace with
  only a downed loopback device, so no socket can reach any host, whatever
  the code does (raw ``_socket``, ``ctypes``, subprocesses included).
* ``guard`` (no namespace available): ``socket.socket``, ``socket.create_connection``
  and ``socket.getaddrinfo`` are replaced before the program runs, so ordinary
  library code cannot connect; deliberately adversarial code can still reach
  ``_socket`` directly. This is protection against accidents, not against an attacker.

In both modes: a fresh ``python -I`` (no user site, no PYTHON* variables, no
cwd on sys.path), an empty temporary working directory that is deleted after,
a minimal environment, its own session (a timeout kills the whole process
group), RLIMIT_AS 1 GiB, RLIMIT_CPU = timeout + 1 s, RLIMIT_FSIZE 16 MiB and no
core files (RLIMIT_NPROC is left alone: it counts all of the user's processes). The file system is not made read-only: it is not a container.
"""
from __future__ import annotations

import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

MEMORY_BYTES = 1 << 30
FILE_BYTES = 16 << 20
NETWORK_GUARD = """\
import socket as _s
def _blocked(*args, **kwargs):
    raise OSError("network access is disabled in the HyMo evaluation sandbox")
_s.socket = _blocked
_s.create_connection = _blocked
_s.getaddrinfo = _blocked
del _s
"""


@dataclass(frozen=True)
class RunResult:
    passed: bool  # exit status 0 within the time limit
    status: str  # "passed" | "failed" | "timeout"
    detail: str  # the tail of stderr, or the time limit


@functools.lru_cache(maxsize=1)
def isolation_prefix() -> tuple[str, ...]:
    """The command prefix that gives a network namespace here, or () when the kernel refuses one."""
    if not shutil.which("unshare"):
        return ()
    for prefix in (("unshare", "-n"), ("unshare", "-rn")):
        try:
            if subprocess.run([*prefix, "true"], capture_output=True, timeout=10).returncode == 0:
                return prefix
        except (OSError, subprocess.TimeoutExpired):
            continue
    return ()


def isolation_mode() -> str:
    return "netns" if isolation_prefix() else "guard"


def _limits(timeout_s: float) -> None:
    """In the child before exec: bounded CPU, memory, file size; no core dumps."""
    cpu = int(timeout_s) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_BYTES, FILE_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run_program(program: str, timeout_s: float = 10.0) -> RunResult:
    """Execute `program` with the current interpreter in the sandbox; passed iff it exits 0 in time."""
    prefix = isolation_prefix()
    source = program if prefix else NETWORK_GUARD + program
    workdir = tempfile.mkdtemp(prefix="hymo-sandbox-")
    try:
        with open(os.path.join(workdir, "program.py"), "w", encoding="utf-8") as handle:
            handle.write(source)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
        process = subprocess.Popen([*prefix, sys.executable, "-I", "program.py"], cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                                   preexec_fn=functools.partial(_limits, timeout_s))
        try:
            _, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            return RunResult(False, "timeout", f"no exit within {timeout_s:g} s")
        tail = stderr.decode("utf-8", "replace")[-500:]
        return RunResult(process.returncode == 0, "passed" if process.returncode == 0 else "failed", tail)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
