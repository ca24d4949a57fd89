"""`hymo plan model` and `python -m hymo_core.planner`: the planner's arithmetic for a shape or a named preset;
`hymo plan batch RUN`: batch and LR advice from the noise scale a run measured."""
from __future__ import annotations

import argparse
from pathlib import Path

from hymo_core.models.presets import PRESETS
from hymo_core.planner.batch_advice import (SPREAD_STEPS, advise, format_advice, format_spread, latest_noise_scale,
                                             noise_scale_spread)
from hymo_core.planner.expert_parallel import format_expert_parallel
from hymo_core.planner.muon import format_muon_costs, muon_matrix_shapes
from hymo_core.planner.planner import ModelShape, RunPlan, format_hybrid, format_plan, model_shape

MUON_RANKS = (8, 64)


def add_cli(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `model` (as in `hymo plan model ...`); defaults are Lab 4's case study."""
    shape, run = ModelShape(), RunPlan()
    parser = subparsers.add_parser(
        "model", help="parameters, FLOPs, GPU time and memory for a decoder shape"
    )
    parser.add_argument("--preset", help="a named model shape (hymo_core/models/presets.py, e.g. hymo-750m); "
                        "--seq-len defaults to its max_seq_len")
    parser.add_argument("--layers", type=int, default=shape.n_layers, help=f"decoder layers (default {shape.n_layers})")
    parser.add_argument("--d-model", type=int, default=shape.d_model, help=f"hidden width (default {shape.d_model})")
    parser.add_argument("--heads", type=int, default=shape.n_heads, help=f"attention heads (default {shape.n_heads})")
    parser.add_argument("--kv-heads", type=int, default=shape.n_kv_heads, help=f"key/value heads, GQA (default {shape.n_kv_heads})")
    parser.add_argument("--ffn-dim", type=int, default=shape.ffn_dim, help=f"feed-forward width (default {shape.ffn_dim})")
    parser.add_argument("--vocab", type=int, default=shape.vocab_size, help=f"vocabulary size (default {shape.vocab_size})")
    parser.add_argument("--tied", action="store_true", help="share input and output embeddings")
    parser.add_argument("--tokens", type=float, default=run.tokens, help=f"training tokens (default {run.tokens:g})")
    parser.add_argument("--seq-len", type=int, default=None, help=f"training sequence length (default {run.seq_len})")
    parser.add_argument("--micro-batch", type=int, default=run.micro_batch, help=f"sequences per GPU per forward (default {run.micro_batch})")
    parser.add_argument("--gpus", type=int, default=run.n_gpus, help=f"GPUs: time, state and activations per GPU, the pipeline bubble, "
                        f"the MTBF and so the checkpoint interval all follow it (default {run.n_gpus})")
    parser.add_argument("--pipeline-stages", type=int, default=run.pipeline_stages,
                        help=f"pipeline stages, capped at --gpus, which must divide by it (default {run.pipeline_stages})")
    parser.add_argument("--batch-tokens", type=float, default=run.batch_tokens, help=f"global batch per step in tokens (default {run.batch_tokens:,.0f})")
    parser.add_argument("--sustained-flops", type=float, default=run.sustained_flops, help=f"achieved FLOP/s per GPU (default {run.sustained_flops:g})")
    parser.add_argument("--shard-gpus", type=int, default=run.shard_gpus, help="ZeRO degree (default: the data-parallel degree)")
    parser.add_argument("--checkpoint-write-s", type=float, default=run.checkpoint_write_s,
                        help=f"seconds one checkpoint write stalls training (default {run.checkpoint_write_s:g})")
    parser.add_argument("--gpu-mtbf-hours", type=float, default=run.gpu_mtbf_hours,
                        help=f"one GPU's mean time between job interruptions, GPU-hours (default {run.gpu_mtbf_hours:,.0f}: the Llama 3 "
                             "report's 419 interruptions in 54 days on 16,384 GPUs); the run's MTBF is this / --gpus")
    parser.add_argument("--capacity-gb", type=float, default=run.capacity_gb, help=f"memory per GPU in GB (default {run.capacity_gb:g})")
    parser.add_argument("--muon-ranks", default=",".join(map(str, MUON_RANKS)),
                        help="ranks for the Muon / NorMuon update cost table (Newton-Schulz FLOPs, bytes per rank) and, for an MoE "
                             "preset, the expert-parallel table (state and all-to-all bytes per rank), "
                             "comma-separated; '' for none")
    parser.set_defaults(func=_run_cli)
    return parser


def add_batch_cli(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `batch` (as in `hymo plan batch RUN`)."""
    parser = subparsers.add_parser("batch", help="batch-size and LR advice from a run's gradient noise scale (metrics.jsonl)")
    parser.add_argument("metrics", type=Path, help="a training run's metrics.jsonl, or the directory holding it")
    parser.add_argument("--batch-tokens", type=int, default=None, help="the batch to judge (default: the run's own)")
    parser.add_argument("--peak-lr", type=float, default=None, help="the run's peak LR, to print the moved value")
    parser.add_argument("--last", type=int, default=SPREAD_STEPS,
                        help=f"logged steps the spread (per-step estimates, bootstrap interval) is taken over (default {SPREAD_STEPS})")
    parser.set_defaults(func=_run_batch_cli)
    return parser


def _run_batch_cli(args: argparse.Namespace) -> int:
    try:
        noise = latest_noise_scale(args.metrics)
        advice = advise(noise["b_simple_tokens"], args.batch_tokens or noise["b_big_tokens"])
        spread = noise_scale_spread(args.metrics, args.last)
    except ValueError as error:
        raise SystemExit(f"hymo plan batch: {error}") from None
    print(format_advice(advice, args.peak_lr, noise.get("step")))
    print(format_spread(spread, advice.batch_tokens) if spread is not None
          else "spread: fewer than 3 logged steps carry both gradient norms; the estimate above has no error bar")
    return 0


def _run_cli(args: argparse.Namespace) -> int:
    if args.preset:
        if args.preset not in PRESETS:
            raise SystemExit(f"unknown preset {args.preset!r}; known: {', '.join(sorted(PRESETS))}")
        config = PRESETS[args.preset]
        # The seed's table describes its production shape only.
        print(format_hybrid(model_shape(config), args.seq_len or config.max_seq_len, compare_seed=args.preset == "hymo-750m"))
        _print_muon_costs(args.preset, model_shape(config), args.muon_ranks)
        if config.moe_on:
            tokens = args.micro_batch * (args.seq_len or config.max_seq_len)
            print()
            print(format_expert_parallel(args.preset, model_shape(config), _ranks(args.muon_ranks), tokens))
        print()
        print(f"{args.preset} on {args.gpus} GPUs:")
        print(format_plan(model_shape(config), _run_plan(args, args.seq_len or config.max_seq_len)))
        return 0
    args.seq_len = args.seq_len or RunPlan().seq_len
    shape = ModelShape(
        n_layers=args.layers,
        d_model=args.d_model,
        n_heads=args.heads,
        n_kv_heads=args.kv_heads,
        ffn_dim=args.ffn_dim,
        vocab_size=args.vocab,
        tie_embeddings=args.tied,
    )
    print(format_plan(shape, _run_plan(args, args.seq_len)))
    _print_muon_costs("this shape", shape, args.muon_ranks)
    return 0


def _run_plan(args: argparse.Namespace, seq_len: int) -> RunPlan:
    if args.gpus < 1 or args.pipeline_stages < 1:
        raise SystemExit(f"hymo plan model: --gpus and --pipeline-stages must be >= 1, got {args.gpus} and {args.pipeline_stages}")
    run = RunPlan(tokens=args.tokens, seq_len=seq_len, micro_batch=args.micro_batch, n_gpus=args.gpus,
                  sustained_flops=args.sustained_flops, shard_gpus=args.shard_gpus, capacity_gb=args.capacity_gb,
                  pipeline_stages=args.pipeline_stages, batch_tokens=args.batch_tokens,
                  checkpoint_write_s=args.checkpoint_write_s, gpu_mtbf_hours=args.gpu_mtbf_hours)
    try:
        run.data_parallel
    except ValueError as error:
        raise SystemExit(f"hymo plan model: {error} (--gpus must divide by --pipeline-stages)") from None
    return run


def _ranks(ranks: str) -> list[int]:
    try:
        counts = [int(r) for r in ranks.split(",") if r.strip()]
    except ValueError:
        raise SystemExit(f"--muon-ranks must be comma-separated integers, got {ranks!r}") from None
    if any(r < 1 for r in counts):
        raise SystemExit(f"--muon-ranks must be positive, got {ranks!r}")
    return counts


def _print_muon_costs(label: str, shape: ModelShape, ranks: str) -> None:
    counts = _ranks(ranks)
    if counts:
        print()
        print(format_muon_costs(label, muon_matrix_shapes(shape), counts))


def main(argv: list[str] | None = None) -> int:
    """`python -m hymo_core.planner [model] [--layers ...]`: the sub-command is optional."""
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("model", "batch"):
        argv.insert(0, "model")
    parser = argparse.ArgumentParser(prog="python -m hymo_core.planner")
    subparsers = parser.add_subparsers(dest="command")
    add_cli(subparsers)
    add_batch_cli(subparsers)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
