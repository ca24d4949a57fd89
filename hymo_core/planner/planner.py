"""Back-of-the-envelope planner: parameters, FLOPs, GPU time, memory, bubbles.

Every formula here is the one module 8, Lab 4 (seed 001) prints, so the
numbers it shows (9,550,729,216 parameters; 1.216e23 FLOPs for 2T tokens;
152.8 / 52.5 / 35.8 / 19.1 GB of model state on 8 GPUs; 42.88 GB of
activations) are reproduced exactly and pinned by tests. They are estimates
with their assumptions spelled out, not allocator guarantees: a plan that
passes still has to be measured.

Pure Python on purpose: `hymo plan model` must answer on a laptop without
torch. `hymo_core.models.model.count_parameters` delegates here, so the count a plan
shows is the count of the model that gets built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hymo_core.models.configs import ModelConfig

# Lab 4, step 3: bf16 weights (2 B) + bf16 grads (2 B) + fp32 master weights
# and two Adam moments (12 B). Real systems may keep other dtypes.
WEIGHT_BYTES = 2
GRAD_BYTES = 2
OPTIMIZER_BYTES = 12
ZERO_STAGES = ("DP", 1, 2, 3)


@dataclass(frozen=True)
class ModelShape:
    """Shape of a bias-free RMSNorm/SwiGLU decoder. Defaults: Lab 4's case study (all GQA layers).

    `layer_pattern` letters (repeated to n_layers): A = GQA attention, G = Gated DeltaNet,
    M = Multi-head Latent Attention; the gdn_* / mla_* widths are the resolved ones
    (model_shape() fills them from a ModelConfig) and only matter when their kind occurs.
    """

    n_layers: int = 36
    d_model: int = 4096
    n_heads: int = 32
    n_kv_heads: int = 8
    ffn_dim: int = 15360
    vocab_size: int = 152064
    tie_embeddings: bool = False
    qk_norm: bool = False  # adds two head_dim-wide RMSNorm gains per layer
    layer_pattern: str = "A"
    moe_on: str = ""
    gdn_heads: int = 0
    gdn_key_head_dim: int = 0
    gdn_value_head_dim: int = 0
    gdn_conv_size: int = 4
    mla_q_rank: int = 0
    mla_kv_rank: int = 0
    mla_nope_dim: int = 0
    mla_rope_dim: int = 0
    mla_v_dim: int = 0
    moe_routed_experts: int = 0  # MoE FFN on the layers of the kinds in moe_on (hymo_core/models/layers/moe.py)
    moe_activated_experts: int = 0
    moe_shared_experts: int = 0
    moe_expert_dim: int = 0
    mtp_depth: int = 0  # multi-token prediction modules (training only): norms, 2d -> d projection, one block
    mtp_moe: bool = False  # MTP blocks with the trunk kind's MoE FFN; otherwise a dense SwiGLU of ffn_dim

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} not divisible by n_kv_heads {self.n_kv_heads}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def layer_kinds(self) -> tuple[str, ...]:
        repeats = -(-self.n_layers // len(self.layer_pattern))
        return tuple((self.layer_pattern * repeats)[: self.n_layers])


def model_shape(config: ModelConfig) -> ModelShape:
    """The planner's view of a model config (the counts below read only these fields)."""
    return ModelShape(
        n_layers=config.n_layers,
        d_model=config.d_model,
        n_heads=config.n_heads,
        n_kv_heads=config.n_kv_heads,
        ffn_dim=config.ffn_dim,
        vocab_size=config.vocab_size,
        tie_embeddings=config.tie_embeddings,
        qk_norm=config.qk_norm,
        layer_pattern=config.layer_pattern,
        moe_on=config.moe_on,
        gdn_heads=config.gdn_heads,
        gdn_key_head_dim=config.gdn_key_head_dim,
        gdn_value_head_dim=config.gdn_value_head_dim,
        gdn_conv_size=config.gdn_conv_size,
        mla_q_rank=config.mla_q_rank,
        mla_kv_rank=config.mla_kv_rank,
        mla_nope_dim=config.mla_nope_dim,
        mla_rope_dim=config.mla_rope_dim,
        mla_v_dim=config.mla_v_dim,
        moe_routed_experts=config.moe_n_routed_experts if config.moe_on else 0,
        moe_activated_experts=config.moe_n_activated_experts if config.moe_on else 0,
        moe_shared_experts=config.moe_n_shared_experts if config.moe_on else 0,
        moe_expert_dim=(config.moe_expert_dim or config.ffn_dim) if config.moe_on else 0,
        mtp_depth=config.mtp_depth,
        mtp_moe=config.mtp_moe,
    )


@dataclass(frozen=True)
class ParameterCounts:
    total: int
    blocks: int
    attention: int  # every token mixer (A, G, M), their internal norms and gates included
    ffn: int
    norms: int  # per-layer norms + the final norm (+ QK-norm gains of kind A)
    embeddings: int  # input table + output head (once when tied)
    lookup: int  # parameters only read by table lookup: excluded from matmul FLOPs
    by_kind: tuple[tuple[str, int], ...] = ()  # (mixer kind, its mixers' parameters summed over layers)
    mtp: int = 0  # multi-token prediction modules (in `total`; trained, dropped for generation)
    active: int = 0  # parameters one token's forward touches: total - MTP - the routed experts it skips
    active_non_embedding: int = 0  # `active` without the embedding table and the output head
    normuon: int = 0  # the NorMuon partition (hymo_core/train/partition.py, kind "matrix"); the rest is AdamW


def gdn_parameters(shape: ModelShape) -> int:
    """q, k, v, g, o projections; a, b (one number per head each); depthwise conv; A_log, dt_bias; o_norm."""
    d, H = shape.d_model, shape.gdn_heads
    key, value = H * shape.gdn_key_head_dim, H * shape.gdn_value_head_dim
    return 2 * d * key + 2 * d * value + value * d + 2 * d * H + (2 * key + value) * shape.gdn_conv_size \
        + 2 * H + shape.gdn_value_head_dim


def mla_parameters(shape: ModelShape) -> int:
    """q_a, q_a_norm, q_b; kv_a_proj_with_mqa, kv_a_norm, kv_b; wo (+ per-head QK-norm gains)."""
    d, H = shape.d_model, shape.n_heads
    qk = shape.mla_nope_dim + shape.mla_rope_dim
    return (d * shape.mla_q_rank + shape.mla_q_rank + shape.mla_q_rank * H * qk
            + d * (shape.mla_kv_rank + shape.mla_rope_dim) + shape.mla_kv_rank
            + shape.mla_kv_rank * H * (shape.mla_nope_dim + shape.mla_v_dim) + H * shape.mla_v_dim * d
            + (2 * qk if shape.qk_norm else 0))


def mixer_parameters(shape: ModelShape, kind: str) -> int:
    if kind == "A":
        kv_width = shape.n_kv_heads * shape.head_dim
        return 2 * shape.d_model * shape.d_model + 2 * shape.d_model * kv_width  # q, o: d x d; k, v: d x kv_width
    if kind == "G":
        return gdn_parameters(shape)
    if kind == "M":
        return mla_parameters(shape)
    raise ValueError(f"unknown mixer kind {kind!r}")


def ffn_parameters(shape: ModelShape, kind: str, active: bool = False) -> int:
    """The FFN of a layer of this mixer kind: dense SwiGLU (gate, up, down), or MoE (router, routed
    experts, shared experts); `active`: only what one token uses (router, k routed, shared)."""
    if kind not in shape.moe_on:
        return 3 * shape.d_model * shape.ffn_dim
    routed = shape.moe_activated_experts if active else shape.moe_routed_experts
    experts = routed + shape.moe_shared_experts
    return shape.moe_routed_experts * shape.d_model + 3 * shape.d_model * shape.moe_expert_dim * experts


def mixer_vectors(shape: ModelShape, kind: str) -> int:
    """A mixer's parameters that are not 2-D matrices (norm gains, GDN scalars and conv taps): AdamW's."""
    if kind == "G":
        return gdn_elementwise(shape)
    if kind == "M":
        return shape.mla_q_rank + shape.mla_kv_rank + (2 * (shape.mla_nope_dim + shape.mla_rope_dim) if shape.qk_norm else 0)
    return 0


def block_parameters(shape: ModelShape, kind: str, active: bool = False) -> int:
    """One block: mixer, FFN, its two norms (+ QK-norm gains of kind A)."""
    qk_norm = 2 * shape.head_dim if shape.qk_norm and kind == "A" else 0
    return mixer_parameters(shape, kind) + ffn_parameters(shape, kind, active) + 2 * shape.d_model + qk_norm


def dense_matrix_parameters(shape: ModelShape, kind: str) -> int:
    """The NorMuon part of one block: mixer matrices and, when not MoE, the dense FFN (GDN's H x d gate projections
    a_proj / b_proj are AdamW's: hymo_core/train/partition.py)."""
    ffn = 0 if kind in shape.moe_on else 3 * shape.d_model * shape.ffn_dim
    gates = 2 * shape.gdn_heads * shape.d_model if kind == "G" else 0
    return mixer_parameters(shape, kind) - mixer_vectors(shape, kind) - gates + ffn


def mtp_block_shape(shape: ModelShape) -> ModelShape:
    """The shape an MTP depth's block is counted with: without MoE unless `mtp_moe`."""
    return shape if shape.mtp_moe else replace(shape, moe_on="")


def count_parameters(shape: ModelShape) -> ParameterCounts:
    d = shape.d_model
    kinds = shape.layer_kinds()
    by_kind = {kind: kinds.count(kind) * mixer_parameters(shape, kind) for kind in dict.fromkeys(kinds)}
    attention = sum(by_kind.values())
    ffn = sum(ffn_parameters(shape, kind) for kind in kinds)
    norms = 2 * d * len(kinds) + (2 * shape.head_dim if shape.qk_norm else 0) * kinds.count("A")
    blocks = attention + ffn + norms
    embeddings = shape.vocab_size * d * (1 if shape.tie_embeddings else 2)
    final_norm = d
    # MTP depth: hidden / embedding / output norms, the [h; e] -> d projection, one block of the last kind.
    mtp_block = mtp_block_shape(shape)
    mtp = shape.mtp_depth * (3 * d + 2 * d * d + block_parameters(mtp_block, kinds[-1]))
    skipped_experts = sum(ffn_parameters(shape, kind) - ffn_parameters(shape, kind, active=True) for kind in kinds)
    normuon = (sum(dense_matrix_parameters(shape, kind) for kind in kinds)
               + shape.mtp_depth * (2 * d * d + dense_matrix_parameters(mtp_block, kinds[-1])))
    return ParameterCounts(
        total=blocks + embeddings + final_norm + mtp,
        mtp=mtp,
        active=blocks + embeddings + final_norm - skipped_experts,
        active_non_embedding=blocks + final_norm - skipped_experts,
        normuon=normuon,
        blocks=blocks,
        attention=attention,
        ffn=ffn,
        norms=norms + final_norm,
        embeddings=embeddings,
        # When tied, the table is also the head and so does take part in a matmul.
        lookup=0 if shape.tie_embeddings else shape.vocab_size * d,
        by_kind=tuple(by_kind.items()),
    )


GDN_CHUNK = 64  # hymo_core/kernels/gdn_chunk.py's CHUNK (the planner stays torch-free; test_planner.py holds them equal)


def mixer_sequence_flops(shape: ModelShape, kind: str, seq_len: int) -> int:
    """Forward FLOPs per token beyond the mixer's weight matmuls, at training length seq_len.

    A / M: scores and values over the causally visible half of the keys,
    2 x (T / 2) x H x (qk + v); MLA's call runs at these widths (qk 192 / v 128 at hymo-750m: cuDNN's kernel
    on sm_90, layers/mla.py), not with v padded to qk's width for FlashAttention. G: per head, one 64-token chunk's matmuls spread
    over its tokens, 2 C (3 K + 2 V) (decays x k k^T, the UT solve applied to k
    and v, masked q k^T and its product with U), plus 6 K V for the three
    state products (W h, q h, k^T U): linear in T, so independent of seq_len.
    """
    if kind == "A":
        return seq_len * 2 * shape.d_model
    if kind == "M":
        return seq_len * shape.n_heads * (shape.mla_nope_dim + shape.mla_rope_dim + shape.mla_v_dim)
    if kind == "G":
        K, V = shape.gdn_key_head_dim, shape.gdn_value_head_dim
        return shape.gdn_heads * (2 * GDN_CHUNK * (3 * K + 2 * V) + 6 * K * V)
    raise ValueError(f"unknown mixer kind {kind!r}")


def training_flops_breakdown(shape: ModelShape, seq_len: int) -> dict[str, int]:
    """Training (forward + backward = 3 x forward) FLOPs per token by component.

    Weight matmuls count 6 per parameter (Lab 4), sequence terms 3 x their forward
    FLOPs; norms, gates and the depthwise conv are elementwise and left out.
    """
    kinds = shape.layer_kinds()
    names = {"A": "attention (GQA)", "G": "GDN", "M": "MLA"}
    out: dict[str, int] = {}
    for kind in dict.fromkeys(kinds):
        n = kinds.count(kind)
        matmul = mixer_parameters(shape, kind) - (gdn_elementwise(shape) if kind == "G" else 0)
        out[names[kind]] = n * (6 * matmul + 3 * mixer_sequence_flops(shape, kind, seq_len))
    dense = sum(1 for kind in kinds if kind not in shape.moe_on)
    out["dense FFN"] = dense * 6 * 3 * shape.d_model * shape.ffn_dim
    moe = len(kinds) - dense
    if moe:  # router + the k routed and the shared experts a token passes through
        out["MoE"] = 6 * sum(ffn_parameters(shape, kind, active=True) for kind in kinds if kind in shape.moe_on)
    out["head"] = 6 * shape.vocab_size * shape.d_model
    if shape.mtp_depth:  # per depth: projection, one block (active part), the shared head again
        last = kinds[-1]
        block = 2 * shape.d_model**2 + block_parameters(mtp_block_shape(shape), last, active=True) - mixer_vectors(shape, last)
        out["MTP (training only)"] = shape.mtp_depth * (6 * block + 3 * mixer_sequence_flops(shape, last, seq_len)
                                                        + 6 * shape.vocab_size * shape.d_model)
    return out


def gdn_elementwise(shape: ModelShape) -> int:
    """GDN parameters that are not matmul weights: conv taps, A_log, dt_bias, o_norm gain."""
    H = shape.gdn_heads
    key, value = H * shape.gdn_key_head_dim, H * shape.gdn_value_head_dim
    return (2 * key + value) * shape.gdn_conv_size + 2 * H + shape.gdn_value_head_dim


# The one FLOP convention every MFU figure uses (the planner, the trainer's monitor, bench/gpu_check.py):
# seed module 8, Lab 4 step 2 (after PaLM): 2 FLOPs per weight per token forward, twice that backward,
# the input embedding (a lookup) left out; causal attention averages T / 2 visible keys, so 2 L d T
# forward and 6 L d T for training. GDN and MLA use their own sequence terms, MoE its active experts.
FLOP_CONVENTION = ("6 x matmul parameters + 6 L d T causal-averaged attention (seed module 8, Lab 4 step 2); "
                   "GDN / MLA: 3 x their forward sequence FLOPs; MoE: active experts only")


def training_flops_per_token(shape: ModelShape, seq_len: int) -> int:
    """Training FLOPs per token under FLOP_CONVENTION: the one function the planner, the trainer's MFU
    and the GPU check all call.

    For a plain all-"A" stack that is the formula as printed, 6 (N - lookup) + 6 L d T; with other
    kinds, MoE or MTP, the sum of training_flops_breakdown (weight matmuls of the active path only).
    """
    counts = count_parameters(shape)
    if set(shape.layer_pattern) == {"A"} and not shape.moe_on and not shape.mtp_depth:
        return 6 * (counts.total - counts.lookup) + 6 * shape.n_layers * shape.d_model * seq_len
    return sum(training_flops_breakdown(shape, seq_len).values())


def decode_cache_bytes(shape: ModelShape, context: int, dtype_bytes: int = 2) -> dict[str, float]:
    """Per-sequence generation cache by mixer kind at `context` tokens.

    A: keys and values per position; M: the latent plus the shared rope key per
    position; G: no per-position cache at all, a fixed fp32 state (H x K x V)
    plus the conv's last (conv_size - 1) inputs.
    """
    kinds = shape.layer_kinds()
    out: dict[str, float] = {}
    if "A" in kinds:
        out["A: KV cache"] = kinds.count("A") * 2 * context * shape.n_kv_heads * shape.head_dim * dtype_bytes
    if "M" in kinds:
        out["M: latent cache"] = kinds.count("M") * context * (shape.mla_kv_rank + shape.mla_rope_dim) * dtype_bytes
    if "G" in kinds:
        H, K, V = shape.gdn_heads, shape.gdn_key_head_dim, shape.gdn_value_head_dim
        per_layer = 4 * H * K * V + (shape.gdn_conv_size - 1) * H * (2 * K + V) * dtype_bytes
        out["G: recurrent state"] = kinds.count("G") * per_layer
    return out


def training_flops(shape: ModelShape, tokens: float, seq_len: int) -> tuple[float, float]:
    """(architecture-aware FLOPs, 6 N_total D shortcut) for `tokens` training tokens."""
    detailed = training_flops_per_token(shape, seq_len) * tokens
    shortcut = 6 * count_parameters(shape).total * tokens
    return detailed, shortcut


def gpu_time(flops: float, sustained_flops_per_gpu: float, n_gpus: int) -> tuple[float, float]:
    """(GPU-hours, wall-clock hours) at a sustained per-GPU rate; no downtime."""
    gpu_hours = flops / sustained_flops_per_gpu / 3600
    return gpu_hours, gpu_hours / n_gpus


def optimizer_state_bytes(counts: ParameterCounts, bf16_weights: bool = True) -> dict[str, float]:
    """Optimizer state of NorMuon + CautiousAdamW vs AdamW everywhere, fp32 throughout.

    NorMuon keeps one momentum per weight (its per-row second moment is one number per row:
    negligible), AdamW two moments; with bf16 weights every parameter also has an fp32 master.
    """
    master = 4 if bf16_weights else 0
    adamw = counts.total - counts.normuon
    return {
        "NorMuon partition": counts.normuon * (4 + master),
        "CautiousAdamW partition": adamw * (8 + master),
        "AdamW on everything": counts.total * (8 + master),
    }


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


def daly_interval(write_seconds: float, mtbf_seconds: float) -> float:
    """Daly (2006)'s higher-order refinement of Young's interval: sqrt(2 d M) (1 + sqrt(d / 2M) / 3 + d / 18M) - d for
    d < 2M, else M. Within a write of Young's when failures are rare; it matters when the write is a sizeable part of M."""
    if write_seconds >= 2 * mtbf_seconds:
        return mtbf_seconds
    ratio = write_seconds / (2 * mtbf_seconds)
    return math.sqrt(2 * write_seconds * mtbf_seconds) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - write_seconds


def checkpoint_overhead(write_seconds: float, interval_seconds: float, mtbf_seconds: float) -> float:
    """Fraction of time lost to writing plus expected recompute after a failure."""
    return write_seconds / interval_seconds + interval_seconds / (2 * mtbf_seconds)


# One GPU's mean time between unexpected job interruptions, in GPU-hours: Meta's Llama 3 report (Dubey et al., 2024,
# section 3.3.4) counts 419 unexpected interruptions in a 54-day snapshot of pre-training on 16,384 H100s, i.e.
# 16,384 x 54 x 24 / 419 = 50,677 GPU-hours each (about 5.8 years), and a cluster of N GPUs fails N times as often:
# 3.09 h on 16,384 GPUs, 263 days on 8. The rate counts every cause that stopped the job (GPUs 58.7 %, HBM, network,
# host), so it is a whole-node rate per GPU, not a GPU's own.
LLAMA3_GPU_MTBF_HOURS = 16_384 * 54 * 24 / 419
LLAMA3_SOURCE = "Llama 3 report: 419 unexpected interruptions in 54 days on 16,384 GPUs"
CHINCHILLA_TOKENS_PER_PARAMETER = 20.0  # Hoffmann et al. (2022): compute-optimal D/N is about 20


@dataclass(frozen=True)
class RunPlan:
    """What a run looks like from the outside. Defaults: Lab 4's 2T-token base run on 80 GPUs.

    The GPUs are laid out as pipeline stages x data-parallel replicas (`pipeline_stages` is capped at `n_gpus`;
    `n_gpus` must divide by it); ZeRO shards over the replicas unless `shard_gpus` says otherwise."""

    tokens: float = 2e12
    seq_len: int = 8192
    micro_batch: int = 1
    n_gpus: int = 80
    sustained_flops: float = 4e14  # per GPU, already net of comm and recompute
    shard_gpus: int | None = None  # ZeRO degree; None: the data-parallel degree
    capacity_gb: float = 80.0
    pipeline_stages: int = 4
    batch_tokens: float = 2**22  # global batch per optimizer step
    checkpoint_write_s: float = 60.0
    gpu_mtbf_hours: float = LLAMA3_GPU_MTBF_HOURS  # one GPU's, in GPU-hours; the run's is this / n_gpus

    @property
    def stages(self) -> int:
        return max(1, min(self.pipeline_stages, self.n_gpus))

    @property
    def data_parallel(self) -> int:
        if self.n_gpus < 1 or self.n_gpus % self.stages:
            raise ValueError(f"{self.n_gpus} GPUs do not split into {self.stages} pipeline stages")
        return self.n_gpus // self.stages

    @property
    def zero_degree(self) -> int:
        return self.shard_gpus or self.data_parallel

    @property
    def micro_batches(self) -> int:
        """Micro-batches each replica runs per optimizer step (gradient accumulation x the pipeline's m)."""
        return max(1, round(self.batch_tokens / (self.data_parallel * self.micro_batch * self.seq_len)))

    @property
    def mtbf_hours(self) -> float:
        return self.gpu_mtbf_hours / self.n_gpus


def batch_advice(run: RunPlan) -> list[tuple[str, str]]:
    """The global batch against the layout: the smallest batch the GPUs can take, accumulation, and the bubble it costs."""
    per_step = run.data_parallel * run.micro_batch * run.seq_len  # one micro-batch per replica
    realised = per_step * run.micro_batches
    rows = [("global batch", f"{realised:,} tokens = {run.data_parallel} replicas x {run.micro_batches} micro-batches "
                             f"x {run.micro_batch} x {run.seq_len} tokens (asked {run.batch_tokens:,.0f}; {run.tokens / realised:,.0f} steps)")]
    if run.batch_tokens < per_step:
        rows.append(("  batch advice", f"below one micro-batch per replica ({per_step:,} tokens): raise the batch or use fewer "
                                       "replicas; the GPUs cannot all be busy"))
    elif run.stages > 1 and run.micro_batches < 4 * run.stages:
        rows.append(("  batch advice", f"m = {run.micro_batches} micro-batches for {run.stages} stages: the bubble "
                                       f"{pipeline_bubble(run.stages, run.micro_batches):.1%} falls under 6 % at m >= 16p = "
                                       f"{16 * run.stages} ({16 * run.stages * per_step:,} tokens), or use fewer stages"))
    else:
        rows.append(("  batch advice", f"{run.micro_batches} micro-batches per replica per step; check it against the measured "
                                       "critical batch (`hymo plan batch RUN`) before scaling the LR with it"))
    return rows


def _gpus(count: int) -> str:
    return f"{count:,} GPU{'s' if count != 1 else ''}"


def format_plan(shape: ModelShape, run: RunPlan) -> str:
    """Readable table of everything above for one shape and one run."""
    counts = count_parameters(shape)
    detailed, shortcut = training_flops(shape, run.tokens, run.seq_len)
    gpu_hours, hours = gpu_time(detailed, run.sustained_flops, run.n_gpus)
    gb = 1e9
    per_parameter = run.tokens / counts.total
    chinchilla = "below" if per_parameter < CHINCHILLA_TOKENS_PER_PARAMETER else "at or above"
    rows: list[tuple[str, str]] = [
        ("parameters", f"{counts.total:,}"),
        ("  blocks / attention / ffn", f"{counts.blocks:,} / {counts.attention:,} / {counts.ffn:,}"),
        ("  embeddings / norms", f"{counts.embeddings:,} / {counts.norms:,}"),
        ("tokens per parameter", f"{per_parameter:,.1f} ({chinchilla} Chinchilla's compute-optimal ~{CHINCHILLA_TOKENS_PER_PARAMETER:g}; "
                                 f"{CHINCHILLA_TOKENS_PER_PARAMETER * counts.total:.3g} tokens would be)"),
        ("training FLOPs/token", f"{training_flops_per_token(shape, run.seq_len):,}"),
        (f"training FLOPs ({run.tokens:.3g} tokens)", f"{detailed:.3e}"),
        ("  6 N D shortcut", f"{shortcut:.3e} ({shortcut / detailed - 1:+.1%})"),
        (
            f"time on {_gpus(run.n_gpus)} @ {run.sustained_flops:.3g} FLOP/s",
            f"{gpu_hours:,.1f} GPU-hours, {hours:,.2f} hours ({hours / 24:.2f} days)",
        ),
        ("layout", f"{_gpus(run.n_gpus)} = {run.stages} pipeline stage{'s' if run.stages > 1 else ''} x {run.data_parallel} "
                   f"data-parallel replica{'s' if run.data_parallel > 1 else ''}; ZeRO over {run.zero_degree}"),
    ]
    stage_parameters = counts.total / run.stages
    states = [model_state_bytes(stage_parameters, run.zero_degree, stage) / gb for stage in ZERO_STAGES]
    rows.append(
        (
            f"model state/GPU, {_gpus(run.n_gpus)}",
            "DP {:.1f}, ZeRO-1 {:.1f}, ZeRO-2 {:.1f}, ZeRO-3 {:.2f} GB".format(*states),
        )
    )
    stage_shape = replace(shape, n_layers=max(1, math.ceil(shape.n_layers / run.stages)))
    acts = activation_bytes(stage_shape, run.seq_len, run.micro_batch) / gb
    acts_ckpt = activation_bytes(stage_shape, run.seq_len, run.micro_batch, checkpoint=True) / gb
    logits = logits_bytes(shape, run.seq_len, run.micro_batch) / gb
    rows.append(
        (
            f"activations/GPU (T={run.seq_len}, micro-batch {run.micro_batch}, {stage_shape.n_layers} layers)",
            f"{acts:.2f} GB, checkpointed {acts_ckpt:.2f} GB; fp32 logits {logits:.2f} GB",
        )
    )
    for checkpoint in (False, True):
        fit = memory_fit(
            stage_shape, run.zero_degree, 3, run.seq_len, run.micro_batch, checkpoint, run.capacity_gb * gb
        )
        label = "ZeRO-3 total" + (", checkpointed" if checkpoint else "")
        rows.append(
            (label, f"{fit.total / gb:.2f} GB; under {run.capacity_gb:g} GB: {fit.fits}")
        )
    rows.append(
        (
            f"pipeline bubble p={run.stages}, m={run.micro_batches}",
            f"{pipeline_bubble(run.stages, run.micro_batches):.1%}",
        )
    )
    rows += batch_advice(run)
    mtbf_s = run.mtbf_hours * 3600
    interval = daly_interval(run.checkpoint_write_s, mtbf_s)
    overhead = checkpoint_overhead(run.checkpoint_write_s, interval, mtbf_s)
    rows.append((f"MTBF on {_gpus(run.n_gpus)}", f"{run.mtbf_hours:,.2f} h ({run.gpu_mtbf_hours:,.0f} GPU-hours per GPU / {run.n_gpus}; "
                                                f"{LLAMA3_SOURCE}); {hours / run.mtbf_hours:,.1f} interruptions expected in the run"))
    rows.append(
        (
            f"checkpoint every (write {run.checkpoint_write_s:g} s, Young/Daly)",
            (f"{interval / 60:,.1f} minutes" if interval < 7200 else f"{interval / 3600:,.1f} hours")
            + f", overhead {overhead:.1%}" + (" (longer than the run: the run's own end and a final save suffice)"
                                              if interval > hours * 3600 else ""),
        )
    )
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


# Seed 000's per-token table for the production shape ("Worked example"), in MFLOPs/token.
SEED_MFLOPS = {"MLA": 17.0, "GDN": 20.0, "MoE": 96.0, "dense FFN": 149.0, "head": 57.5}
SEED_TOTAL_MFLOPS = 340.0


def format_hybrid(shape: ModelShape, seq_len: int, compare_seed: bool = False) -> str:
    """Parameters and per-token FLOPs by component; with `compare_seed`, next to seed 000's table and why they differ."""
    counts = count_parameters(shape)
    breakdown = training_flops_breakdown(shape, seq_len)
    total_flops = sum(breakdown.values())
    names = {"A": "attention (GQA)", "G": "GDN", "M": "MLA"}
    rows: list[tuple[str, str]] = [
        ("layers", f"{shape.n_layers}: " + " ".join(f"{k} x{shape.layer_kinds().count(k)}" for k in dict.fromkeys(shape.layer_kinds()))
         + f" (pattern {shape.layer_pattern!r})"),
        ("parameters, total", f"{counts.total:,}" + (f" (MTP {counts.mtp:,}, training only)" if counts.mtp else "")),
        ("parameters, active per token", f"{counts.active:,}" + (
            f" ({shape.moe_activated_experts} of {shape.moe_routed_experts} routed + {shape.moe_shared_experts} shared "
            f"experts on {sum(k in shape.moe_on for k in shape.layer_kinds())} MoE layers; no MTP)" if shape.moe_on else "")),
        ("parameters, active per token, no embeddings", f"{counts.active_non_embedding:,} (without the input table and the head)"),
        ("parameters, NorMuon / CautiousAdamW", f"{counts.normuon:,} / {counts.total - counts.normuon:,}"),
        ("  mixers", ", ".join(f"{names[k]} {n:,}" for k, n in counts.by_kind)),
        ("  FFN / embeddings / norms", f"{counts.ffn:,} / {counts.embeddings:,} / {counts.norms:,}"),
        (f"training FLOPs/token (fwd+bwd, T={seq_len})", f"{total_flops / 1e6:,.1f} M"),
    ]
    for name, flops in breakdown.items():
        seed = SEED_MFLOPS.get(name) if compare_seed else None
        seed_text = f"   seed {seed:g} M" if seed is not None else ""
        rows.append((f"  {name}", f"{flops / 1e6:,.1f} M = 6 x {flops / 6e6:,.1f} M MACs/fwd{seed_text}"))
    if compare_seed and "MoE" not in breakdown:
        rows.append(("  MoE", f"0 (moe_on={shape.moe_on!r}: no MoE layers)   seed {SEED_MFLOPS['MoE']:g} M"))
    if compare_seed:
        rows.append(("  forward MACs (the seed's unit)", f"{total_flops / 6e6:,.1f} M   seed total ~{SEED_TOTAL_MFLOPS:g} M"))
    for name, size in optimizer_state_bytes(counts).items():
        rows.append((f"optimizer state, {name} (fp32 + fp32 master)", f"{size / 2**30:,.2f} GiB"))
    cache = decode_cache_bytes(shape, seq_len)
    rows.append((f"generation cache per sequence (T={seq_len}, bf16)",
                 ", ".join(f"{k} {v / 2**20:,.1f} MiB" for k, v in cache.items())))
    width = max(len(label) for label, _ in rows)
    text = "\n".join(f"{label:<{width}}  {value}" for label, value in rows)
    return text + ("\n\n" + SEED_DIFFERENCES if compare_seed else "")


SEED_DIFFERENCES = """Where this differs from the seed's ~340 MFLOPs/token:
- Unit: the seed's head entry, 57.5 M, is 64,256 x 896 = one multiply-add per head weight, and its
  dense FFN entry, 6.2 M per layer, is 3 x 896 x 2304: its numbers are forward multiply-adds. Training
  costs 6 FLOPs per weight per token (2 forward, 4 backward), so every matmul line above is 6x the
  seed's unit; the "forward MACs" line converts back.
- Dense FFN and MoE: as the seed, 24 dense layers and MoE on the 8 MLA layers (one routed + one shared
  expert of 3 x 896 x 2304 active per token, plus the 16-way router). With `moe_on = ""` all 32 layers
  are dense and the dense line is 32/24 of the seed's.
- MTP: the seed's table has no MTP line; ours counts its two depths (projection, one MLA block with a
  dense FFN, the shared head again), which run in training only. The seed's MoE modules are the 8 of
  the trunk's MLA layers, so MTP blocks carry none (`mtp_moe = true` gives them the trunk's MoE).
- GDN: the seed's 20 M for 24 layers is ~0.8 M MACs per layer, about one 896 x 896 matrix; a GDN layer
  with 7 heads of 128 (values 2x wide) has q, k, v, gate and out projections (~6.4 M weights) plus the
  chunked recurrence (per head 2 C (3 K + 2 V) + 6 K V FLOPs per token), so our GDN line is far larger.
- MLA: the seed's 17 M for 8 layers covers roughly the projections; at T = 4096 causal attention over
  a 192-wide q.k and 128-wide values adds T/2 x 7 x 320 ~ 4.6 M MACs per layer and token on top.
- Not counted on either side: norms, gates, the depthwise conv, softmax, the embedding lookup."""
