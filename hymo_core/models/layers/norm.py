"""RMSNorm as a module: the learned gain around `kernels.rms_norm`."""

from __future__ import annotations

import torch
import torch.nn as nn

from hymo_core import kernels


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, kernel_backend: str | None = None):
        super().__init__()
        self.eps = eps
        self.kernel_backend = kernel_backend
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.rms_norm(x, self.weight, self.eps, backend=self.kernel_backend)
