"""No-op re-run cost: a second `hymo run` over a finished run directory, with cheap cache checks vs full hashing.

Two runs: the bundled sample, every stage (pretraining cut short: a no-op never trains) and a synthetic
JSONL corpus of about --synthetic-gb GB taken through ingest and extract (each stage a full
copy of the corpus). Each is computed once by the flow, then re-run twice per round against
the same, already running Prefect server:

* cheap checks: every stage Cached by Prefect after its stage-contract key and a stat check
  (size, mtime_ns, inode recorded at publish) of its files and of the ingest sources;
* full hashing: the same re-run with the stat records removed, so every source and output
  file is read and hashed again (what each re-run cost before the stat records).

The fastest round counts; server start-up is reported apart. Writes a section of docs/benchmarks.md.
Heavy imports stay inside main(): spawned workers re-import this file as __main__.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
WORDS = ("the river data model token shard corpus window bright quiet garden stone paper light reason simple careful "
         "number little story open road music winter summer learn build test").split()


def synthetic_source(root: Path, target_bytes: int) -> Path:
    """A JSONL corpus of random-word documents (~4 KB each) and its source spec."""
    import numpy as np

    rng = np.random.default_rng(0)
    words = np.array(WORDS)
    data = root / "synthetic"
    data.mkdir(parents=True)
    written, doc = 0, 0
    with open(data / "docs.jsonl", "w", encoding="utf-8") as handle:
        while written < target_bytes:
            block = words[rng.integers(0, len(words), size=(256, 700))]
            lines = "".join(json.dumps({"url": f"https://synthetic.example/{doc + i}", "text": " ".join(row) + "."}) + "\n"
                            for i, row in enumerate(block))
            handle.write(lines)
            written += len(lines)
            doc += len(block)
    spec = root / "synthetic.toml"
    spec.write_text(f'name = "synthetic"\nkind = "jsonl"\npath = "{data}"\norigin = "bench"\nsnapshot = "2026-11-30"\n'
                    'license = "CC0-1.0"\n', encoding="utf-8")
    return spec


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def without_stat_records(run: Path, rerun) -> tuple[float, list[str]]:
    """`rerun()` with every stage's stat record moved away (each check hashes every file), then put back."""
    from manifests.file_stats import STATS_NAME

    records = {path: path.read_bytes() for path in Path(run).glob(f"*/{STATS_NAME}")}
    for path in records:
        path.unlink()
    try:
        return rerun()
    finally:
        for path, payload in records.items():
            path.write_bytes(payload)


def timed_rerun(config, run: Path, until: str | None) -> tuple[float, list[str]]:
    """Seconds of a flow re-run, and the distinct final states of its stage task runs."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.pipeline import hymo_pipeline

    started = time.perf_counter()
    state = hymo_pipeline(config=config, out=str(run), until=until, return_state=True)
    seconds = time.perf_counter() - started
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))
    return seconds, sorted({r.state.name for r in runs})


def measure(label: str, config, run: Path, until: str | None, rounds: int, source_bytes: int) -> tuple:
    from flows.pipeline import hymo_pipeline

    started = time.perf_counter()
    hymo_pipeline(config=config, out=str(run), until=until)
    first_s = time.perf_counter() - started
    cheap, full, states = [], [], set()
    for _ in range(rounds):
        seconds, cheap_states = timed_rerun(config, run, until)
        cheap.append(seconds)
        states.update(cheap_states)
        seconds, _ = without_stat_records(run, lambda: timed_rerun(config, run, until))
        full.append(seconds)
    size_gb = (tree_bytes(run) + source_bytes) / 1e9
    return (label, f"{size_gb:.2f}", f"{first_s:.1f}", f"{min(cheap):.1f}", f"{min(full):.1f}", ", ".join(sorted(states)))


def main() -> None:
    from flows.prefect_env import apply_prefect_defaults

    apply_prefect_defaults()
    from bench.report import markdown_table, write_section
    from flows.config import PipelineConfig, load_config
    from flows.server import LocalServer, free_port, prefect_api
    from flows.stages import pipeline_stages

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--synthetic-gb", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--skip-sample", action="store_true")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    load_at_start = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("HYMO_BENCH_TMP")) as scratch_name:
        scratch = Path(scratch_name)
        server = LocalServer(home=scratch / "prefect", port=free_port()).start()
        server_s = server.startup_s
        try:
            with prefect_api(server.api_url):
                if not args.skip_sample:
                    sample = load_config(None)  # pretraining cut short: a no-op re-run never trains
                    train = replace(sample.pretrain.train, max_steps=4, eval_interval=2, checkpoint_interval=2, warmup_steps=1)
                    sample = sample.model_copy(update={"pretrain": replace(sample.pretrain, train=train)})
                    sample_sources = sum(tree_bytes(s.root) if s.root.is_dir() else s.root.stat().st_size for s in sample.source_specs())
                    rows.append(measure(f"bundled sample, all {len(pipeline_stages(sample))} stages", sample, scratch / "sample", None, args.rounds, sample_sources))
                spec = synthetic_source(scratch / "synthetic-src", int(args.synthetic_gb * 1e9))
                synthetic = PipelineConfig(sources=[str(spec)])
                rows.append(measure(f"synthetic {args.synthetic_gb:g} GB JSONL, ingest + extract", synthetic, scratch / "synthetic", "extract",
                                    args.rounds, tree_bytes(scratch / "synthetic-src")))
        finally:
            server.stop()
    rows.append(("starting a local Prefect server (once per `hymo run` without one)", "", "", f"{server_s:.1f}", "", ""))
    table = markdown_table(["run", "GB read by a full check (sources + outputs)", "first run s", "no-op re-run s, cheap checks (fastest)",
                            "no-op re-run s, full hashing", "stage states in the re-runs"], rows)
    print(table)
    if not args.no_write:
        note = (f"{os.cpu_count()} cores, 1-min load average {load_at_start:.1f} at start; {args.rounds} rounds, fastest counts; the flow "
                "re-runs against a server that is already up. Cheap checks: each stage's Prefect cache key is its stage-contract key, "
                "trusted after a stat comparison (size, mtime_ns, inode recorded at publish) of its outputs and of the ingest sources. "
                "Full hashing: the stat records removed, so each check reads and hashes every file (`hymo manifest show --verify` "
                "always does).")
        write_section("No-op re-run: cheap cache checks (bench/noop_rerun.py)", table, note)


if __name__ == "__main__":
    main()
