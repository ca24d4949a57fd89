"""The command-line arguments of a training run, in a module without torch: `hymo`'s parser is built on every
command (`hymo run` included), and importing torch for it cost seconds of start-up."""
from __future__ import annotations

import argparse


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--corpus", required=True, help="run directory, shards stage directory or corpus.json")
    parser.add_argument("--config", help="training TOML with [train], [model], [parallel] and [[alerts]] tables (default: the sample recipe)")
    parser.add_argument("--out", required=True, help="output directory (checkpoints, metrics.jsonl, loss.png, summary.json)")
    parser.add_argument("--max-steps", type=int, help="stop after this many updates; the LR schedule keeps the recipe's horizon")
    parser.add_argument("--horizon", type=int, help="move the LR schedule's horizon (where decay ends) to this step")
    resume = parser.add_mutually_exclusive_group()
    resume.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in OUT/checkpoints; refused when "
                                                               "there is none (a mistyped --out is not a fresh run)")
    resume.add_argument("--resume-or-start", action="store_true",
                        help="continue from the newest checkpoint when there is one, else start at step 0 (a requeued job's choice)")
    parser.add_argument("--strict-resume", action="store_true",
                        help="refuse a resume across a torch version or device change (default: warn and continue)")
    parser.add_argument("--cloze", help="cloze JSONL scored into summary.json (default: the bundled sample set)")
    parser.add_argument("--threads", type=int, metavar="N",
                        help="intra-op threads per process (default: HYMO_THREADS, else OMP_NUM_THREADS, else the usable CPUs "
                             "divided by the ranks on this machine); logged and recorded in summary.json")
    parser.add_argument("--set", action="append", default=[], metavar="TABLE.KEY=VALUE",
                        help="override one value of the recipe, e.g. --set train.max_steps=50 (a TOML value; repeatable)")
