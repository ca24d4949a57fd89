"""Where Prefect keeps its database, and whether it phones home: under $HYMO_HOME whatever the working directory,
and with the client's telemetry off as well as the server's."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_prefect_database_lives_under_hymo_home_not_the_working_directory(tmp_path: Path, monkeypatch) -> None:
    from flows.server import LocalServer

    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setenv("HYMO_HOME", str(home))
    monkeypatch.chdir(elsewhere)
    server = LocalServer(port=1)
    assert server.home == home / ".hymo" / "prefect" and str(home / ".hymo" / "prefect" / "prefect.db") in server.database_url
    assert not any(elsewhere.iterdir()) and not home.exists()  # nothing made before the server starts


def test_prefect_client_telemetry_is_off_too() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DO_NOT_TRACK", "PREFECT_SERVER_ANALYTICS_ENABLED")}
    probe = ("import os\nfrom flows.prefect_env import apply_prefect_defaults\napply_prefect_defaults()\n"
             "from prefect._internal.analytics.enabled import is_telemetry_enabled\n"
             "print(os.environ['DO_NOT_TRACK'], os.environ['PREFECT_SERVER_ANALYTICS_ENABLED'], is_telemetry_enabled())\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["1", "false", "False"], done.stderr
