"""A simulated cluster on one host: every 'machine' a process in its own empty working directory, HOME and TMPDIR.

Only the run directory is shared (a path given to all of them). Commands come from infra/README.md's
recipe, with ports, hosts and paths filled in, so the test runs what a user would type.
"""
from __future__ import annotations

import base64
import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "infra" / "README.md").read_text(encoding="utf-8")
RECIPE = README[README.index("## The data stages on a Dask cluster"):].split("\n## ", 1)[0]  # that section's commands only
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def recipe_line(starts: str, values: dict[str, str]) -> list[str]:
    """The README's command line that starts with `starts`, its placeholders replaced: argv."""
    lines = [line.strip() for line in RECIPE.splitlines() if line.strip().startswith(starts)]
    assert lines, f"infra/README.md has no line starting {starts!r}"
    line = lines[0]
    for placeholder, value in values.items():
        line = line.replace(placeholder, value)
    return shlex.split(line)


def recipe_exports(values: dict[str, str]) -> dict[str, str]:
    """Every `export A=B C=D` line of the README's recipe, placeholders replaced."""
    found = {}
    for line in RECIPE.splitlines():
        if line.strip().startswith("export "):
            for word in recipe_line(line.strip(), values)[1:]:
                name, _, value = word.partition("=")
                found[name] = value
    return found


@dataclass
class Machine:
    root: Path
    env: dict[str, str]
    processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def cwd(self) -> Path:
        return self.root / "cwd"

    def start(self, argv: list[str], log: str) -> subprocess.Popen:
        executable = BIN / argv[0]
        command = [str(executable), *argv[1:]] if executable.exists() else argv
        with open(self.root / log, "ab") as out:
            process = subprocess.Popen(command, cwd=self.cwd, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
        self.processes.append(process)
        return process

    def log(self, name: str) -> str:
        return (self.root / name).read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def machine(root: Path, name: str, **env: str) -> Machine:
    """A machine's own empty working directory, HOME and TMPDIR; nothing of this host's Prefect or Dask settings."""
    home = root / name
    for sub in ("cwd", "home", "tmp"):
        (home / sub).mkdir(parents=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "DASK_"))}
    return Machine(home, {**base, "HOME": str(home / "home"), "TMPDIR": str(home / "tmp"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                          "HYMO_PROGRESS": "0", **env})


def api_call(api_url: str, path: str, body: dict | None, auth: str | None) -> tuple[int, object]:
    """POST (body) or GET a Prefect API route with basic auth (or none): (status, JSON)."""
    headers = {"Content-Type": "application/json"}
    if auth:
        headers["Authorization"] = "Basic " + base64.b64encode(auth.encode()).decode()
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{api_url}{path}", data=data, headers=headers, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, None


def wait_until(check, what: str, timeout_s: float, alive: list[tuple[subprocess.Popen, Machine, str]]) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        for process, owner, log in alive:
            if process.poll() is not None:
                raise RuntimeError(f"{log} exited with {process.returncode} while waiting for {what}:\n{owner.log(log)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.2)
