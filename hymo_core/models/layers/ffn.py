"""Dense SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from hymo_core import kernels
from hymo_core.models.configs import ModelConfig


class FeedForward(nn.Module):
    def __init__(self, config: ModelConfig, kernel_backend: str | None = None):
        super().__init__()
        self.kernel_backend = kernel_backend
        self.gate_proj = nn.Linear(config.d_model, config.ffn_dim, bias=False)
        self.up_proj = nn.Linear(config.d_model, config.ffn_dim, bias=False)
        self.down_proj = nn.Linear(config.ffn_dim, config.d_model, bias=False)

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        # One matmul for both input projections: concatenating the small weights is
        # cheaper than a second activation-sized matmul and gradient addition.
        w_gate_up = torch.cat((self.gate_proj.weight, self.up_proj.weight))
        # SwiGLU reads the packed [gate | up] output in place (no slice copies, one gradient buffer).
        return self.down_proj(kernels.swiglu(F.linear(x_BTD, w_gate_up), backend=self.kernel_backend))

    def residual_weights(self) -> list[nn.Parameter]:
        """Weights that write into the residual stream (initialised with the depth-scaled std)."""
        return [self.down_proj.weight]
