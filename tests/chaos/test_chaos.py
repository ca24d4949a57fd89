"""The fast chaos subset (CI): every stage SIGKILLed at a random moment, a write failing with
ENOSPC, and a killed `hymo run` that must leave no process behind. `bench/chaos.py` is the full one."""
from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import write_pipeline_config

from chaos_harness import REPO, chaos_run, child_env, differences, run_clean

SEED = int(os.environ.get("HYMO_CHAOS_SEED", "17"))


def test_every_stage_killed_at_a_random_moment_reruns_to_the_same_bytes(tmp_path: Path) -> None:
    config = write_pipeline_config(tmp_path)
    reference_s = run_clean(config, tmp_path / "reference")
    assert len(reference_s) == 13
    log = chaos_run(config, tmp_path / "chaos", reference_s, kills_per_stage=1, rng=random.Random(SEED))
    landed = {k.stage for k in log.kills if k.landed}
    assert landed == set(reference_s), f"stages never killed mid-run (seed {SEED}): {set(reference_s) - landed}; {log.kills}"
    assert differences(tmp_path / "reference", tmp_path / "chaos") == [], f"seed {SEED}, kills {log.kills}"


def test_a_failing_write_publishes_nothing_and_says_so_in_one_line(tmp_path: Path, upstream, monkeypatch) -> None:
    from flows.errors import explain
    from manifests import atomic
    from manifests.stage_manifest import StageNotComplete, read_manifest
    from tasks.filters.pii import PiiConfig, run_pii

    ingest = upstream({f"d{i}": f"Mail person{i}@example.org about the mill and the river. " * 4 for i in range(30)}, shards=4)
    real_write, real_fsync, writes = atomic.atomic_write_bytes, os.fsync, []

    def recording_write(path, payload):
        writes.append(path)
        real_write(path, payload)

    def disk_full_on_third_write(fd):  # where a full disk shows up with delayed allocation; the error names no file
        if len(writes) == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(atomic, "atomic_write_bytes", recording_write)
    monkeypatch.setattr(os, "fsync", disk_full_on_third_write)
    with pytest.raises(OSError) as caught:
        run_pii(PiiConfig(), ingest, tmp_path / "05_pii", workers=1)
    monkeypatch.setattr(os, "fsync", real_fsync)
    line = explain(caught.value)
    assert "\n" not in line and "stage pii failed" in line and str(writes[2]) in line and "free disk space" in line
    with pytest.raises(StageNotComplete):
        read_manifest(tmp_path / "05_pii")
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no .partial, no .old

    monkeypatch.setattr(atomic, "atomic_write_bytes", real_write)  # space again: the re-run completes
    again = run_pii(PiiConfig(), ingest, tmp_path / "05_pii", workers=1)
    clean = run_pii(PiiConfig(), ingest, tmp_path / "clean", workers=1)
    assert [(o.path, o.sha256) for o in again.outputs] == [(o.path, o.sha256) for o in clean.outputs]


FULL_DISK_SCRIPT = """
import json, subprocess, sys
from pathlib import Path
from flows.errors import explain
from tasks.filters.pii import PiiConfig, run_pii

upstream, run = Path(sys.argv[1]), Path(sys.argv[2])
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(run)], check=True)
try:
    run_pii(PiiConfig(), upstream, run / "05_pii", workers=1)
    line = None
except OSError as exc:
    line = explain(exc)
left = sorted(p.name for p in run.iterdir())
subprocess.run(["mount", "-o", "remount,size=16m", str(run)], check=True)  # space again
again = run_pii(PiiConfig(), upstream, run / "05_pii", workers=1)
print(json.dumps({"line": line, "left": left, "outputs": [[o.path, o.sha256] for o in again.outputs]}))
"""


def test_a_really_full_filesystem_publishes_nothing_and_the_rerun_completes(tmp_path: Path, upstream) -> None:
    """A real 48 KiB tmpfs under the run directory, in a private mount namespace (no root needed where user
    namespaces are allowed): ENOSPC comes from the kernel, not from a mock."""
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True, text=True) \
        if shutil.which("unshare") else None
    if probe is None or probe.returncode != 0:
        pytest.skip(f"no private mount namespace here (unshare --user --map-root-user --mount: {probe.stderr.strip() if probe else 'not installed'})")
    rng = random.Random(SEED)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(4000)]
    texts = {f"d{i}": " ".join(rng.choice(words) for _ in range(600)) + f" Mail person{i}@example.org." for i in range(40)}
    ingest = upstream(texts, shards=2)
    run = tmp_path / "tmpfs-run"
    run.mkdir()
    done = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", sys.executable, "-c", FULL_DISK_SCRIPT, str(ingest), str(run)],
                          capture_output=True, text=True, env=child_env(), cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    line = result["line"]
    assert line and "\n" not in line and "stage pii failed" in line and "No space left on device" in line and "free disk space" in line
    assert str(run) in line  # the file it could not write
    assert result["left"] == []  # no 05_pii, no .partial, no .old
    clean = run_pii_outputs(ingest, tmp_path / "clean")
    assert [tuple(o) for o in result["outputs"]] == clean


def run_pii_outputs(ingest: Path, out: Path) -> list[tuple[str, str]]:
    from tasks.filters.pii import PiiConfig, run_pii

    return [(o.path, o.sha256) for o in run_pii(PiiConfig(), ingest, out, workers=1).outputs]


def descendants(pid: int) -> set[int]:
    """Every process below `pid` now (from /proc), however many sessions deep."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux's")
def test_sigkilled_hymo_run_leaves_no_process_behind(tmp_path: Path) -> None:
    config = write_pipeline_config(tmp_path)
    run = tmp_path / "run"
    env = {**child_env(), "PREFECT_HOME": str(tmp_path / "prefect-home")}
    env.pop("PREFECT_API_URL", None)
    log = open(tmp_path / "hymo.log", "wb")
    hymo = subprocess.Popen([sys.executable, "-m", "flows", "run", "--config", str(config), "--out", str(run),
                             "--api-url", "http://127.0.0.1:9/api"], cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while not (run / "01_ingest").exists() and not (run / ".01_ingest.partial").exists():  # the server is up, a stage runs
            assert hymo.poll() is None and time.monotonic() < deadline, (tmp_path / "hymo.log").read_text(errors="replace")[-3000:]
            time.sleep(0.2)
        below = descendants(hymo.pid)
        assert any("prefect" in Path(f"/proc/{p}/cmdline").read_text(errors="replace") for p in below if alive(p))
        os.kill(hymo.pid, signal.SIGKILL)
        hymo.wait()
        deadline = time.monotonic() + 60
        while [p for p in below if alive(p)] and time.monotonic() < deadline:
            time.sleep(0.5)
        survivors = {p: Path(f"/proc/{p}/cmdline").read_text(errors="replace").replace("\0", " ")[:120] for p in below if alive(p)}
        assert survivors == {}
    finally:
        if hymo.poll() is None:
            hymo.kill()
        log.close()
