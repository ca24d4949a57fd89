"""`hymo sweep lr`: one proxy run per peak LR on a log grid, the LR-sensitivity curve and the optimum with its interval
(hymo_core/train/lr_sweep.py). No Prefect server needed; runs already finished under --out are reused."""
from __future__ import annotations

import argparse
from typing import Any


def cmd_sweep_lr(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from hymo_core.train.lr_sweep import SWEEP_FILE, SWEEP_PICTURE, log_grid, run_sweep
    from hymo_core.train.run import load_run_config

    train_config, model_config = load_run_config(args.config)
    if args.max_steps:
        train_config = replace(train_config, max_steps=args.max_steps, horizon_steps=0,
                               warmup_steps=min(train_config.warmup_steps, args.max_steps // 2),
                               checkpoint_interval=args.max_steps, eval_interval=args.max_steps)
    lrs = [float(v) for v in args.lrs.split(",")] if args.lrs else log_grid(args.lr_min, args.lr_max, args.points)
    seeds = [int(v) for v in args.seeds.split(",")]
    result = run_sweep(args.corpus, args.out, train_config, model_config, lrs, seeds, log=print)
    for lr, loss, spread in zip(result["lrs"], result["mean_loss"], result["seed_spread"] or [None] * len(result["lrs"])):
        print(f"  lr {lr:.3e}: validation loss {loss:.4f}" + (f" (seed sd {spread:.4f})" if spread is not None else ""))
    low, high = result["interval_lr"]
    if result["bracketed"]:
        below, above = result["interval_open"]
        print(f"optimum lr {result['optimum_lr']:.3e} (95% bootstrap interval {'<= ' if below else ''}{low:.3e} .. "
              f"{high:.3e}{' or above' if above else ''}, over {len(seeds)} seeds x {result['windows']} windows)")
        if below or above:
            print("  the interval reaches the end of the swept range: the optimum may lie "
                  + " or ".join(side for side, flag in (("below it", below), ("above it", above)) if flag) + "; widen --lr-min/--lr-max")
    else:
        print(f"optimum not bracketed by the grid: best grid point {result['optimum_lr']:.3e}; widen --lr-min/--lr-max")
    print(f"wrote {args.out}/{SWEEP_FILE} and {SWEEP_PICTURE}")
    return 0


def add_commands(sub: Any) -> None:
    sweep = sub.add_parser("sweep", help="proxy sweeps: `hymo sweep lr` trains one proxy per peak LR").add_subparsers(
        dest="sweep_command", required=True)
    lr = sweep.add_parser("lr", help="peak-LR sweep on a log grid: LR-sensitivity curve, optimum and its bootstrap interval")
    lr.add_argument("--corpus", required=True, help="run directory, shards stage directory or corpus.json")
    lr.add_argument("--out", required=True, help="sweep directory: one run per lr-*/seed-*, lr_sweep.json, lr_sweep.png")
    lr.add_argument("--config", help="training TOML ([train], [model]); default: the sample recipe")
    lr.add_argument("--lr-min", type=float, default=1e-3, help="smallest peak LR of the grid (default 1e-3)")
    lr.add_argument("--lr-max", type=float, default=3e-2, help="largest peak LR of the grid (default 3e-2)")
    lr.add_argument("--points", type=int, default=7, help="grid points, evenly spaced in log LR")
    lr.add_argument("--lrs", help="explicit comma-separated LRs instead of the grid")
    lr.add_argument("--seeds", default="0,1", help="comma-separated seeds, each LR trained once per seed (default 0,1)")
    lr.add_argument("--max-steps", type=int, help="proxy length (default: the recipe's max_steps)")
    lr.set_defaults(func=cmd_sweep_lr)
