"""A local Prefect server for `hymo serve` and the tests: start it if none answers, wait for health, stop it.

SQLite under a project-local directory by default (PREFECT_API_DATABASE_CONNECTION_URL, e.g. a
PostgreSQL URL, when set), bound to 127.0.0.1 or to the host and port of the PREFECT_API_URL that did
not answer. The server runs in its own process group so stopping it also stops the services it spawned,
and it dies with its parent (a parent-death signal) so a killed `hymo run` leaves nothing behind.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Iterator

PREFECT_DIR = Path(".hymo") / "prefect"  # under $HYMO_HOME: one database for every command, wherever it is run from


def default_home() -> Path:
    """$HYMO_HOME/.hymo/prefect (HYMO_HOME: the current directory when unset), read when a server starts."""
    from flows.config import hymo_home

    return hymo_home() / PREFECT_DIR
HEALTH_TIMEOUT_S = 240.0
LOCAL_HOSTS = ("127.0.0.1", "localhost", "0.0.0.0", "::1")  # an unanswered API here is started here
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent() -> None:
    """In the child, before exec: ask Linux to send SIGTERM when the parent dies, even by SIGKILL.

    The server lives in its own session (so Ctrl-C in the terminal reaches HyMo,
    which stops it in order); without this a killed `hymo run` left it running
    forever. The signal follows the thread that started the server, so servers
    are started from the main thread. Elsewhere than Linux this does nothing.
    """
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() == 1:  # the parent already died between fork and prctl
            os.kill(os.getpid(), signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def api_healthy(api_url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=timeout_s) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def refuses_this_client(api_url: str) -> bool:
    """True when the API answers 401 to this client's credentials (PREFECT_API_AUTH_STRING, or none)."""
    import base64

    from prefect.settings import get_current_settings

    secret = get_current_settings().api.auth_string
    auth = secret.get_secret_value() if secret is not None else None
    headers = {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()} if auth else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(f"{api_url.rstrip('/')}/admin/version", headers=headers), timeout=10):
            return False
    except urllib.error.HTTPError as exc:
        return exc.code == 401
    except (urllib.error.URLError, OSError, ValueError):
        return False


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class LocalServer:
    """`prefect server start` as a child process; `api_url` answers once `start()` returns."""

    def __init__(self, home: Path | None = None, host: str = "127.0.0.1", port: int = 4200, database_url: str | None = None):
        home = Path(home) if home is not None else default_home()
        self.home, self.host, self.port = Path(home).resolve(), host, port
        # The caller's database (PostgreSQL for a team), else SQLite in `home`.
        self.database_url = database_url or os.environ.get("PREFECT_API_DATABASE_CONNECTION_URL") or f"sqlite+aiosqlite:///{self.home / 'prefect.db'}"
        self.api_url = f"http://{host}:{port}/api"
        self.ui_url = f"http://{host}:{port}"
        self.process: subprocess.Popen | None = None
        self.startup_s: float | None = None
        self.log_path = self.home / "server.log"

    def start(self) -> "LocalServer":
        started = time.monotonic()
        self.home.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "PREFECT_HOME": str(self.home),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_API_DATABASE_CONNECTION_URL": self.database_url,
            "PREFECT_UI_API_URL": self.api_url,
        }
        env.pop("PREFECT_API_URL", None)
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", self.host, "--port", str(self.port), "--analytics-off"],
            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=die_with_parent,
        )
        log.close()
        deadline = time.monotonic() + HEALTH_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"Prefect server exited with {self.process.returncode}; see {self.log_path}")
            if api_healthy(self.api_url):
                self.startup_s = time.monotonic() - started  # benchmarks report it
                return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"Prefect server not healthy after {HEALTH_TIMEOUT_S:.0f} s; see {self.log_path}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def drain_prefect_workers() -> None:
    """Send buffered logs and events while the API still answers; after it stops they would
    make Prefect start a temporary server of its own just to deliver them."""
    import inspect

    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.utilities.asyncutils import run_coro_as_sync

    async def drain() -> None:
        with contextlib.suppress(RuntimeError):  # a worker that never started
            result = APILogWorker.instance().drain()
            if inspect.isawaitable(result):
                await result
        result = EventsWorker.drain_all()
        if inspect.isawaitable(result):
            await result

    run_coro_as_sync(drain())


@contextlib.contextmanager
def global_settings_like_current() -> Iterator[None]:
    """Threads Prefect starts itself (process-pool message forwarding, log and event workers) see the
    process-global settings, not ours; without this they find no API URL and start a temporary server."""
    import prefect.context

    with prefect.context._temporary_global_settings_context(prefect.context.get_settings_context()):
        yield


@contextlib.contextmanager
def prefect_api(api_url: str | None = None, home: Path | None = None, port: int | None = None, reuse: bool = True) -> Iterator[tuple[str, str]]:
    """Use the server at `api_url` (or $PREFECT_API_URL, or a `hymo serve` on :4200) if it answers;
    otherwise (or when not `reuse`) run a local one meanwhile. Yields (api_url, ui_url) with Prefect's settings and the
    environment (inherited by worker processes) pointed at that API.
    """
    from prefect.settings import PREFECT_API_URL, temporary_settings

    asked = api_url or os.environ.get("PREFECT_API_URL")
    wanted = asked or "http://127.0.0.1:4200/api"
    if reuse and api_healthy(wanted):
        server = None
        if refuses_this_client(wanted):
            raise PermissionError(f"the Prefect API at {wanted} refuses this client (401): set PREFECT_API_AUTH_STRING to the "
                                  "server's PREFECT_SERVER_API_AUTH_STRING (user:password)")
    elif reuse and asked:  # the API the user named is not up: start it where they said it would be
        where = urllib.parse.urlsplit(asked)
        if where.hostname not in LOCAL_HOSTS:
            raise ConnectionError(f"the Prefect API at {asked} does not answer; start that server, or unset PREFECT_API_URL for a local one")
        server = LocalServer(home=home, host=where.hostname, port=where.port or port or free_port()).start()
    else:
        server = LocalServer(home=home, port=port or free_port()).start()
    url = server.api_url if server else wanted
    previous = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = url
    try:
        with temporary_settings(updates={PREFECT_API_URL: url}), global_settings_like_current():
            try:
                yield url, url.rstrip("/").removesuffix("/api")
            finally:
                drain_prefect_workers()
    finally:
        if server is not None:
            server.stop()
        if previous is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = previous
