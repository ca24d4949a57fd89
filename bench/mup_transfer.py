"""muP transfer: the optimal peak LR at width w, 2w and 4w, under muP and under the standard parametrisation.

    python bench/mup_transfer.py --corpus runs/sample --out /tmp/mup-transfer [--write]

One `hymo sweep lr` (hymo_core/train/lr_sweep.py) per (parametrisation, width) over one log grid,
each width built by hymo_core.models.mup.widen from the same proxy. Under muP the claim is that the
optimum at 2w and 4w equals the one at w within one grid step. Finished runs under --out are
reused. --write puts the table into docs/benchmarks.md and the plot into docs/mup_transfer.png.
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hymo_core.models.configs import ModelConfig
from hymo_core.models.mup import widen
from hymo_core.train.config import TrainConfig
from hymo_core.train.lr_sweep import log_grid, plot_sweeps, run_sweep

HEADING = "muP transfer: optimal LR across widths (bench/mup_transfer.py)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--width", type=int, default=32, help="the proxy's d_model (w)")
    parser.add_argument("--factors", default="1,2,4")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=16)
    parser.add_argument("--lr-min", type=float, default=1e-3)
    parser.add_argument("--lr-max", type=float, default=1e-1)
    parser.add_argument("--points", type=int, default=7)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--parametrisations", default="mup,standard")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    heads = args.width // args.head_dim
    proxy = ModelConfig(d_model=args.width, n_layers=args.layers, n_heads=heads, n_kv_heads=heads, ffn_dim=2 * args.width,
                        max_seq_len=args.seq_len, parametrisation="mup")
    train = TrainConfig(batch_size=args.batch_size, seq_len=args.seq_len, max_steps=args.steps, warmup_steps=max(1, args.steps // 10),
                        log_interval=max(1, args.steps // 4), eval_interval=args.steps, checkpoint_interval=args.steps,
                        eval_batches=8, keep_checkpoints=1)
    lrs = log_grid(args.lr_min, args.lr_max, args.points)
    step = math.log(lrs[1] / lrs[0])
    seeds = [int(s) for s in args.seeds.split(",")]
    results: dict[str, dict[int, dict]] = {}
    for parametrisation in args.parametrisations.split(","):
        for factor in (int(f) for f in args.factors.split(",")):
            model = widen(proxy, factor)
            if parametrisation == "standard":
                model = replace(model, parametrisation="standard", mup_base_width=0)
            out = Path(args.out) / parametrisation / f"d{model.d_model}"
            print(f"{parametrisation} d_model {model.d_model}: sweep over {len(lrs)} LRs x {len(seeds)} seeds", flush=True)
            results.setdefault(parametrisation, {})[factor] = run_sweep(args.corpus, out, train, model, lrs, seeds,
                                                                       log=lambda line: print("  " + line, flush=True))
    rows = []
    for parametrisation, by_factor in results.items():
        base = by_factor[min(by_factor)]
        for factor, sweep in by_factor.items():
            shift = math.log(sweep["optimum_lr"] / base["optimum_lr"]) / step if sweep["optimum_lr"] and base["optimum_lr"] else math.nan
            low, high = sweep["interval_lr"]
            best = min(sweep["mean_loss"])
            rows.append((parametrisation, f"{factor}w = {args.width * factor}", f"{sweep['optimum_lr']:.2e}",
                         f"{low:.2e} .. {high:.2e}" if low and high else "-", "yes" if sweep["bracketed"] else "no",
                         f"{shift:+.2f}", f"{best:.3f}"))
    from bench.report import markdown_table

    table = markdown_table(["parametrisation", "width", "optimal LR", "95 % bootstrap interval", "bracketed",
                            "shift from w (grid steps)", "best mean val loss"], rows)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    load = os.getloadavg()[0]
    note = (f"Machine: {platform.machine()} CPU, {os.cpu_count()} cores, shared (load average {load:.1f} at the end), commit {commit}; "
            f"not measured on a GPU. Proxy: {args.layers} layers, head dim {args.head_dim}, FFN 2d, widths via `mup.widen`; "
            f"{args.steps} updates of {args.batch_size} x {args.seq_len} tokens on {args.corpus}, cosine schedule, MuonAdamW; "
            f"grid {len(lrs)} LRs {lrs[0]:.0e} .. {lrs[-1]:.0e} (one step = x{math.exp(step):.2f}), seeds {args.seeds}.")
    print(table)
    picture = Path(args.out) / "mup_transfer.png"
    sweeps = {f"{p} d={args.width * f}": s for p, by in results.items() for f, s in by.items()}
    plot_sweeps(sweeps, picture, title="muP transfer: final validation loss vs peak LR")
    if args.write:
        from bench.report import write_section_with_picture

        write_section_with_picture(HEADING, table, note, picture, "muP transfer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
