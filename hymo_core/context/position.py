"""The position plan of a context extension: what the RoPE tables become at the longer window.

Both methods touch only the model's one RoPE table, which GQA attention's queries/keys and MLA's
decoupled RoPE key (`mla_qk_rope_head_dim`) share; Gated DeltaNet layers carry no positions and
need nothing.

    interpolation  Chen et al. 2023 (position interpolation): angles at position / s with
                   s = N / T, so the N-token window reuses the trained angle range exactly.
    base           the RoPE base change (NTK-aware / ABF, as Code Llama and others extend):
                   base' = base * s^(d / (d - 2)) with d the rotated head width, which stretches
                   the slowest frequency's period by s and keeps the fastest ones nearly as trained.
"""
from __future__ import annotations

from dataclasses import replace

from hymo_core.models.configs import ModelConfig

POSITION_METHODS = ("interpolation", "base")


def extended_config(config: ModelConfig, seq_len: int, method: str) -> ModelConfig:
    """`config` at window `seq_len` (> its max_seq_len) with the chosen RoPE change."""
    if method not in POSITION_METHODS:
        raise ValueError(f"position method must be one of {POSITION_METHODS}, got {method!r}")
    if seq_len <= config.max_seq_len:
        raise ValueError(f"--seq-len {seq_len} must exceed the checkpoint's window {config.max_seq_len}")
    scale = seq_len / config.max_seq_len
    if method == "interpolation":
        return replace(config, max_seq_len=seq_len, rope_position_scale=config.rope_position_scale * scale)
    d = config.rope_dim
    return replace(config, max_seq_len=seq_len, rope_base=config.rope_base * scale ** (d / (d - 2)))
