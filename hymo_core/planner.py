"""Back-of-the-envelope planner: parameters, FLOPs, GPU time, memory, bubbles.

Every formula here is the one module 8, Lab 4 (seed 001) prints, so the
numbers it shows (9,550,729,216 parameters; 1.216e23 FLOPs for 2T tokens;
152.8 / 52.5 / 35.8 / 19.1 GB of model state on 8 GPUs; 42.88 GB of
activations) are reproduced exactly and pinned by tests. They are estimates
with their assumptions spelled out, not allocator guarantees: a plan that
passes still has to be measured.

Pure Python on purpose: `hymo plan model` must answer on a laptop without
torch. `hymo_core.model.count_parameters` delegates here, so the count a plan
shows is the count of the model that gets built.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

# Lab 4, step 3: bf16 weights (2 B) + bf16 grads (2 B) + fp32 master weights
# and two Adam moments (12 B). Real systems may keep other dtypes.
WEIGHT_BYTES = 2
GRAD_BYTES = 2
OPTIMIZER_BYTES = 12
ZERO_STAGES = ("DP", 1, 2, 3)


@dataclass(frozen=True)
class ModelShape:
    """Shape of a bias-free RMSNorm/SwiGLU/GQA decoder. Defaults: Lab 4's case study."""

    n_layers: int = 36
    d_model: int = 4096
    n_heads: int = 32
    n_kv_heads: int = 8
    ffn_dim: int = 15360
    vocab_size: int = 152064
    tie_embeddings: bool = False
    qk_norm: bool = False  # adds two head_dim-wide RMSNorm gains per layer

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} not divisible by n_kv_heads {self.n_kv_heads}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


@dataclass(frozen=True)
class ParameterCounts:
    total: int
    blocks: int
    attention: int
    ffn: int
    norms: int  # per-layer norms + the final norm (+ QK-norm gains)
    embeddings: int  # input table + output head (once when tied)
    lookup: int  # parameters only read by table lookup: excluded from matmul FLOPs


def count_parameters(shape: ModelShape) -> ParameterCounts:
    d, kv_width = shape.d_model, shape.n_kv_heads * shape.head_dim
    attention = 2 * d * d + 2 * d * kv_width  # q, o: d x d; k, v: d x kv_width
    ffn = 3 * d * shape.ffn_dim  # gate, up, down
    norms = 2 * d + (2 * shape.head_dim if shape.qk_norm else 0)
    blocks = shape.n_layers * (attention + ffn + norms)
    embeddings = shape.vocab_size * d * (1 if shape.tie_embeddings else 2)
    final_norm = d
    return ParameterCounts(
        total=blocks + embeddings + final_norm,
        blocks=blocks,
        attention=shape.n_layers * attention,
        ffn=shape.n_layers * ffn,
        norms=shape.n_layers * norms + final_norm,
        embeddings=embeddings,
        # When tied, the table is also the head and so does take part in a matmul.
        lookup=0 if shape.tie_embeddings else shape.vocab_size * d,
    )


def training_flops_per_token(shape: ModelShape, seq_len: int) -> int:
    """6 x matmul parameters + 6 L d T for causal-averaged attention (Lab 4, step 2)."""
    counts = count_parameters(shape)
    return 6 * (counts.total - counts.lookup) + 6 * shape.n_layers * shape.d_model * seq_len


def training_flops(shape: ModelShape, tokens: float, seq_len: int) -> tuple[float, float]:
    """(architecture-aware FLOPs, 6 N_total D shortcut) for `tokens` training tokens."""
    detailed = training_flops_per_token(shape, seq_len) * tokens
    shortcut = 6 * count_parameters(shape).total * tokens
    return detailed, shortcut


def gpu_time(flops: float, sustained_flops_per_gpu: float, n_gpus: int) -> tuple[float, float]:
    """(GPU-hours, wall-clock hours) at a sustained per-GPU rate; no downtime."""
    gpu_hours = flops / sustained_flops_per_gpu / 3600
    return gpu_hours, gpu_hours / n_gpus


def model_state_bytes(n_params: int, replicas: int, stage: str | int) -> float:
    """Per-GPU weights + grads + optimizer state under plain DP or ZeRO-1/2/3."""
    if replicas < 1:
        raise ValueError("replicas must be >= 1")
    full = WEIGHT_BYTES + GRAD_BYTES + OPTIMIZER_BYTES
    if stage == "DP":
        return n_params * full
    if stage == 1:  # optimizer state sharded
        return n_params * (WEIGHT_BYTES + GRAD_BYTES + OPTIMIZER_BYTES / replicas)
    if stage == 2:  # + gradients sharded
        return n_params * (WEIGHT_BYTES + (GRAD_BYTES + OPTIMIZER_BYTES) / replicas)
    if stage == 3:  # + weights sharded
        return n_params * full / replicas
    raise ValueError(f"stage must be one of {ZERO_STAGES}, got {stage!r}")


def activation_bytes(
    shape: ModelShape, seq_len: int, micro_batch: int, checkpoint: bool = False, flash: bool = True
) -> float:
    """Saved activations: B T L (12 d + 4 kv_width + 6 d_ff) bytes with fused attention.

    Full checkpointing keeps only each layer's bf16 input (2 B T d per layer)
    plus one layer's worth of recompute workspace. Without a fused kernel the
    bf16 attention probabilities (2 B H T^2 per layer) are stored as well.
    """
    tokens = micro_batch * seq_len
    kv_width = shape.n_kv_heads * shape.head_dim
    layer = tokens * (12 * shape.d_model + 4 * kv_width + 6 * shape.ffn_dim)
    if not flash:
        layer += 2 * micro_batch * shape.n_heads * seq_len * seq_len
    if checkpoint:
        return 2 * tokens * shape.d_model * shape.n_layers + layer
    return shape.n_layers * layer


def logits_bytes(shape: ModelShape, seq_len: int, micro_batch: int) -> float:
    """fp32 logits for the loss: 4 bytes per vocabulary entry per token."""
    return 4 * micro_batch * seq_len * shape.vocab_size


@dataclass(frozen=True)
class MemoryEstimate:
    states: float
    activations: float
    logits: float
    capacity: float

    @property
    def total(self) -> float:
        return self.states + self.activations + self.logits

    @property
    def fits(self) -> bool:
        return self.total < self.capacity


def memory_fit(
    shape: ModelShape,
    replicas: int,
    stage: str | int,
    seq_len: int,
    micro_batch: int,
    checkpoint: bool,
    capacity_bytes: float,
) -> MemoryEstimate:
    """Component sum against a capacity; excludes fragmentation and comm buffers."""
    return MemoryEstimate(
        states=model_state_bytes(count_parameters(shape).total, replicas, stage),
        activations=activation_bytes(shape, seq_len, micro_batch, checkpoint),
        logits=logits_bytes(shape, seq_len, micro_batch),
        capacity=capacity_bytes,
    )


def pipeline_bubble(stages: int, micro_batches: int) -> float:
    """Idle fraction (p - 1) / (m + p - 1) of an ideal balanced pipeline."""
    return (stages - 1) / (micro_batches + stages - 1)


def young_interval(write_seconds: float, mtbf_seconds: float) -> float:
    """Checkpoint interval tau* = sqrt(2 delta M) minimising delta/tau + tau/(2M)."""
    return math.sqrt(2 * write_seconds * mtbf_seconds)


def checkpoint_overhead(write_seconds: float, interval_seconds: float, mtbf_seconds: float) -> float:
    """Fraction of time lost to writing plus expected recompute after a failure."""
    return write_seconds / interval_seconds + interval_seconds / (2 * mtbf_seconds)


@dataclass(frozen=True)
class RunPlan:
    """What a run looks like from the outside. Defaults: Lab 4's 2T-token base run."""

    tokens: float = 2e12
    seq_len: int = 8192
    micro_batch: int = 1
    n_gpus: int = 80
    sustained_flops: float = 4e14  # per GPU, already net of comm and recompute
    shard_gpus: int = 8  # data-parallel degree for the memory table
    capacity_gb: float = 80.0
    pipeline_stages: int = 4
    pipeline_micro_batches: int = 16
    checkpoint_write_s: float = 60.0
    mtbf_hours: float = 3.09


def format_plan(shape: ModelShape, run: RunPlan) -> str:
    """Readable table of everything above for one shape and one run."""
    counts = count_parameters(shape)
    detailed, shortcut = training_flops(shape, run.tokens, run.seq_len)
    gpu_hours, hours = gpu_time(detailed, run.sustained_flops, run.n_gpus)
    gb = 1e9
    rows: list[tuple[str, str]] = [
        ("parameters", f"{counts.total:,}"),
        ("  blocks / attention / ffn", f"{counts.blocks:,} / {counts.attention:,} / {counts.ffn:,}"),
        ("  embeddings / norms", f"{counts.embeddings:,} / {counts.norms:,}"),
        ("training FLOPs/token", f"{training_flops_per_token(shape, run.seq_len):,}"),
        (f"training FLOPs ({run.tokens:.3g} tokens)", f"{detailed:.3e}"),
        ("  6 N D shortcut", f"{shortcut:.3e} ({shortcut / detailed - 1:+.1%})"),
        (
            f"time on {run.n_gpus} GPUs @ {run.sustained_flops:.3g} FLOP/s",
            f"{gpu_hours:,.1f} GPU-hours, {hours:,.2f} hours ({hours / 24:.2f} days)",
        ),
    ]
    states = [
        model_state_bytes(counts.total, run.shard_gpus, stage) / gb for stage in ZERO_STAGES
    ]
    rows.append(
        (
            f"model state/GPU, {run.shard_gpus} GPUs",
            "DP {:.1f}, ZeRO-1 {:.1f}, ZeRO-2 {:.1f}, ZeRO-3 {:.1f} GB".format(*states),
        )
    )
    acts = activation_bytes(shape, run.seq_len, run.micro_batch) / gb
    acts_ckpt = activation_bytes(shape, run.seq_len, run.micro_batch, checkpoint=True) / gb
    logits = logits_bytes(shape, run.seq_len, run.micro_batch) / gb
    rows.append(
        (
            f"activations (T={run.seq_len}, micro-batch {run.micro_batch})",
            f"{acts:.2f} GB, checkpointed {acts_ckpt:.2f} GB; fp32 logits {logits:.2f} GB",
        )
    )
    for checkpoint in (False, True):
        fit = memory_fit(
            shape, run.shard_gpus, 3, run.seq_len, run.micro_batch, checkpoint, run.capacity_gb * gb
        )
        label = "ZeRO-3 total" + (", checkpointed" if checkpoint else "")
        rows.append(
            (label, f"{fit.total / gb:.2f} GB; under {run.capacity_gb:g} GB: {fit.fits}")
        )
    rows.append(
        (
            f"pipeline bubble p={run.pipeline_stages}, m={run.pipeline_micro_batches}",
            f"{pipeline_bubble(run.pipeline_stages, run.pipeline_micro_batches):.1%}",
        )
    )
    mtbf_s = run.mtbf_hours * 3600
    interval = young_interval(run.checkpoint_write_s, mtbf_s)
    overhead = checkpoint_overhead(run.checkpoint_write_s, interval, mtbf_s)
    rows.append(
        (
            f"checkpoint every (write {run.checkpoint_write_s:g} s, MTBF {run.mtbf_hours:g} h)",
            f"{interval / 60:.1f} minutes, overhead {overhead:.1%}",
        )
    )
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


def add_cli(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `model` (as in `hymo plan model ...`); defaults are Lab 4's case study."""
    shape, run = ModelShape(), RunPlan()
    parser = subparsers.add_parser(
        "model", help="parameters, FLOPs, GPU time and memory for a decoder shape"
    )
    parser.add_argument("--layers", type=int, default=shape.n_layers)
    parser.add_argument("--d-model", type=int, default=shape.d_model)
    parser.add_argument("--heads", type=int, default=shape.n_heads)
    parser.add_argument("--kv-heads", type=int, default=shape.n_kv_heads)
    parser.add_argument("--ffn-dim", type=int, default=shape.ffn_dim)
    parser.add_argument("--vocab", type=int, default=shape.vocab_size)
    parser.add_argument("--tied", action="store_true", help="share input and output embeddings")
    parser.add_argument("--tokens", type=float, default=run.tokens)
    parser.add_argument("--seq-len", type=int, default=run.seq_len)
    parser.add_argument("--micro-batch", type=int, default=run.micro_batch)
    parser.add_argument("--gpus", type=int, default=run.n_gpus, help="GPUs for the time estimate")
    parser.add_argument("--sustained-flops", type=float, default=run.sustained_flops)
    parser.add_argument("--shard-gpus", type=int, default=run.shard_gpus, help="ZeRO degree")
    parser.add_argument("--capacity-gb", type=float, default=run.capacity_gb)
    parser.set_defaults(func=_run_cli)
    return parser


def _run_cli(args: argparse.Namespace) -> int:
    shape = ModelShape(
        n_layers=args.layers,
        d_model=args.d_model,
        n_heads=args.heads,
        n_kv_heads=args.kv_heads,
        ffn_dim=args.ffn_dim,
        vocab_size=args.vocab,
        tie_embeddings=args.tied,
    )
    run = RunPlan(
        tokens=args.tokens,
        seq_len=args.seq_len,
        micro_batch=args.micro_batch,
        n_gpus=args.gpus,
        sustained_flops=args.sustained_flops,
        shard_gpus=args.shard_gpus,
        capacity_gb=args.capacity_gb,
    )
    print(format_plan(shape, run))
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m hymo_core.planner [model] [--layers ...]`: the sub-command is optional."""
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "model":
        argv.insert(0, "model")
    parser = argparse.ArgumentParser(prog="python -m hymo_core.planner")
    add_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
