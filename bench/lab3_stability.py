"""Lab 3 (seed 001) on HyMo's trainer: at a high learning rate, does the max attention logit explode, and what bounds it?

Each condition is a fresh small model trained by `hymo_core.train.trainer.train`
(MuonAdamW, the real loop) on the same corpus windows. As in the lab,
interventions are added one at a time at the high rate; cross-entropy is
reported without the z-loss term (`model.last_ce`). "|attn logit|" is the
largest |q.k|/sqrt(d) the probe saw on the last update, "peak logit" the
largest over the whole run.

    python bench/lab3_stability.py --corpus runs/sample [--steps 150] [--write]
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hymo_core.train.data import CorpusReader, TokenLoader  # noqa: E402
from hymo_core.models.model import ModelConfig, Transformer  # noqa: E402
from hymo_core.train.optim import build_optimizer  # noqa: E402
from hymo_core.train.config import TrainConfig
from hymo_core.train.trainer import TrainHooks, TrainState, train


@dataclass(frozen=True)
class Condition:
    name: str
    lr: float
    warmup: int = 0
    clip: float = 0.0
    z_loss: float = 0.0
    qk_norm: bool = False
    qk_clip: bool = False


def conditions(high: float, reference: float, warmup: int) -> list[Condition]:
    stable = dict(lr=high, warmup=warmup, clip=1.0, z_loss=1e-4)
    return [
        Condition("reference", reference),
        Condition("high rate", high),
        Condition("+ warmup", high, warmup),
        Condition("+ clipping", high, warmup, 1.0),
        Condition("+ z-loss", **stable),
        Condition("+ QK norm", **stable, qk_norm=True),
        Condition("+ QK-Clip", **stable, qk_clip=True),
    ]


def run(condition: Condition, args: argparse.Namespace, corpus: CorpusReader) -> dict:
    torch.manual_seed(0)
    model_config = ModelConfig(vocab_size=corpus.vocab_size, d_model=args.d_model, n_layers=args.layers, n_heads=args.heads,
                               n_kv_heads=args.heads, ffn_dim=args.ffn, max_seq_len=args.seq_len, qk_norm=condition.qk_norm,
                               z_loss=condition.z_loss)
    model = Transformer(model_config)
    config = TrainConfig(batch_size=args.batch_size, seq_len=args.seq_len, peak_lr=condition.lr, max_steps=args.steps,
                         warmup_steps=condition.warmup, schedule="constant", max_grad_norm=condition.clip, log_interval=1,
                         eval_interval=args.steps, checkpoint_interval=args.steps, qk_clip=condition.qk_clip,
                         qk_clip_threshold=args.tau, weight_decay=0.1)
    optimizer = build_optimizer(model, config.optimizer_config(torch.device("cpu")))
    loader = TokenLoader(corpus, "train", args.seq_len, args.batch_size, seed=0)
    records: list[dict] = []
    started = time.perf_counter()
    try:
        train(model, optimizer, loader, None, config, TrainState(), torch.device("cpu"), TrainHooks(on_log=records.append))
        failure = ""
    except FloatingPointError as exc:
        failure = str(exc)[:60]
    losses = [r["last_loss"] for r in records]
    tail = losses[-20:] or [float("nan")]
    return {
        "name": condition.name, "final": sum(tail) / len(tail), "worst": max(losses[20:] or losses or [float("nan")]),
        "logit": records[-1]["max_attention_logit"] if records else float("nan"),
        "peak_logit": max((r["max_attention_logit"] for r in records), default=float("nan")),
        "grad": max((r["grad_norm_pre_clip"] for r in records), default=float("nan")),
        "clipped": sum(r["qk_clipped_heads"] for r in records), "seconds": time.perf_counter() - started, "failure": failure,
    }


def render(rows: list[dict], args: argparse.Namespace, corpus: CorpusReader) -> str:
    params = sum(p.numel() for p in Transformer(ModelConfig(vocab_size=corpus.vocab_size, d_model=args.d_model, n_layers=args.layers,
                                                            n_heads=args.heads, n_kv_heads=args.heads, ffn_dim=args.ffn,
                                                            max_seq_len=args.seq_len)).parameters())
    lines = [f"{params:,} parameters (d={args.d_model}, {args.layers} layers, {args.heads} heads), {args.steps} steps of "
             f"{args.batch_size} x {args.seq_len} tokens, MuonAdamW, constant LR after warmup, QK-Clip tau = {args.tau:g}.", "",
             "| condition | final CE | worst CE | \\|attn logit\\| (last) | peak logit | max grad norm | heads clipped | s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        note = f" (stopped: {r['failure']})" if r["failure"] else ""
        lines.append(f"| {r['name']}{note} | {r['final']:.3f} | {r['worst']:.3f} | {r['logit']:.1f} | {r['peak_logit']:.1f} | "
                     f"{r['grad']:.2f} | {r['clipped']} | {r['seconds']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True, help="run directory, shards stage directory or corpus.json")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--reference-lr", type=float, default=3e-3)
    parser.add_argument("--high-lr", type=float, default=3e-2)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--tau", type=float, default=100.0)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ffn", type=int, default=352)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", help="comma-separated condition names to run (default: all)")
    parser.add_argument("--write", action="store_true", help="write the table into docs/benchmarks.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    corpus = CorpusReader(args.corpus)
    rows = []
    chosen = conditions(args.high_lr, args.reference_lr, min(args.warmup, args.steps - 1))
    if args.only:
        wanted = [name.strip() for name in args.only.split(",")]
        unknown = sorted(set(wanted) - {c.name for c in chosen})
        if unknown:
            parser.error(f"unknown conditions {unknown}; have {[c.name for c in chosen]}")
        chosen = [c for c in chosen if c.name in wanted]
    for condition in chosen:
        rows.append(run(condition, args, corpus))
        r = rows[-1]
        print(f"{r['name']:12} final {r['final']:.3f} worst {r['worst']:.3f} |logit| {r['logit']:.1f} peak {r['peak_logit']:.1f} "
              f"grad {r['grad']:.2f} clipped {r['clipped']} {r['seconds']:.0f}s {r['failure']}", flush=True)
    table = render(rows, args, corpus)
    print(table)
    if args.write:
        from bench.report import write_section

        write_section("Lab 3: attention-logit stability (bench/lab3_stability.py)", table,
                      "Machine: 2-core x86_64 CPU, shared with other engineers' jobs (load average 6-8 while measuring).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
