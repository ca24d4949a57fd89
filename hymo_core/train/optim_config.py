"""The optimizers' configs, importable without torch (TrainConfig builds them; hymo_core/train/optim.py runs them)."""
from __future__ import annotations

from dataclasses import dataclass

NS_DTYPE_NAMES = ("bfloat16", "float32", "float64")  # Newton-Schulz dtypes Muon accepts (hymo_core.train.optim.NS_DTYPES)
# "auto": bf16 on CUDA (tensor cores; the iteration wants a direction, not digits: tests/hymo_core/train/
# test_normuon_bf16.py bounds what it costs), fp32 elsewhere (CPUs without native bf16 matmul emulate it).
NS_DTYPE_CHOICES = ("auto",) + NS_DTYPE_NAMES


def resolve_ns_dtype(name: str, device) -> str:
    """The Newton-Schulz dtype `name` means on `device` (a torch.device or its type string): "auto" is
    bfloat16 on CUDA and float32 elsewhere; an explicit dtype is kept everywhere (fp32 stays reachable)."""
    if name not in NS_DTYPE_CHOICES:
        raise ValueError(f"ns_dtype must be one of {NS_DTYPE_CHOICES}, got {name!r}")
    if name != "auto":
        return name
    return "bfloat16" if getattr(device, "type", device) == "cuda" else "float32"


MUON_LR_ADJUSTMENTS = ("match_rms_adamw", "original", "none")
NORMUON_UPDATE_SCALES = ("match_rms_adamw", "momentum_norm")


@dataclass(frozen=True)
class OptimizerConfig:
    lr: float = 3e-4  # AdamW-scale; Muon shares it through the RMS matching
    weight_decay: float = 0.1  # matrices, embedding and head; the rest never (hymo_core/train/partition.py)
    adamw_betas: tuple[float, float] = (0.9, 0.95)
    adamw_eps: float = 1e-8
    muon_momentum: float = 0.95
    muon_nesterov: bool = True
    ns_steps: int = 5
    ns_coefficients: tuple[float, float, float] = (3.4445, -4.7750, 2.0315)
    ns_eps: float = 1e-7
    ns_dtype: str = "bfloat16"  # auto | bfloat16 | float32 | float64 (bf16 everywhere: torch.optim.Muon's choice)
    muon_lr_adjustment: str = "match_rms_adamw"
    cautious_weight_decay: bool = False

    def __post_init__(self) -> None:
        if self.ns_dtype not in NS_DTYPE_CHOICES:
            raise ValueError(f"ns_dtype must be one of {NS_DTYPE_CHOICES}, got {self.ns_dtype!r}")
        if self.muon_lr_adjustment not in MUON_LR_ADJUSTMENTS:
            raise ValueError(f"muon_lr_adjustment must be one of {MUON_LR_ADJUSTMENTS}")
        if self.lr < 0 or self.weight_decay < 0:
            raise ValueError("lr and weight_decay must be >= 0")


@dataclass(frozen=True)
class NorMuonConfig:
    """Seed 000 §3.2-3.5. `lr` is CautiousAdamW's peak LR, `muon_lr` NorMuon's (one schedule scales both)."""

    lr: float = 3e-4
    muon_lr: float = 3e-4  # same scale as AdamW because the update's RMS is matched to AdamW's (0.2)
    muon_momentum: float = 0.95  # Polyak (heavy-ball): m <- mu m + g
    muon_weight_decay: float = 0.1
    row_normalisation: bool = True  # the published NorMuon's per-neuron second moment (docs/training.md)
    row_beta2: float = 0.95
    row_eps: float = 1e-8
    update_scale: str = "match_rms_adamw"  # or "momentum_norm": seed 000 §3.1 restores ||m||_F
    ns_steps: int = 5
    ns_coefficients: tuple[float, float, float] = (3.4445, -4.7750, 2.0315)
    ns_eps: float = 1e-7
    ns_dtype: str = "auto"  # bf16 on CUDA, fp32 elsewhere (resolve_ns_dtype); "float32" keeps fp32 on CUDA too
    adamw_betas: tuple[float, float] = (0.9, 0.95)
    adamw_eps: float = 1e-8
    embed_weight_decay: float = 0.1  # seed 000 §3.3: the embedding and the head; what else decays: hymo_core/train/partition.py
    cautious_weight_decay: bool = True

    def __post_init__(self) -> None:
        if self.ns_dtype not in NS_DTYPE_CHOICES:
            raise ValueError(f"ns_dtype must be one of {NS_DTYPE_CHOICES}, got {self.ns_dtype!r}")
        if self.update_scale not in NORMUON_UPDATE_SCALES:
            raise ValueError(f"update_scale must be one of {NORMUON_UPDATE_SCALES}, got {self.update_scale!r}")
        if min(self.lr, self.muon_lr, self.muon_weight_decay, self.embed_weight_decay) < 0:
            raise ValueError("learning rates and weight decays must be >= 0")
        if not (0 <= self.muon_momentum < 1 and 0 <= self.row_beta2 < 1 and all(0 <= b < 1 for b in self.adamw_betas)):
            raise ValueError("momentum and betas must lie in [0, 1)")
