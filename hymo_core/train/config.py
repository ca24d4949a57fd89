"""The training recipe (`TrainConfig`) and the names of what a run writes, importable without torch."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from hymo_core.train.alerts import parse_alerts
from hymo_core.train.optim_config import NS_DTYPE_CHOICES, NorMuonConfig, OptimizerConfig, resolve_ns_dtype
from hymo_core.train.schedule import SCHEDULE_KINDS, ScheduleConfig

PRECISIONS = ("fp32", "bf16", "fp16")
COMPILE_SCOPES = ("auto", "model", "blocks")  # what one torch.compile covers (TrainConfig.compile_scope)
OPTIMIZERS = ("muon_adamw", "normuon")  # hymo_core.train.optim.MuonAdamW | NorMuonAdamW
# What a training run writes into its directory.
METRICS_FILE, LOSS_PICTURE, SUMMARY_FILE, CHECKPOINT_DIR = "metrics.jsonl", "loss.png", "summary.json", "checkpoints"
EXPERT_LOAD_PICTURE = "expert_load.png"  # only for models with MoE layers
EMA_CHECKPOINT = "ema.pt"  # with ema_decay > 0: the EMA weights as a checkpoint for evaluation


@dataclass(frozen=True)
class TrainConfig:
    """One training recipe (seed 002, TrainConfig). Defaults: the sample's small CPU run."""

    batch_size: int = 8
    seq_len: int = 64
    peak_lr: float = 4e-3
    weight_decay: float = 0.1
    max_steps: int = 200  # successful updates this session may reach (absolute)
    warmup_steps: int = 20
    schedule: str = "cosine"  # constant | cosine | wsd
    horizon_steps: int = 0  # where decay ends; 0 = max_steps. Set it when a session stops early on purpose
    decay_steps: int = 0  # wsd only
    min_lr_ratio: float = 0.1
    log_interval: int = 10
    eval_interval: int = 50
    checkpoint_interval: int = 100
    eval_batches: int = 16  # fixed validation prefix, in batches
    keep_checkpoints: int = 2  # the last K, plus the best by validation loss
    gradient_accumulation_steps: int = 1
    precision: str = "fp32"  # fp32 | bf16 | fp16
    allow_cpu_fp16: bool = False  # tests only: exercise the fp16 skip path on CPU with GradScaler("cpu")
    fp16_init_scale: float = 2.0**16
    adamw_betas: tuple[float, float] = (0.9, 0.95)
    adamw_eps: float = 1e-8
    muon_momentum: float = 0.95
    muon_nesterov: bool = True
    muon_ns_steps: int = 5
    muon_ns_dtype: str = ""  # "" / "auto" = float32 on CPU (bf16 is emulated there), bfloat16 on CUDA
    qk_clip: bool = True
    qk_clip_threshold: float = 100.0  # tau: max attention logit a head may keep after an update
    max_grad_norm: float = 1.0  # 0 disables ordinary clipping
    overfit_one_batch: bool = False  # debug mode: reread one fixed batch
    seed: int = 0
    # Seed 000 §3's dual optimizer: "normuon" = NorMuon on dense matrices + CautiousAdamW elsewhere.
    optimizer: str = "muon_adamw"  # muon_adamw | normuon
    muon_peak_lr: float = 0.0  # normuon only: NorMuon's peak LR; 0 = peak_lr (the update RMS matches AdamW's)
    normuon_row_normalisation: bool = True  # the published NorMuon's per-neuron second moment (docs/training.md)
    embed_weight_decay: float = 0.1  # normuon only: embedding and head; other AdamW parameters get 0
    cautious_weight_decay: bool = False  # decay only coordinates it does not fight (each optimizer's rule: train/optim.py)
    # An exponential moving average of the weights beside the trained ones (hymo_core/train/ema.py): after every
    # applied update ema = decay * ema + (1 - decay) * weights; evaluated with them, checkpointed, written as ema.pt.
    # 0 = off. decay 0.999 averages over ~1000 updates.
    ema_decay: float = 0.0
    # How this session runs, not what it computes (a resume may change them):
    activation_checkpointing: bool = False  # recompute each block's activations in the backward instead of storing them
    compile: bool = False  # torch.compile the model (hymo_core/distributed/parallelize.py)
    # What one compile covers: "model" (one graph: embeddings, every block and the fused head + loss, so Inductor
    # fuses across block boundaries and the loss), "blocks" (each block its own graph: FSDP2's per-block hooks and
    # activation checkpointing sit between graphs, graph breaks stay local), "auto" = "blocks" under torchrun or with
    # activation checkpointing, "model" otherwise.
    compile_scope: str = "auto"
    bitwise_resume: bool = False  # refuse a resume whose thread count differs (it changes float summation order)
    # The data-parallel mesh under torchrun ([parallel] in a recipe): `replicate` x `shard` = the world size.
    # replicate = 1 is FSDP over every rank; replicate = R > 1 is HSDP: R replica groups, each sharding over
    # `shard` ranks (0 = world size / replicate), gradients reduce-scattered in a group and all-reduced across.
    replicate: int = 1
    shard: int = 0
    # Expert parallelism ([parallel] expert = P): the routed experts split over groups of P consecutive ranks,
    # tokens sent to their experts' rank and back by all-to-all (hymo_core/distributed/expert_parallel.py);
    # the W / P groups hold the same experts. 1 = experts sharded by FSDP like every other weight.
    expert: int = 1
    # The recipe's [[alerts]] tables (hymo_core/train/alerts.py); None = the defaults, () = none.
    alerts: tuple[dict[str, Any], ...] | None = None

    def __post_init__(self) -> None:
        for name in ("batch_size", "seq_len", "max_steps", "log_interval", "eval_interval", "checkpoint_interval",
                     "eval_batches", "keep_checkpoints", "gradient_accumulation_steps", "muon_ns_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TrainConfig.{name} must be a positive integer, got {value!r}")
        for name in ("warmup_steps", "horizon_steps", "decay_steps", "seed", "shard"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"TrainConfig.{name} must be a non-negative integer, got {value!r}")
        for name in ("replicate", "expert"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TrainConfig.{name} must be a positive integer, got {value!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"TrainConfig.precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.schedule not in SCHEDULE_KINDS:
            raise ValueError(f"TrainConfig.schedule must be one of {SCHEDULE_KINDS}, got {self.schedule!r}")
        if self.muon_ns_dtype and self.muon_ns_dtype not in NS_DTYPE_CHOICES:
            raise ValueError(f"TrainConfig.muon_ns_dtype must be '' or one of {NS_DTYPE_CHOICES}, got {self.muon_ns_dtype!r}")
        if not (math.isfinite(self.peak_lr) and self.peak_lr > 0):
            raise ValueError(f"TrainConfig.peak_lr must be positive, got {self.peak_lr}")
        if not (self.weight_decay >= 0 and self.max_grad_norm >= 0 and self.qk_clip_threshold > 0 and self.fp16_init_scale > 0):
            raise ValueError("weight_decay and max_grad_norm must be >= 0; qk_clip_threshold and fp16_init_scale > 0")
        if self.compile_scope not in COMPILE_SCOPES:
            raise ValueError(f"TrainConfig.compile_scope must be one of {COMPILE_SCOPES}, got {self.compile_scope!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"TrainConfig.optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if not (self.muon_peak_lr >= 0 and self.embed_weight_decay >= 0):
            raise ValueError("muon_peak_lr and embed_weight_decay must be >= 0")
        if not all(0 <= b < 1 for b in self.adamw_betas) or not 0 <= self.muon_momentum < 1:
            raise ValueError("AdamW betas and Muon momentum must lie in [0, 1)")
        if not 0 <= self.ema_decay < 1:
            raise ValueError(f"TrainConfig.ema_decay must lie in [0, 1) (0 = no EMA), got {self.ema_decay}")
        self.schedule_config()  # raises on an inconsistent schedule
        if self.alerts is not None:
            object.__setattr__(self, "alerts", tuple(dict(table) for table in self.alerts))  # TOML gives a list
            parse_alerts(self.alerts, "TrainConfig.alerts")  # raises on a bad table, naming it

    @property
    def tokens_per_update(self) -> int:
        return self.batch_size * self.seq_len * self.gradient_accumulation_steps

    def schedule_config(self) -> ScheduleConfig:
        horizon = self.horizon_steps or self.max_steps
        return ScheduleConfig(peak_lr=self.peak_lr, warmup_steps=self.warmup_steps, kind=self.schedule,
                              horizon_steps=horizon, decay_steps=self.decay_steps, min_lr_ratio=self.min_lr_ratio)

    def mesh_shape(self, world_size: int) -> tuple[int, int]:
        """(replicate, shard) over `world_size` ranks; ValueError when they do not multiply to it."""
        shard = self.shard or world_size // self.replicate
        if self.replicate * shard != world_size:
            raise ValueError(f"[parallel] replicate = {self.replicate} x shard = {self.shard or 'auto'} does not make "
                             f"{world_size} ranks")
        return self.replicate, shard

    def expert_mesh_shape(self, world_size: int) -> tuple[int, int]:
        """(expert groups, ranks per group) over `world_size` ranks; ValueError when `expert` does not divide it."""
        if world_size % self.expert:
            raise ValueError(f"[parallel] expert = {self.expert} does not divide {world_size} ranks")
        return world_size // self.expert, self.expert

    def optimizer_config(self, device) -> OptimizerConfig | NorMuonConfig:
        ns_dtype = resolve_ns_dtype(self.muon_ns_dtype or "auto", device)
        if self.optimizer == "normuon":
            return NorMuonConfig(lr=self.peak_lr, muon_lr=self.muon_peak_lr or self.peak_lr, muon_momentum=self.muon_momentum,
                                 muon_weight_decay=self.weight_decay, row_normalisation=self.normuon_row_normalisation,
                                 ns_steps=self.muon_ns_steps, ns_dtype=ns_dtype, adamw_betas=tuple(self.adamw_betas),
                                 adamw_eps=self.adamw_eps, embed_weight_decay=self.embed_weight_decay,
                                 cautious_weight_decay=self.cautious_weight_decay)
        return OptimizerConfig(lr=self.peak_lr, weight_decay=self.weight_decay, adamw_betas=tuple(self.adamw_betas),
                               adamw_eps=self.adamw_eps, muon_momentum=self.muon_momentum, muon_nesterov=self.muon_nesterov,
                               ns_steps=self.muon_ns_steps, ns_dtype=ns_dtype, cautious_weight_decay=self.cautious_weight_decay)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["adamw_betas"] = list(self.adamw_betas)
        out["alerts"] = None if self.alerts is None else [dict(table) for table in self.alerts]
        return out

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown TrainConfig keys: {', '.join(unknown)}")
        values = dict(values)
        if "adamw_betas" in values:
            values["adamw_betas"] = tuple(values["adamw_betas"])
        return cls(**values)


# The sample recipe (docs/benchmarks.md): 200 updates of 8 x 64 tokens.
SAMPLE_TRAIN = TrainConfig()  # its defaults are the sample recipe
