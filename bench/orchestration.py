"""Orchestration overhead: the sample pipeline under Prefect vs the same stage functions in a plain loop.

Both start from empty run directories and compute every stage, in interleaved
rounds (plain, flow, plain, flow, ...), each with fresh worker processes; the
fastest round of each counts. The Prefect side is measured with a server
already running (what `hymo serve` users have) and, separately, the server's
start-up. Writes a table under "## Orchestration overhead" in docs/benchmarks.md.

Heavy imports stay inside main(): worker processes are spawned and re-import
this file as their __main__, as they re-import the light `hymo` entry point
in a real run.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def plain_loop(config, run: Path) -> float:
    from flows.stages import STAGES, previous_stage_path, stage_path
    from tasks.stage_runner import shutdown_worker_pools

    shutdown_worker_pools()  # fresh workers, as a new `hymo run` process has
    started = time.perf_counter()
    for entry in STAGES:
        entry.run(config, run, previous_stage_path(run, entry.name), stage_path(run, entry.name))
    elapsed = time.perf_counter() - started
    shutdown_worker_pools()
    return elapsed


def main() -> None:
    from flows.prefect_env import apply_prefect_defaults

    apply_prefect_defaults()
    from bench.report import markdown_table, write_section
    from flows.config import load_config
    from flows.server import LocalServer, free_port, prefect_api

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default=str(REPO / "bench" / "orchestration.toml"),
                        help="pipeline TOML (default: the bundled sample with pretraining cut to 20 steps)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    config = load_config(args.config)
    load_at_start = os.getloadavg()[0]
    plain_runs, flow_runs = [], []
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        started = time.perf_counter()
        server = LocalServer(home=scratch / "prefect", port=free_port()).start()
        server_s = time.perf_counter() - started
        try:
            with prefect_api(server.api_url):
                from flows.pipeline import hymo_pipeline

                for round_no in range(args.rounds):
                    plain_runs.append(plain_loop(config, scratch / f"plain-{round_no}"))
                    started = time.perf_counter()
                    hymo_pipeline(config=config, out=str(scratch / f"prefect-run-{round_no}"))
                    flow_runs.append(time.perf_counter() - started)
        finally:
            server.stop()
    plain_s, flow_s = min(plain_runs), min(flow_runs)
    rounds = lambda runs: ", ".join(f"{r:.1f}" for r in runs)  # noqa: E731
    rows = [
        ("same stage functions, plain loop", f"{plain_s:.1f}", rounds(plain_runs), "1.00×", "–"),
        ("`hymo-pipeline` flow (server already up)", f"{flow_s:.1f}", rounds(flow_runs), f"{flow_s / plain_s:.2f}×", f"{100 * (flow_s - plain_s) / plain_s:+.1f} %"),
        ("starting a local Prefect server (once per `hymo serve`)", f"{server_s:.1f}", "", "–", "–"),
    ]
    table = markdown_table(["run", "seconds (fastest)", "every round", "vs loop", "overhead"], rows)
    print(table)
    if not args.no_write:
        note = (f"Every stage of the bundled sample computed from scratch (`{Path(args.config).relative_to(REPO) if Path(args.config).is_relative_to(REPO) else args.config}`), {os.cpu_count()} cores, "
                f"1-min load average {load_at_start:.1f} at start; {args.rounds} interleaved rounds, fresh worker processes in each. "
                "The flow adds task runs, artifacts (counts, removal samples, funnel PNG) and process-pool task workers.")
        write_section("Orchestration overhead (bench/orchestration.py)", table, note)


if __name__ == "__main__":
    main()
