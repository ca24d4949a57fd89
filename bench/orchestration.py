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
# Not bench/ itself (the script's directory): its distributed.py would shadow the `distributed` package in the
# spawned workers, and Prefect's prefect_dask collection would fail to load there as it never does under `hymo run`.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]


def plain_loop(config, run: Path) -> float:
    from flows.stages import pipeline_stages, previous_stage_path, stage_path
    from tasks.runner.stage_runner import shutdown_worker_pools

    shutdown_worker_pools()  # fresh workers, as a new `hymo run` process has
    started = time.perf_counter()
    for entry in pipeline_stages(config):
        entry.run(config, run, previous_stage_path(run, entry.name, config), stage_path(run, entry.name, config))
    elapsed = time.perf_counter() - started
    shutdown_worker_pools()
    return elapsed


CONFIGS = {  # label -> pipeline TOML (None: the bundled sample as `hymo run` runs it)
    "`hymo run` on the sample (24 pretraining steps: manifests/configs/sample.toml)": None,
    "sample, pretraining cut to 20 steps (fixed costs exposed)": REPO / "bench" / "orchestration.toml",
}


def measure(config, rounds: int, scratch: Path) -> tuple[list[float], list[float]]:
    """Interleaved rounds of the plain loop and the flow (server already up), fresh workers each time."""
    from flows.pipeline import hymo_pipeline

    plain_runs, flow_runs = [], []
    for round_no in range(rounds):
        plain_runs.append(plain_loop(config, scratch / f"plain-{round_no}"))
        started = time.perf_counter()
        hymo_pipeline(config=config, out=str(scratch / f"prefect-run-{round_no}"))
        flow_runs.append(time.perf_counter() - started)
    return plain_runs, flow_runs


def main() -> None:
    from flows.prefect_env import apply_prefect_defaults

    apply_prefect_defaults()
    from bench.report import markdown_table, write_section
    from flows.config import load_config
    from flows.server import LocalServer, free_port, prefect_api

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", help="one pipeline TOML instead of the two standard configurations")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    configs = {f"`{args.config}`": Path(args.config)} if args.config else CONFIGS
    load_at_start = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        server = LocalServer(home=scratch / "prefect", port=free_port()).start()
        server_s = server.startup_s
        try:
            with prefect_api(server.api_url):
                for n, (label, path) in enumerate(configs.items()):
                    plain_runs, flow_runs = measure(load_config(str(path) if path else None), args.rounds, scratch / f"config-{n}")
                    plain_s, flow_s = min(plain_runs), min(flow_runs)
                    every = lambda runs: ", ".join(f"{r:.1f}" for r in runs)  # noqa: E731
                    rows.append((label, f"{plain_s:.1f}", f"{flow_s:.1f}", f"plain {every(plain_runs)}; flow {every(flow_runs)}",
                                 f"{flow_s - plain_s:+.1f} s", f"{100 * (flow_s - plain_s) / plain_s:+.1f} %"))
        finally:
            server.stop()
    rows.append(("starting a local Prefect server (once per `hymo serve`)", "", f"{server_s:.1f}", "", "", ""))
    table = markdown_table(["run", "plain loop s (fastest)", "flow s (fastest)", "every round", "flow - loop", "overhead"], rows)
    print(table)
    if not args.no_write:
        note = (f"Every stage computed from scratch, {os.cpu_count()} cores, 1-min load average {load_at_start:.1f} at start; "
                f"{args.rounds} interleaved rounds (plain, flow, ...) with fresh worker processes in each, fastest counts; "
                "the flow runs against a server that is already up. The flow adds task runs (plan, one shard batch per worker, "
                "publish per document stage), artifacts (on a background thread), process-pool task workers and the run summary.")
        write_section("Orchestration overhead (bench/orchestration.py)", table, note)


if __name__ == "__main__":
    main()
