"""`hymo extend CKPT --seq-len N`: continue a checkpoint at a longer window (hymo_core/context/extend.py)."""
from __future__ import annotations

import argparse
from typing import Any


def print_extension(result: dict[str, Any]) -> None:
    """Needle accuracy by position before / position only / after, and the loss changes."""
    measured = result["measurements"]
    stages = ("before", "position_only", "after")
    print(f"window {result['old_window']} -> {result['new_window']} ({result['position']}); "
          f"{result['data']['long_documents']} long documents, {result['data']['tokens_trained']:,} tokens trained")
    print(f"{'needle at':>9} {'distance':>8} " + " ".join(f"{s:>13}" for s in stages) + "   (accuracy, log-prob gain over control)")
    for i, row in enumerate(measured["before"]["needle"]["by_position"]):
        print(f"{row['position']:>9} {row['distance']:>8} " + " ".join(f"{measured[s]['needle']['by_position'][i]['accuracy']:>5.2f} {measured[s]['needle']['by_position'][i]['gain']:>+7.2f}"
                                                                for s in stages))
    print(f"{'control':>18} " + " ".join(f"{measured[s]['needle']['control']:>13.3f}" for s in stages))
    print(f"{'long loss':>18} " + " ".join(f"{measured[s]['long_loss']['loss']:>13.4f}" for s in stages))
    print(f"{'short loss':>18} " + " ".join(f"{measured[s]['short_loss']:>13.4f}" for s in stages)
          + f"   (change {result['short_loss_change']:+.4f})")


def cmd_extend(args: argparse.Namespace) -> int:
    from hymo_core.context.extend import EXTEND_FILE, run_extend
    from hymo_core.train.run import default_device

    result = run_extend(args.checkpoint, args.corpus, args.out, args.seq_len, position=args.position, steps=args.steps,
                        peak_lr=args.lr, batch_size=args.batch_size, seed=args.seed, trials=args.trials, device=default_device())
    print_extension(result)
    print(f"wrote {args.out}/{EXTEND_FILE}, metrics.jsonl and {result['checkpoint']}")
    return 0


def add_commands(sub: Any) -> None:
    extend = sub.add_parser("extend", help="continue a checkpoint at a longer context: RoPE change, long documents, needle + short-context re-test")
    extend.add_argument("checkpoint", help="the base checkpoint (file or DCP directory)")
    extend.add_argument("--seq-len", type=int, required=True, help="the new window (longer than the checkpoint's)")
    extend.add_argument("--corpus", required=True, help="run directory, shards stage directory or corpus.json (the same tokenizer)")
    extend.add_argument("--out", required=True, help="directory for checkpoints/, metrics.jsonl and extend.json")
    extend.add_argument("--position", choices=["base", "interpolation"], default="base",
                        help="RoPE base change (NTK-aware) or position interpolation (default: base)")
    extend.add_argument("--steps", type=int, default=100, help="optimizer updates at the new length (default 100)")
    extend.add_argument("--lr", type=float, help="peak LR (default: a third of the base recipe's)")
    extend.add_argument("--batch-size", type=int, help="windows per update (default: the base's tokens per update)")
    extend.add_argument("--seed", type=int, default=0, help="training and needle seed (default 0)")
    extend.add_argument("--trials", type=int, default=32, help="needle trials per position")
    extend.set_defaults(func=cmd_extend)
