"""The data report page (`hymo report RUN`): its size, what fills it, and how long it takes to build.

    python bench/report_page.py                 # the bundled sample through shards, in a scratch directory
    python bench/report_page.py --run RUN       # the sample and an existing run directory, e.g. the 1M size run's:
                                                #   python bench/scale.py --docs 1000000 --keep-run --no-write
                                                #   python bench/report_page.py --run /tmp/hymo-bench-scale/flow/1000000/run
    python bench/report_page.py --run RUN --no-sample   # that run only
    python bench/report_page.py --write         # also replace the section in docs/benchmarks.md (quiet machine only)
    python bench/report_page.py --write --loaded-ok   # write anyway, the section saying the load it ran at

Build time: gather (reads the run) and render, the fastest of --rounds in this process (the first round pays
the imports and a cold page cache and is reported apart). Size: the page's bytes, and its JSON payload per part.
Also the bytes the quality stage's stats files add to the run (the sample the page's distributions come from).
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
TITLE = "Data report page (bench/report_page.py)"


def sample_run(root: Path) -> Path:
    """The bundled sample through shards (`hymo run --until shards`), with its own local Prefect server."""
    run = root / "sample"
    env = {**os.environ, "PYTHONPATH": str(REPO), "HYMO_HOME": str(root), "HYMO_PROGRESS": "0"}
    done = subprocess.run([sys.executable, "-m", "flows", "run", "--until", "shards", "--out", str(run)], cwd=root, env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"hymo run failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return run


def measure(run: Path, rounds: int) -> dict:
    from flows.data_report import gather
    from flows.data_report_page import render
    from manifests.run_dir import completed_stages

    timings = []
    for _ in range(rounds):
        started = time.perf_counter()
        data = gather(run)
        gathered = time.perf_counter()
        page = render(data)
        timings.append((gathered - started, time.perf_counter() - gathered))
    stages = completed_stages(run)
    documents = next((m.counts.get("in", 0) for _, m in stages if m.files("data") or m.files("audit")), 0)
    stats_bytes = sum((m.directory / f.path).stat().st_size for _, m in stages for f in m.files("stats"))
    parts = {name: len(json.dumps(data[name], ensure_ascii=False, separators=(",", ":")).encode()) for name in ("funnel", "by_source", "by_lang", "rules", "clusters", "search")}
    fastest = min(timings, key=sum)
    shards = next((len(m.files("data")) for _, m in stages if m.files("data") or m.files("audit")), 0)
    return {"documents": documents, "shards": shards, "rules": len(data["rules"]), "searchable": len(data["search"]), "clusters": len(data["clusters"]),
            "page_bytes": len(page.encode("utf-8")), "parts": parts, "stats_bytes": stats_bytes,
            "first_s": sum(timings[0]), "gather_s": fastest[0], "render_s": fastest[1]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", default=[], help="a run directory to measure too (repeatable)")
    parser.add_argument("--no-sample", action="store_true", help="leave out the bundled sample (made in a scratch directory)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write", action="store_true", help="replace this section of docs/benchmarks.md")
    parser.add_argument("--loaded-ok", action="store_true", help="with --write: write on a loaded machine, saying the load")
    args = parser.parse_args()
    from bench.report import markdown_table, refuse_if_loaded, write_section

    load = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory(prefix="hymo-report-page-") as scratch:
        runs = [] if args.no_sample else [(sample_run(Path(scratch)), "bundled sample, `hymo run --until shards`")]
        runs += [(Path(run).resolve(), f"`{Path(run).resolve().parent.name}/{Path(run).name}`") for run in args.run]
        if not runs:
            parser.error("nothing to measure: give --run or leave out --no-sample")
        for run, label in runs:
            rows.append((label, measure(run, args.rounds)))
    kib = lambda n: f"{n / 1024:,.0f}"  # noqa: E731
    table = markdown_table(
        ["run", "documents", "shards", "rules plotted", "searchable documents", "clusters", "page KiB", "rules KiB", "search KiB",
         "build s (gather + render, fastest)", "first build s", "stats files KiB"],
        [(label, f"{result['documents']:,}", f"{result['shards']:,}", result["rules"], f"{result['searchable']:,}", result["clusters"], kib(result["page_bytes"]),
          kib(result["parts"]["rules"]), kib(result["parts"]["search"]), f"{result['gather_s']:.2f} + {result['render_s']:.2f}",
          f"{result['first_s']:.2f}", kib(result["stats_bytes"])) for label, result in rows])
    print(table)
    note = ("Build time is `hymo report`'s work without the interpreter start. " +
            ("A run directory other than the sample is bench/scale.py's synthetic corpus (`--keep-run`, the documentation profile) "
             "through shards (bench/scale.py's WORK/flow/N/run). " if args.run else
             "The 1M-document size run's page is not in this table: `python bench/report_page.py --run RUN` on bench/scale.py's run "
             "directory (`--keep-run`) measures it."))
    if args.write:
        if load >= 1.5 and args.loaded_ok:
            write_section(TITLE, table, f"1-minute load {load:.1f} at start: measured at load {load:.1f}, not quiet (the times include waiting for "
                                        f"the CPU). {note}")
        elif not refuse_if_loaded(load):
            write_section(TITLE, table, f"1-minute load {load:.1f} at start. {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
