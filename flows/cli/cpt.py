"""`hymo cpt` (continued pretraining behind a gate fixed in advance) and `hymo retokenize` (a domain corpus in the base's ids)."""
from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from hymo_core.exit_codes import VERDICT_FAILED

console = Console()


def gate_from_args(args: argparse.Namespace):
    """--gate FILE, else the criteria the flags give (Lab 5's gate by default)."""
    from hymo_core.cpt.gate import Criterion

    if args.gate:
        return args.gate
    criteria = [Criterion("domain_loss_reduction", ">=", args.domain_reduction), Criterion("general_loss_rise", "<=", args.general_rise)]
    if args.task:
        criteria.append(Criterion("task_accuracy_drop", "<=", args.task_drop, rule=args.task_rule, task=args.task, paired_items=args.paired_items))
    return criteria


def cmd_cpt_verify(args: argparse.Namespace) -> int:
    """`hymo cpt verify RUN`: exit 0 when every check holds, 4 otherwise (also when RUN is missing or damaged:
    a verifier answers verified or not); the verdict printed is recomputed."""
    from hymo_core.cpt.run import verdict_lines
    from hymo_core.cpt.verify import verify_run
    from hymo_core.train.run import default_device

    from flows.cpt_flow import artifact_records

    report = verify_run(args.run, args.ledger, default_device(), artifact_records, {"domain": args.domain, "general": args.general})
    for row in report["checks"]:
        console.print(f"{'ok  ' if row['ok'] else 'FAIL'} {row['check']}: {row['detail']}", markup=False)
    if report["verdict"] is None:
        console.print("recomputed verdict: none (the run could not be re-measured); NOT VERIFIED", markup=False)
        return VERDICT_FAILED
    for line in verdict_lines({"verdict": report["verdict"], "gate": {"sha256": "recomputed"}})[:-1]:
        console.print(line, markup=False)
    console.print(f"recomputed verdict: {'PASS' if report['verdict']['passed'] else 'FAIL'}; "
                  f"{'verified' if report['verified'] else 'NOT VERIFIED: a check failed, so this verdict is refused'}", markup=False)
    return 0 if report["verified"] else VERDICT_FAILED


def cmd_cpt(args: argparse.Namespace) -> int:
    """`hymo cpt run BASE --domain D --general G --out OUT`: exit 0 on pass, 4 on fail (hymo_core.exit_codes)."""
    from hymo_core.cpt.run import CptConfig, run_cpt, verdict_lines
    from hymo_core.train.run import default_device

    config = CptConfig(replay_ratio=args.replay, peak_lr=args.peak_lr, steps=args.steps, warmup_steps=args.warmup, min_lr_ratio=args.min_lr_ratio,
                       eval_interval=args.eval_interval, eval_batches=args.eval_batches, sampler_seed=args.sampler_seed, seed=args.seed)
    summary = run_cpt(args.base, args.domain, args.general, args.out, config, gate_from_args(args), default_device(),
                      log=lambda line: console.print(line, markup=False), ledger=args.ledger)
    for line in verdict_lines(summary):
        console.print(line, markup=False)
    console.print(f"wrote {args.out}/summary.json (lineage: base {summary['lineage']['base_checkpoint_sha256'][:12]}… -> "
                  f"{summary['lineage']['cpt_checkpoint']} -> {summary['lineage']['verdict']})", markup=False)
    return 0 if summary["verdict"]["passed"] else VERDICT_FAILED


def cmd_retokenize(args: argparse.Namespace) -> int:
    from tasks.corpus.retokenize import retokenize

    manifest = retokenize(args.run, args.tokenizer_from, args.out)
    console.print(f"wrote {args.out}/02_shards ({manifest.counts})", markup=False)
    return 0


def add_commands(sub: Any) -> None:
    from hymo_core.cpt.config import CptConfig

    defaults = CptConfig()
    cpt_group = sub.add_parser("cpt", help="continued pretraining behind a gate fixed before training: `cpt run` trains and judges, "
                                           "`cpt verify` recomputes a run's verdict",
                               description="Continued pretraining on a domain corpus with general replay, judged by a gate written before training.")
    cpt_commands = cpt_group.add_subparsers(dest="cpt_command", required=True, metavar="{run,verify}")
    cpt = cpt_commands.add_parser("run", help="continue BASE on a domain corpus with general replay; the verdict comes from the gate "
                                              "(exit 0 pass, 4 fail)")
    cpt.add_argument("base", help="base checkpoint (.pt file or DCP directory)")
    cpt.add_argument("--domain", required=True, help="domain corpus: run directory, shards directory or corpus.json (the base's tokenizer)")
    cpt.add_argument("--general", required=True, help="general corpus replayed (usually the base's own)")
    cpt.add_argument("--out", required=True, help="new directory: gate.toml, cpt_manifest.json, metrics.jsonl, checkpoints/, summary.json")
    cpt.add_argument("--ledger", help="where the gate's and measurements' hashes are recorded, outside OUT (default: OUT/../cpt_ledger.jsonl)")
    cpt.add_argument("--replay", type=float, default=defaults.replay_ratio, help="probability that a sequence is general text")
    cpt.add_argument("--peak-lr", type=float, default=defaults.peak_lr, help="learning rate after warmup")
    cpt.add_argument("--steps", type=int, default=defaults.steps, help="optimizer updates")
    cpt.add_argument("--warmup", type=int, default=defaults.warmup_steps, help="linear warmup updates")
    cpt.add_argument("--min-lr-ratio", type=float, default=defaults.min_lr_ratio, help="cosine floor as a fraction of the peak")
    cpt.add_argument("--eval-interval", type=int, default=defaults.eval_interval, help="updates between held-out evaluations")
    cpt.add_argument("--eval-batches", type=int, default=defaults.eval_batches, help="fixed held-out batches per corpus")
    cpt.add_argument("--sampler-seed", type=int, default=defaults.sampler_seed, help="seed of the replay coin (per step)")
    cpt.add_argument("--seed", type=int, default=defaults.seed, help="seed of training (initial RNG state)")
    cpt.add_argument("--gate", help="gate.toml to copy into OUT (default: built from the flags below)")
    cpt.add_argument("--domain-reduction", type=float, default=1.00, help="gate: domain loss must fall by at least this (nats/token)")
    cpt.add_argument("--general-rise", type=float, default=0.20, help="gate: general loss may rise by at most this (nats/token)")
    cpt.add_argument("--task", help="gate: also bound the accuracy drop on this multiple-choice task (e.g. hellaswag)")
    cpt.add_argument("--task-drop", type=float, default=0.01, help="gate: largest accuracy drop (fraction; 0.01 = one point)")
    cpt.add_argument("--paired-items", type=int, default=500, help="gate: items of --task scored before and after")
    cpt.add_argument("--task-rule", choices=["point", "ci95"], default="ci95", help="gate: judge the drop by its point estimate or its 95 %% interval")
    cpt.set_defaults(func=cmd_cpt)

    verify = cpt_commands.add_parser("verify", help="recompute a CPT run's verdict from its checkpoints and gate, trusting no number in "
                                                   "RUN (exit 0 verified, 4 otherwise)")
    verify.add_argument("run", help="the CPT run directory (`hymo cpt run --out`)")
    verify.add_argument("--ledger", help="the ledger the run recorded into (default: RUN/../cpt_ledger.jsonl)")
    verify.add_argument("--domain", help="where the domain corpus is now, if not where the run recorded it (accepted only with "
                                         "the recorded digest)")
    verify.add_argument("--general", help="likewise for the general corpus")
    verify.set_defaults(func=cmd_cpt_verify)

    retok = sub.add_parser("retokenize", help="mixture + shards of a run's split with another run's tokenizer (a CPT domain corpus)")
    retok.add_argument("run", help="run directory with a completed split stage (e.g. hymo run --config DOMAIN --until split)")
    retok.add_argument("--tokenizer-from", required=True, help="run directory whose tokenizer stage the base model was trained with")
    retok.add_argument("--out", required=True, help="new run directory for the retokenized corpus (OUT/02_shards)")
    retok.set_defaults(func=cmd_retokenize)
