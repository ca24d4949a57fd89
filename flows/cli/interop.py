"""`hymo export --hf`, `hymo eval --harness lm-eval` and `hymo release`: a checkpoint leaving HyMo."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from flows.console import console


def cmd_export_hf(args: argparse.Namespace) -> int:
    from hymo_core.interop.hf_export import export_hf

    record = export_hf(args.checkpoint, args.hf, args.corpus)
    remote = " (trust_remote_code=True)" if record["trust_remote_code"] else ""
    console.print(f"wrote {args.hf}: {record['architecture']}{remote}, {record['parameters']:,} parameters, step {record['step']}",
                  markup=False)
    return 0


def cmd_eval_harness(args: argparse.Namespace) -> int:
    from hymo_core.interop.harness import LM_EVAL_JSON, run_harness

    if args.harness != "lm-eval":
        raise ValueError(f"unknown harness {args.harness!r}; known: lm-eval")
    tasks = [t.strip() for t in (args.tasks or "hellaswag,arc_easy,arc_challenge").split(",") if t.strip()]
    out = Path(args.out) if args.out else Path(args.checkpoint).resolve().parent / "lm_eval" / Path(args.checkpoint).stem
    report = run_harness(args.checkpoint, tasks, out, corpus=args.corpus, limit=args.limit)
    rows = {**report["results"], **report["groups"]}
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    console.print(f"lm-evaluation-harness ({report['route']} model), {args.checkpoint}", markup=False)
    for task in tasks:
        metrics = rows.get(report["lm_eval_tasks"][task], {})
        shown = ", ".join(f"{name.split(',')[0]} {value:.4f}" + (f" ± {error:.4f}" if isinstance(error := metrics.get(name.replace(',', '_stderr,', 1)), float) else "")
                          for name, value in metrics.items() if isinstance(value, float) and "stderr" not in name)
        console.print(f"  {report['lm_eval_tasks'][task]}: {shown}", markup=False)
    console.print(f"wrote {out / LM_EVAL_JSON} and the task YAMLs in {report['task_dir']} (lm_eval --include_path)", markup=False)
    return 0


def cmd_release(args: argparse.Namespace) -> int:
    from hymo_core.interop.release import make_release

    summary = make_release(args.run, args.out, eval_limit=args.eval_limit, suite=args.suite)
    console.print(f"wrote {args.out}: {summary['files']} files listed in SHA256SUMS; model card README.md, DATA_CARD.md",
                  markup=False)
    return 0


def add_commands(sub: Any) -> None:
    release = sub.add_parser("release", help="bundle a run as a base-model release: HF export, logs, data manifest, "
                                             "decontamination record, eval curve, model and data cards, SHA256SUMS")
    release.add_argument("run", help="the run directory (its pretrain stage's checkpoints are released)")
    release.add_argument("--out", required=True, help="the bundle directory (must not exist or be empty)")
    release.add_argument("--suite", default="mc", help="suite run on every kept checkpoint for the eval curve (default: mc)")
    release.add_argument("--eval-limit", type=int, default=100, help="first N items per task (per MMLU subject) for the curve")
    release.set_defaults(func=cmd_release)
