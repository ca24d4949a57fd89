"""The full chaos run: every stage SIGKILLed many times at random moments, then compared byte for byte.

    nice -n 10 python bench/chaos.py [--config PIPELINE.toml] [--kills-per-stage 20] [--stages a,b] [--seed 17] [--write]

Default: the bundled sample, 20 kills per stage (each a fresh driver process
whose whole process group is SIGKILLed a random part of that stage's
reference time after the stage starts; a kill that comes after the stage
finished is retried earlier). Afterwards every data/audit/artifact file must
equal a run nobody killed, and every manifest must equal it except timings
(tests/chaos/chaos_harness.py says what that excludes). The fast subset of
this, one kill per stage on a tiny corpus, is tests/chaos/ in CI.
"""
from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "chaos"))

from bench.report import markdown_table, write_section  # noqa: E402
from chaos_harness import chaos_run, differences, run_clean  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="pipeline TOML (default: the bundled sample)")
    parser.add_argument("--kills-per-stage", type=int, default=20)
    parser.add_argument("--stages", help="comma-separated stages to kill (default: all)")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--scratch", help="directory for the runs (default: a temporary one)")
    parser.add_argument("--write", action="store_true", help="write the table into docs/benchmarks.md")
    args = parser.parse_args(argv)

    scratch = Path(args.scratch or tempfile.mkdtemp(prefix="hymo-chaos-"))
    scratch.mkdir(parents=True, exist_ok=True)
    from flows.config import SAMPLE_CONFIG

    config = Path(args.config).resolve() if args.config else SAMPLE_CONFIG
    started = time.monotonic()
    reference_s = run_clean(config, scratch / "reference")
    stages = args.stages.split(",") if args.stages else list(reference_s)
    log = chaos_run(config, scratch / "chaos", reference_s, args.kills_per_stage, random.Random(args.seed), stages=stages)
    problems = differences(scratch / "reference", scratch / "chaos")
    landed = Counter(k.stage for k in log.kills if k.landed)
    sent = Counter(k.stage for k in log.kills)
    rows = [(stage, f"{reference_s[stage]:.1f}", sent[stage], landed[stage]) for stage in stages]
    table = markdown_table(["stage", "reference s", "SIGKILLs sent", "landed mid-stage"], rows)
    verdict = "identical: every data/audit/artifact file byte-equal, manifests equal except timings" if not problems else "DIFFERENT: " + "; ".join(problems)
    print(table)
    print(f"\n{sum(landed.values())} kills landed mid-stage in {log.launches} driver launches, {time.monotonic() - started:.0f} s; {verdict}")
    if args.write:
        note = (f"`bench/chaos.py --kills-per-stage {args.kills_per_stage} --seed {args.seed}` on "
                f"{'the bundled sample' if not args.config else Path(args.config).name}. Machine: {platform.machine()}, "
                f"{os.cpu_count()} cores ({platform.platform()}), load average {os.getloadavg()[0]:.1f} at the end. "
                f"{sum(landed.values())} kills landed mid-stage in {log.launches} driver launches, "
                f"{time.monotonic() - started:.0f} s in all. Result: {verdict}.")
        write_section("Chaos: SIGKILL at random moments, then re-run", table, note)
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
