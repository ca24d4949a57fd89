"""Orchestration overhead: the sample pipeline under Prefect vs the same stage functions in a plain loop.

Both start from empty run directories and compute every stage. The Prefect side is measured with
a server already running (what `hymo serve` users have) and, separately, the server's start-up.
Writes a table under "## Orchestration overhead" in docs/benchmarks.md.
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

from flows.prefect_env import apply_prefect_defaults  # noqa: E402

apply_prefect_defaults()

from flows.config import load_config  # noqa: E402
from flows.server import LocalServer, free_port, prefect_api  # noqa: E402
from flows.stages import STAGES, previous_stage_path, stage_path  # noqa: E402

from bench.report import markdown_table, write_section  # noqa: E402


def plain_loop(config, run: Path) -> float:
    started = time.perf_counter()
    for entry in STAGES:
        entry.run(config, run, previous_stage_path(run, entry.name), stage_path(run, entry.name))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", help="pipeline TOML (default: the bundled sample)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    config = load_config(args.config)
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        plain_s = plain_loop(config, scratch / "plain")
        started = time.perf_counter()
        server = LocalServer(home=scratch / "prefect", port=free_port()).start()
        server_s = time.perf_counter() - started
        try:
            with prefect_api(server.api_url):
                from flows.pipeline import hymo_pipeline

                started = time.perf_counter()
                hymo_pipeline(config=config, out=str(scratch / "prefect-run"))
                flow_s = time.perf_counter() - started
        finally:
            server.stop()
    rows = [
        ("same stage functions, plain loop", f"{plain_s:.1f}", "1.00×", "–"),
        ("`hymo-pipeline` flow (server already up)", f"{flow_s:.1f}", f"{flow_s / plain_s:.2f}×", f"{100 * (flow_s - plain_s) / plain_s:+.1f} %"),
        ("starting a local Prefect server (once per `hymo serve`)", f"{server_s:.1f}", "–", "–"),
    ]
    table = markdown_table(["run", "seconds", "vs loop", "overhead"], rows)
    print(table)
    if not args.no_write:
        note = (f"Every stage of the bundled sample computed from scratch, {os.cpu_count()} cores. The flow adds task runs, "
                "artifacts (counts, removal samples, funnel PNG) and process-pool task workers.")
        write_section("Orchestration overhead (bench/orchestration.py)", table, note)


if __name__ == "__main__":
    main()
