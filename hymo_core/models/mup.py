"""muP (maximal update parametrisation, Yang et al., Tensor Programs V): which parameters scale with width.

A muP model is trained at a proxy width and its tuned LR and init carry over to wider models
(docs/training.md, "LR sweeps and muP"). Widths grow by one factor m = d_model / mup_base_width;
every other width (FFN, heads, ranks, experts) grows with it and head dimensions stay fixed
(`widen`), so attention's 1/sqrt(head_dim) logit scale and muP's 1/head_dim differ only by a
constant the proxy tunes away.

Each parameter has a width role, fixed by its name alone (the same table decides init here and
LR in hymo_core/train/partition.py, so meta-device and eager init agree by construction):

    input   the token embedding: fan-in is the vocabulary, finite. Init std and LR unchanged.
    output  the head: logits are multiplied by 1/m (`output_multiplier`); init std and AdamW LR
            unchanged. Tied, the shared matrix is "input" and the multiplier still applies.
    vector  gains, biases, GDN's per-head A_log / dt_bias, depthwise conv kernels (fan-in = taps):
            one width dimension at most, nothing scaled.
    hidden  every other matrix or stack of matrices, fan-in growing with m (projections, router
            gates, routed and shared experts, MTP's projection): init std / sqrt(m); AdamW LR / m;
            Muon/NorMuon LR / sqrt(m) under the RMS-matching scale (`muon_lr_multiplier` says why).
"""
from __future__ import annotations

import math
from dataclasses import replace

from hymo_core.models.configs import ModelConfig

WIDTH_ROLES = ("input", "output", "vector", "hidden")


def width_role(name: str, ndim: int) -> str:
    """The muP role of a parameter from its dotted name (model or block coordinates) and rank."""
    parts = name.split(".")
    if parts[0] == "tok_embeddings":
        return "input"
    if parts[0] == "output":
        return "output"
    if ndim < 2 or any(part.endswith("conv1d") for part in parts):
        return "vector"
    return "hidden"


def width_mult(config: ModelConfig) -> float:
    """m = d_model / base width under muP; 1 for the standard parametrisation."""
    if config.parametrisation != "mup":
        return 1.0
    return config.d_model / (config.mup_base_width or config.d_model)


def init_multiplier(config: ModelConfig, role: str) -> float:
    """Factor on the standard init std: 1/sqrt(m) for hidden matrices (variance 1/fan-in), else 1."""
    return 1.0 / math.sqrt(width_mult(config)) if role == "hidden" else 1.0


def output_multiplier(config: ModelConfig) -> float:
    """Factor on the logits: 1/m, so the head's Theta(1) AdamW updates change logits by Theta(1) at any width."""
    return 1.0 / width_mult(config)


def adamw_lr_multiplier(config: ModelConfig, role: str) -> float:
    """AdamW's update is sign-like, entries ~lr: a hidden matrix's change of its output grows with fan-in, so lr / m."""
    return 1.0 / width_mult(config) if role == "hidden" else 1.0


def muon_lr_multiplier(config: ModelConfig, adjustment: str) -> float:
    """The factor muP puts on the Muon/NorMuon groups' LR, given the optimizer's shape-dependent update scale.

    Newton-Schulz makes the update's singular values ~1 (spectral norm 1). The spectral muP
    condition (Yang, Simon & Bernstein 2023) asks for ||dW||_2 ~ sqrt(fan_out / fan_in), which does
    not change with m for a hidden matrix. The RMS-matching scale 0.2 sqrt(max(A, B)) (Muon's
    "match_rms_adamw", NorMuon's 0.2 sqrt(AB) / ||O||_F for a full-rank O) keeps each entry's RMS
    at 0.2 lr, hence a spectral norm of 0.2 lr sqrt(max(A, B)), which grows as sqrt(m): muP
    divides the LR by sqrt(m). Keller Jordan's "original" scale sqrt(max(1, A/B)) and "none"
    already give width-independent spectral norms: factor 1. AdamW's groups keep their own rule
    (`adamw_lr_multiplier`), so the two sides of one optimizer scale differently.
    """
    if adjustment == "match_rms_adamw":
        return 1.0 / math.sqrt(width_mult(config))
    if adjustment in ("original", "none"):
        return 1.0
    raise ValueError(f"muP has no rule for the update scale {adjustment!r} (its update norm follows the gradient's)")


def widen(config: ModelConfig, factor: int) -> ModelConfig:
    """The same muP model `factor` times wider: every width scales, head dims and the base width stay.

    The base width defaults to this config's d_model, so widen(c, 1) is the proxy itself.
    """
    if factor < 1:
        raise ValueError(f"widen: factor must be >= 1, got {factor}")
    scaled = {name: getattr(config, name) * factor for name in (
        "d_model", "n_heads", "n_kv_heads", "ffn_dim", "gdn_n_heads", "mla_q_lora_rank", "mla_kv_lora_rank",
        "moe_expert_dim")}
    return replace(config, parametrisation="mup", mup_base_width=config.mup_base_width or config.d_model,
                   gdn_head_dim=config.gdn_key_head_dim, mla_qk_nope_head_dim=config.mla_nope_dim,
                   mla_qk_rope_head_dim=config.mla_rope_dim, mla_v_head_dim=config.mla_v_dim, **scaled)
