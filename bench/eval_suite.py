"""How long `hymo eval --suite default --limit 50` takes on the sample checkpoint, per task, on 2 cores.

The checkpoint is the sample recipe (`SAMPLE_TRAIN`, `SAMPLE_MODEL`) trained on a finished sample run,
made once under --work. The eval runs as the command a user types, pinned to CPUs 0-1 (`taskset`),
and the section records wall and CPU seconds, the threads the thread policy chose (eval.json's
"threads": --threads, else HYMO_THREADS, else the usable CPUs), the load average before and after (the
machine is shared; CPU seconds far above wall x threads' useful work mean spin-waiting), and each
task's seconds from eval.json.

    nice -n 10 python bench/eval_suite.py --sample runs/sample --work /tmp/evalbench [--threads N] [--write]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.lab5_cpt import train_base  # noqa: E402  (the sample recipe's base, trained once under --work)
from bench.report import markdown_table, refuse_if_loaded, write_section  # noqa: E402

TITLE = "hymo eval --suite default --limit 50 on the sample checkpoint (bench/eval_suite.py)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sample", type=Path, required=True, help="a finished `hymo run` of the bundled sample, through its shards stage")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument("--cpus", default="0,1", help="taskset CPU list (default 0,1: 2 cores)")
    parser.add_argument("--threads", type=int, help="pass --threads N to hymo eval (default: the thread policy's choice)")
    parser.add_argument("--write", action="store_true", help="replace this section of docs/benchmarks.md")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    checkpoint = train_base(args.sample, args.work)
    out = args.work / "eval"
    shutil.rmtree(out, ignore_errors=True)
    command = ["taskset", "-c", args.cpus, sys.executable, "-m", "flows", "eval", str(checkpoint), "--suite", "default",
               "--limit", str(args.limit), "--corpus", str(args.sample), "--out", str(out)] + (["--threads", str(args.threads)] if args.threads else [])
    load_before = os.getloadavg()
    started = time.perf_counter()
    subprocess.run(command, cwd=REPO, check=True, env={**os.environ, "HYMO_PROGRESS": "0"}, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    load_after = os.getloadavg()
    result = json.loads((out / "eval.json").read_text(encoding="utf-8"))
    rows = [(task, r["items"], f"{r['seconds']:.1f}") for task, r in result["tasks"].items()]
    rows.append(("total (wall, the whole command)", "", f"{wall:.1f}"))
    rows.append(("total (CPU s, user + system)", "", f"{cpu.ru_utime + cpu.ru_stime:.1f}"))
    threads = result["threads"]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    note = (f"Machine: {platform.machine()} {os.cpu_count()}-core CPU, eval pinned to CPUs {args.cpus} "
            f"({threads['threads']} torch threads, chosen by {threads['source']} of {threads['cpus']} usable CPUs); commit {commit}; "
            f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after. "
            f"{wall:.0f} s wall, {cpu.ru_utime + cpu.ru_stime:.0f} CPU s. Checkpoint: the sample recipe on `{args.sample}` "
            f"(step {result['step']}). Target: at most 300 s on 2 cores. Wall time stretches with other jobs' load; CPU s much less.")
    table = markdown_table(["task", "items", "seconds"], rows)
    print(note + "\n\n" + table)
    if args.write:
        if refuse_if_loaded(load_before[0]):
            return 1
        write_section(TITLE, table, note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
