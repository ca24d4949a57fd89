"""The pipeline against a Prefect server backed by PostgreSQL, as a team runs it (infra/README.md).

Debian's `postgresql` (installed by .ci/run and the README's test command): a throw-away cluster
made with initdb in a temporary directory, started with pg_ctl as the postgres user on 127.0.0.1 at
a free port. `hymo run` is pointed at it only through the environment (PREFECT_API_URL that nothing
answers yet, PREFECT_API_DATABASE_CONNECTION_URL), so it starts its Prefect server on that port, on
that database; the flow and task runs are then read back from PostgreSQL itself.
"""
from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import REPO

from flows.config import load_config
from flows.server import free_port
from flows.stages import pipeline_stages


def pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        pytest.fail(f"PostgreSQL's {name} not found: install Debian's postgresql (apt-get install -y postgresql), as .ci/run does")
    return found[-1]


def as_postgres(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    """Run a server tool as the postgres user when we are root (PostgreSQL refuses to run as root)."""
    if os.geteuid() == 0:
        argv = ["runuser", "-u", "postgres", "--", *argv]
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=120, **kwargs)


@pytest.fixture(scope="module")
def postgres() -> str:
    """A running PostgreSQL cluster with an empty `prefect` database; yields its SQLAlchemy URL."""
    data = Path(tempfile.mkdtemp(prefix="hymo-pg-"))
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(data, user.pw_uid, user.pw_gid)
    port = free_port()
    as_postgres([pg_bin("initdb"), "-D", str(data / "db"), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"])
    options = f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c fsync=off"
    as_postgres([pg_bin("pg_ctl"), "-D", str(data / "db"), "-o", options, "-l", str(data / "postgres.log"), "-w", "start"])
    try:
        as_postgres([pg_bin("createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "prefect"])
        yield f"postgresql+asyncpg://postgres@127.0.0.1:{port}/prefect"
    finally:
        with contextlib.suppress(subprocess.SubprocessError):
            as_postgres([pg_bin("pg_ctl"), "-D", str(data / "db"), "-m", "fast", "-w", "stop"])
        shutil.rmtree(data, ignore_errors=True)


def query(database_url: str, sql: str) -> list[list[str]]:
    where = database_url.removeprefix("postgresql+asyncpg://postgres@")
    port = where.split(":")[1].split("/")[0]
    out = subprocess.run(["psql", "-h", "127.0.0.1", "-p", port, "-U", "postgres", "-d", "prefect", "-At", "-F", "\t", "-c", sql],
                         check=True, capture_output=True, text=True, timeout=60).stdout
    return [line.split("\t") for line in out.splitlines()]


def test_hymo_run_on_a_postgres_backed_server_at_the_port_of_prefect_api_url(postgres: str, tiny_config: Path, tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "PREFECT_API_URL": f"http://127.0.0.1:{port}/api", "PREFECT_API_DATABASE_CONNECTION_URL": postgres,
           "PREFECT_HOME": str(tmp_path / "prefect-home"), "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-m", "flows", "run", "--config", str(tiny_config), "--out", str(tmp_path / "run")],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    server_log = (tmp_path / ".hymo" / "prefect" / "server.log").read_text(errors="replace")
    assert f"127.0.0.1:{port}" in server_log  # the server was started where PREFECT_API_URL pointed

    flow_runs = query(postgres, "select f.name, r.state_name from flow_run r join flow f on f.id = r.flow_id")
    assert flow_runs == [["hymo-pipeline", "Completed"]]
    task_runs = dict(query(postgres, "select name, state_name from task_run where name not like '%-shards-%'"))
    assert task_runs == {entry.name: "Completed" for entry in pipeline_stages(load_config(str(tiny_config)))}
    (batches,) = query(postgres, "select count(*) from task_run where name like '%-shards-%' and state_name = 'Completed'")
    assert int(batches[0]) >= 7  # every document stage mapped its shards as task runs recorded in PostgreSQL
