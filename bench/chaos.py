"""The full chaos run: every stage SIGKILLed many times at random moments, then compared byte for byte.

    nice -n 10 python bench/chaos.py [--config PIPELINE.toml] [--kills-per-stage 20] [--stages a,b] [--seed 17] [--write]

Default: the bundled sample, 20 kills per stage (each a driver forked from a
launcher that imported the pipeline once, whose whole process group is
SIGKILLed a random part of that stage's reference time after the stage
starts; a kill that comes after the stage finished is retried earlier). Only
pretraining is shortened: the sample recipe's model and data, but
`--pretrain-steps` steps (default 40) with a checkpoint every quarter of them,
so kills land before, between and after checkpoints and resumes are
exercised several times per kill series; the 200-step recipe takes minutes
per kill on a loaded 2-core machine. Every process computes on `--threads`
threads (OMP_NUM_THREADS, default 1), the reference run too: on two cores
shared with other work, torch's spinning OpenMP threads made a training step
15× slower. Afterwards every data/audit/artifact file must
equal a run nobody killed, and every manifest must equal it except timings
(tests/chaos/chaos_harness.py says what that excludes). The fast subset of
this, one kill per stage on a tiny corpus, is tests/chaos/ in CI.
"""
from __future__ import annotations

import argparse
import json
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


def shortened_pretraining(config: Path, steps: int, out: Path) -> Path:
    """`config` with `steps` pretraining steps, a checkpoint every quarter and an evaluation every half of them."""
    text = config.read_text(encoding="utf-8").replace("[run]\n", f"[run]\nconfig_dir = {json.dumps(str(config.parent))}\n", 1)
    out.write_text(text + f"\n[pretrain.train]\nmax_steps = {steps}\ncheckpoint_interval = {max(1, steps // 4)}\n"
                          f"eval_interval = {max(1, steps // 2)}\n", encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="pipeline TOML (default: the bundled sample)")
    parser.add_argument("--kills-per-stage", type=int, default=20)
    parser.add_argument("--stages", help="comma-separated stages to kill (default: all)")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every run (0: leave it as it is)")
    parser.add_argument("--pretrain-steps", type=int, default=40, help="pretraining steps of the sample recipe (0: the recipe's own)")
    parser.add_argument("--scratch", help="directory for the runs (default: a temporary one)")
    parser.add_argument("--write", action="store_true", help="write the table into docs/benchmarks.md")
    args = parser.parse_args(argv)

    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    scratch = Path(args.scratch or tempfile.mkdtemp(prefix="hymo-chaos-"))
    scratch.mkdir(parents=True, exist_ok=True)
    from flows.config import SAMPLE_CONFIG

    config = Path(args.config).resolve() if args.config else SAMPLE_CONFIG
    if not args.config and args.pretrain_steps:
        config = shortened_pretraining(SAMPLE_CONFIG, args.pretrain_steps, scratch / "chaos-sample.toml")
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
        note = (f"`bench/chaos.py --kills-per-stage {args.kills_per_stage} --seed {args.seed} --pretrain-steps {args.pretrain_steps} --threads {args.threads}` on "
                f"{'the bundled sample' if not args.config else Path(args.config).name}. Machine: {platform.machine()}, "
                f"{os.cpu_count()} cores ({platform.platform()}), load average {os.getloadavg()[0]:.1f} at the end. "
                f"{sum(landed.values())} kills landed mid-stage in {log.launches} driver launches, "
                f"{time.monotonic() - started:.0f} s in all. Result: {verdict}.")
        write_section("Chaos: SIGKILL at random moments, then re-run", table, note)
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
