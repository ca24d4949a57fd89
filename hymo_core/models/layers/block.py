"""One layer of any stack: a token mixer and a feed-forward, each behind a pre-norm residual."""

from __future__ import annotations

import torch
import torch.nn as nn

from hymo_core.models.configs import ModelConfig
from hymo_core.models.layers.context import MixerContext
from hymo_core.models.layers.ffn import FeedForward
from hymo_core.models.layers.norm import RMSNorm


def make_mixer(kind: str, config: ModelConfig, kernel_backend: str | None) -> nn.Module:
    """The token mixer of one `layer_pattern` letter (imports only the kinds a model uses)."""
    if kind == "A":
        from hymo_core.models.layers.attention import Attention

        return Attention(config, kernel_backend)
    if kind == "G":
        from hymo_core.models.layers.gdn import GatedDeltaNet

        return GatedDeltaNet(config, kernel_backend)
    if kind == "M":
        from hymo_core.models.layers.mla import MultiHeadLatentAttention

        return MultiHeadLatentAttention(config, kernel_backend)
    raise ValueError(f"unknown mixer kind {kind!r}")


def make_ffn(kind: str, config: ModelConfig, kernel_backend: str | None, moe: bool = True) -> nn.Module:
    """Dense SwiGLU, or MoE where `config.moe_on` names this layer's mixer kind (and `moe` allows it)."""
    if moe and kind in config.moe_on:
        from hymo_core.models.layers.moe import MoE

        return MoE(config.d_model, config.moe_config(), config.init_std)
    return FeedForward(config, kernel_backend)


class Block(nn.Module):
    """x + mixer(norm(x)), then + ffn(norm(x)); see hymo_core/models/layers/__init__.py."""

    def __init__(self, config: ModelConfig, kind: str = "A", kernel_backend: str | None = None, moe: bool = True):
        """`moe=False` keeps the FFN dense even where `config.moe_on` names the kind (MTP's blocks)."""
        super().__init__()
        self.kind = kind
        self.attn_norm = RMSNorm(config.d_model, config.norm_eps, kernel_backend)
        self.attn = make_mixer(kind, config, kernel_backend)
        self.ffn_norm = RMSNorm(config.d_model, config.norm_eps, kernel_backend)
        self.ffn = make_ffn(kind, config, kernel_backend, moe)

    @property
    def is_softmax(self) -> bool:
        """Whether the mixer is softmax attention (has the logit probe and qk_clip_)."""
        return hasattr(self.attn, "qk_clip_")

    def forward(self, x_BTD: torch.Tensor, ctx: MixerContext) -> torch.Tensor:
        x_BTD = x_BTD + self.attn(self.attn_norm(x_BTD), ctx)
        return x_BTD + self.ffn(self.ffn_norm(x_BTD))
