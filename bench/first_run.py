"""The newcomer's first result: the whole sample run (`hymo run`, no arguments) in a fresh directory, timed.

    python bench/first_run.py [--rounds 1] [--until STAGE] [--config FILE]

Each round runs `python -m flows run` as a user types it, in a new empty directory that is also its
$HYMO_HOME (so it starts its own Prefect server, as a first run does, and finds no cached stage), and
prints the wall time of the whole command, the machine's load average before and after, its usable
cores, and each stage's own seconds from the run's manifests, then the pretrain stage's first and last
training loss. The README's expected time comes from this table, measured on a quiet 2-core machine
(load average below 1.5 before the first round: the run itself keeps both cores busy, so the load after
it is its own; a machine busy before it starts gives a figure that says nothing about a quiet one).
`--until shards` times the data half alone (the README's quick look).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bench.report import QUIET_LOAD  # noqa: E402


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def one_round(scratch: Path, until: str | None, config: str | None) -> dict:
    home = scratch / "home"
    home.mkdir(parents=True)
    env = {**os.environ, "HYMO_HOME": str(home), "PYTHONPATH": str(REPO)}
    env.pop("PREFECT_API_URL", None)  # a first run starts its own server
    command = [sys.executable, "-m", "flows", "run"] + (["--until", until] if until else []) + (["--config", config] if config else [])
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=home, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    load_after = os.getloadavg()[0]
    if done.returncode != 0:
        raise SystemExit(f"`{' '.join(command[1:])}` failed ({done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    run = home / "runs" / "sample"
    stages = {}
    for manifest in sorted(run.glob("*/manifest.json")):
        record = json.loads(manifest.read_text(encoding="utf-8"))
        stages[record["stage"]] = record.get("wall_time_s", 0.0)
    losses = []
    for metrics in run.glob("*_pretrain/metrics.jsonl"):
        records = [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines() if line.strip()]
        losses = [record["loss"] for record in records if "loss" in record]
    return {"wall_s": wall, "load_before": load_before, "load_after": load_after, "stages": stages, "losses": losses}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="runs, each in a fresh directory (the fastest counts)")
    parser.add_argument("--until", help="stop after this stage (e.g. shards: the data half)")
    parser.add_argument("--config", help="pipeline TOML (default: the bundled sample config)")
    args = parser.parse_args()
    results = []
    for round_no in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="hymo-first-run-") as scratch:
            results.append(one_round(Path(scratch), args.until, args.config))
        print(f"round {round_no + 1}: {results[-1]['wall_s']:.1f} s wall", file=sys.stderr, flush=True)
    best = min(results, key=lambda r: r["wall_s"])
    quiet = results[0]["load_before"] < QUIET_LOAD  # later rounds start in the load the earlier ones left
    what = f"hymo run{' --until ' + args.until if args.until else ''}{' --config ' + args.config if args.config else ''}"
    print("| measure | value |\n|---|---|")
    print(f"| command | `{what}` in a fresh directory (own Prefect server, nothing cached) |")
    print(f"| whole run, wall (first round: nothing on disk yet) | {results[0]['wall_s']:.1f} s |")
    print(f"| whole run, wall (fastest of {len(results)}) | {best['wall_s']:.1f} s |")
    walls = ", ".join(f"{r['wall_s']:.1f}" for r in results)
    loads = ", ".join(f"{r['load_before']:.2f} / {r['load_after']:.2f}" for r in results)
    print(f"| all rounds, wall | {walls} s |")
    print(f"| load average (1 min) before / after | {loads} |")
    print(f"| usable cores | {usable_cores()} |")
    print(f"| quiet machine (load < {QUIET_LOAD} before the first round) | {'yes' if quiet else 'NO: not a figure for the README'} |")
    for stage, seconds in best["stages"].items():
        print(f"| stage {stage} | {seconds:.1f} s |")
    if best["losses"]:
        print(f"| pretrain loss, first / last logged | {best['losses'][0]:.3f} / {best['losses'][-1]:.3f} ({len(best['losses'])} records) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
