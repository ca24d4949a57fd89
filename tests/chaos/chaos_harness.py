"""Kill the pipeline at random moments, re-run it, and compare with a run nobody killed.

A driver process (this file run as a script) runs the pipeline's stages, the
same `flows.stages` entries the flow calls, under the run-directory lock, and
prints `start STAGE` / `done STAGE SECONDS`. The chaos loop starts a driver in
its own session, told to SIGKILL its whole process group (driver, shard
workers, extraction children) a random part of the target stage's reference
time after that stage starts. The next driver finds the earlier stages
published, recomputes the killed one, and is killed in its turn.

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


def kill_during(config: Path, run: Path, stage: str, delay_s: float, until: str | None, log: ChaosLog) -> bool:
    """A driver whose process group is SIGKILLed `delay_s` after it starts `stage`; True if the stage was still running."""
    with open(run.parent / f"{run.name}-drivers.log", "ab") as stderr:
        done = subprocess.run(driver_command(config, run, until), stdout=subprocess.PIPE, stderr=stderr, text=True,
                              env={**child_env(), KILL_ENV: f"{stage}:{delay_s}"}, cwd=REPO, start_new_session=True, timeout=DRIVER_TIMEOUT_S)
    log.launches += 1
    if f"start {stage}" not in done.stdout.splitlines():
        raise RuntimeError(f"driver ended ({done.returncode}) before stage {stage} started; see {run.parent / f'{run.name}-drivers.log'}")
    landed = done.returncode == -signal.SIGKILL and f"done {stage}" not in done.stdout
    log.kills.append(KillRecord(stage, delay_s, landed))
    return landed


def chaos_run(config: Path, run: Path, reference_s: dict[str, float], kills_per_stage: int, rng: random.Random,
              until: str | None = None, stages: list[str] | None = None) -> ChaosLog:
    """Kill each stage `kills_per_stage` times at random moments, then let a last driver finish the run."""
    from flows.config import load_config
    from flows.stages import stage_path

    pipeline = load_config(config)
    log = ChaosLog()
    for stage in stages or list(reference_s):
        for _ in range(kills_per_stage):
            window = 0.8 * reference_s[stage]
            for _attempt in range(MAX_ATTEMPTS):
                if kill_during(config, run, stage, rng.uniform(0.0, window), until, log):
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
    drive(*sys.argv[1:])
