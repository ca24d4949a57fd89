"""Kill the pipeline at random moments, re-run it, and compare with a run nobody killed.

A driver process (this file run as a script) runs the pipeline's stages, the
same `flows.stages` entries the flow calls, under the run-directory lock, and
prints `start STAGE` / `done STAGE SECONDS`. The chaos loop starts a driver in
its own session, told to SIGKILL its whole process group (driver, shard
workers, extraction children) a random part of the target stage's reference
time after that stage starts. The next driver finds the earlier stages
published, recomputes the killed one, and is killed in its turn.

Killed drivers are forked from one launcher process that has imported the
pipeline (Prefect, pyarrow, torch) once: a fresh interpreter per kill spent
most of each kill importing. A forked driver starts its own session, reseeds
the global generators and holds no thread of the launcher's, so what it runs
is what a fresh `hymo` process runs. The reference run and the run that
finishes afterwards are fresh interpreters (a different hash seed too).

Equality afterwards: every published file byte-identical, every manifest equal
except its timing. Pretraining writes wall-clock throughput into its metrics,
summary and loss picture, and says whether it resumed; there its checkpoints
and final weights must be identical instead.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).resolve()
TIMING_FILES = {"pretrain": {"summary.json", "metrics.jsonl", "loss.png"}}  # wall-clock inside, by design
TIMING_EXTRA = {"pretrain": {"resumed_from"}}
LEFTOVERS = (".partial", ".old")
KILL_ENV = "HYMO_CHAOS_KILL"  # "STAGE:SECONDS": the driver kills its own process group that long after STAGE starts
DRIVER_TIMEOUT_S = 1800
TIMING_KEY = re.compile(r"(_s|seconds|wall_time)$")
MAX_ATTEMPTS = 4


def driver_command(config: Path, run: Path, until: str | None = None) -> list[str]:
    return [sys.executable, str(DRIVER), str(config), str(run)] + ([until] if until else [])


def drive(config_path: str, run: str, until: str | None = None) -> None:
    """The driver: every stage in order (published ones are no-ops), with progress markers on stdout."""
    from flows.config import RUN_CONFIG, load_config
    from flows.stages import previous_stage_path, stage_path, stages_between
    from manifests.atomic import atomic_write_text
    from manifests.run_lock import run_lock

    config = load_config(config_path)
    run_dir = Path(run)
    target, _, delay = os.environ.get(KILL_ENV, "").partition(":")
    with run_lock(run_dir, wait_s=120):
        # What `hymo run` records first: stages that find their inputs by name read the run's own stage list from it.
        atomic_write_text(run_dir / RUN_CONFIG, json.dumps({"config": config.model_dump(mode="json"), "runner": "process"}, indent=2) + "\n")
        for entry in stages_between(None, until, config):
            print(f"start {entry.name}", flush=True)
            if entry.name == target:
                arm_kill(float(delay))
            started = time.monotonic()
            entry.run(config, run_dir, previous_stage_path(run_dir, entry.name, config), stage_path(run_dir, entry.name, config))
            print(f"done {entry.name} {time.monotonic() - started:.3f}", flush=True)


def arm_kill(delay_s: float) -> None:
    """SIGKILL this driver's whole process group `delay_s` from now, from a timer thread of its own.

    From inside, not from the test process: a signal sent by a parent that must
    first read a pipe and be scheduled arrives tens of milliseconds late on a
    busy machine, after a sub-second stage has already finished.
    """
    timer = threading.Timer(delay_s, os.killpg, (os.getpgid(0), signal.SIGKILL))
    timer.daemon = True
    timer.start()


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "HYMO_PROGRESS": "0"}


def run_clean(config: Path, run: Path, until: str | None = None) -> dict[str, float]:
    """An uninterrupted run; returns each stage's seconds (what the kill moments are drawn within)."""
    done = subprocess.run(driver_command(config, run, until), capture_output=True, text=True, env=child_env(), cwd=REPO)
    if done.returncode != 0:
        raise RuntimeError(f"clean run failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return {line.split()[1]: float(line.split()[2]) for line in done.stdout.splitlines() if line.startswith("done ")}


@dataclass
class KillRecord:
    stage: str
    after_s: float  # seconds after the stage started
    landed: bool  # the stage had not finished when the signal was sent


@dataclass
class ChaosLog:
    kills: list[KillRecord] = field(default_factory=list)
    launches: int = 0


class Launcher:
    """A process that has imported the pipeline once and forks one driver per kill (see the module docstring).

    Requests and answers are JSON lines over its stdin/stdout; a driver's own stdout goes to a file the
    launcher hands back, its stderr to the drivers' log.
    """

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, str(DRIVER), "--launcher"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, env=child_env(), cwd=REPO)
        ready = self.process.stdout.readline()
        if ready.strip() != "ready":
            raise RuntimeError(f"chaos launcher did not start ({self.process.wait()}): {ready!r}")

    def drive(self, argv: list[str], env: dict[str, str], stderr: Path) -> tuple[int, str]:
        """(exit status as subprocess reports it: -9 for SIGKILL, the driver's stdout)."""
        self.process.stdin.write(json.dumps({"argv": argv, "env": env, "stderr": str(stderr)}) + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        if not answer:
            raise RuntimeError(f"chaos launcher ended ({self.process.wait()})")
        done = json.loads(answer)
        return done["returncode"], done["stdout"]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)

    def __enter__(self) -> "Launcher":
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.close()
        else:
            self.process.kill()
            self.process.wait()


def serve_launches() -> None:
    """The launcher: import what a driver imports, then fork a driver for each request on stdin."""
    import numpy  # noqa: F401
    import torch  # noqa: F401

    import flows.config  # noqa: F401
    import flows.stages  # noqa: F401
    import manifests.run_lock  # noqa: F401
    import tasks.pretrain  # noqa: F401

    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        with tempfile.TemporaryFile() as out:
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                run_forked_driver(request, out.fileno())
            status = wait_or_kill(pid, DRIVER_TIMEOUT_S)
            out.seek(0)
            answer = {"returncode": os.waitstatus_to_exitcode(status), "stdout": out.read().decode(errors="replace")}
        print(json.dumps(answer), flush=True)


def wait_or_kill(pid: int, timeout_s: float) -> int:
    """The wait status of driver `pid`; a driver still running after `timeout_s` has its process group killed."""
    deadline = time.monotonic() + timeout_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            return os.waitpid(pid, 0)[1]
        time.sleep(0.02)


def run_forked_driver(request: dict, out_fd: int) -> None:
    """In the forked child: own session (its process group is what gets killed), own stdio, fresh generators; never returns."""
    import numpy as np

    code = 1
    try:
        os.setsid()
        for fd, source in ((0, os.open(os.devnull, os.O_RDONLY)), (2, os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))):
            os.dup2(source, fd)
            os.close(source)
        os.dup2(out_fd, 1)
        os.environ.update(request["env"])
        random.seed()
        np.random.seed()
        drive(*request["argv"])
        code = 0
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            import atexit

            atexit._run_exitfuncs()  # what a normal exit runs: e.g. the shard worker pool's shutdown
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def kill_during(config: Path, run: Path, stage: str, delay_s: float, log: ChaosLog, launcher: Launcher) -> bool:
    """A driver that runs up to `stage` and SIGKILLs its process group `delay_s` after starting it; True if the stage was still running."""
    drivers_log = run.parent / f"{run.name}-drivers.log"
    returncode, stdout = launcher.drive([str(config), str(run), stage], {KILL_ENV: f"{stage}:{delay_s}"}, drivers_log)
    log.launches += 1
    if f"start {stage}" not in stdout.splitlines():
        raise RuntimeError(f"driver ended ({returncode}) before stage {stage} started; see {drivers_log}")
    landed = returncode == -signal.SIGKILL and f"done {stage}" not in stdout
    log.kills.append(KillRecord(stage, delay_s, landed))
    return landed


def chaos_run(config: Path, run: Path, reference_s: dict[str, float], kills_per_stage: int, rng: random.Random,
              until: str | None = None, stages: list[str] | None = None) -> ChaosLog:
    """Kill each stage `kills_per_stage` times at random moments, then let a last driver finish the run."""
    from flows.config import load_config
    from flows.stages import stage_path

    pipeline = load_config(config)
    log = ChaosLog()
    with Launcher() as launcher:
        for stage in stages or list(reference_s):
            for _ in range(kills_per_stage):
                window = 0.8 * reference_s[stage]
                for _attempt in range(MAX_ATTEMPTS):
                    if kill_during(config, run, stage, rng.uniform(0.0, window), log, launcher):
                        break
                    # The stage finished first (it ran faster than in the reference): unpublish it and aim earlier.
                    shutil.rmtree(stage_path(run, stage, pipeline), ignore_errors=True)
                    window /= 2
    run_clean(config, run, until)
    log.launches += 1
    return log


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def comparable_manifest(manifest: dict) -> dict:
    """A manifest without what legitimately differs between runs: its timing (and pretraining's timing files)."""
    stage = manifest["stage"]
    skip = TIMING_FILES.get(stage, set())
    out = {k: v for k, v in manifest.items() if k not in ("wall_time_s", "digest")}
    out["outputs"] = [o for o in manifest["outputs"] if o["path"] not in skip]
    out["extra"] = without_timings({k: v for k, v in manifest.get("extra", {}).items() if k not in TIMING_EXTRA.get(stage, set())})
    return out


def without_timings(value):
    """`value` with every dict key that holds a duration (`*_s`, `*seconds`, `wall_time*`) dropped, at any depth."""
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if not TIMING_KEY.search(k)}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def differences(reference: Path, candidate: Path) -> list[str]:
    """What differs between two run directories ([] when the data, audit and manifests match)."""
    problems = []
    stage_dirs = sorted(p.name for p in reference.iterdir() if p.is_dir() and p.name[:2].isdigit())
    if stage_dirs != sorted(p.name for p in candidate.iterdir() if p.is_dir() and p.name[:2].isdigit()):
        problems.append(f"stage directories differ: {stage_dirs}")
    for name in stage_dirs:
        ref_manifest = json.loads((reference / name / "manifest.json").read_text())
        cand_path = candidate / name / "manifest.json"
        if not cand_path.exists():
            problems.append(f"{name}: no manifest")
            continue
        cand_manifest = json.loads(cand_path.read_text())
        if comparable_manifest(ref_manifest) != comparable_manifest(cand_manifest):
            problems.append(f"{name}: manifests differ beyond timing")
        skip = TIMING_FILES.get(ref_manifest["stage"], set())
        for output in ref_manifest["outputs"]:
            if output["path"] in skip:
                continue
            theirs = candidate / name / output["path"]
            if not theirs.is_file() or sha256(theirs) != output["sha256"]:
                problems.append(f"{name}/{output['path']}: bytes differ")
    leftovers = [p.name for p in candidate.iterdir() if p.name.endswith(LEFTOVERS) or p.name == ".pretrain_ckpt"]
    if leftovers:
        problems.append(f"left behind: {leftovers}")
    return problems


if __name__ == "__main__":
    if sys.argv[1:] == ["--launcher"]:
        serve_launches()
    else:
        drive(*sys.argv[1:])
