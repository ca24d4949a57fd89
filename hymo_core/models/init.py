"""Meta-device model construction for the distributed launcher (torchtitan's pattern).

    torch.manual_seed(seed)
    model = build_on_meta(config)          # every parameter and buffer on "meta": no storage at all
    ... fully_shard(block) for each block, fully_shard(model) ...
    materialise_(model, device)            # this rank's shards allocated on `device` and initialised

The result equals eager `Transformer(config)` under the same seed, bit for bit, at any world size:
each init unit (embedding, block, norm, head, MTP depth) draws from its own generator and every rank
keeps its slice of the unit's full values (hymo_core/models/materialise.py says how).
"""
from __future__ import annotations

import torch

from hymo_core.models.configs import ModelConfig
from hymo_core.models.materialise import draw_init_seed, materialise_
from hymo_core.models.model import Transformer

__all__ = ["build_on_meta", "materialise_"]


def build_on_meta(config: ModelConfig, kernel_backend: str | None = None, *, seed: int | None = None) -> Transformer:
    """The model with every parameter and buffer on the meta device. `seed` fixes the init; by default
    it is the one draw from torch's global generator that eager construction makes too."""
    init_seed = draw_init_seed() if seed is None else seed
    with torch.device("meta"):
        return Transformer(config, kernel_backend, init_seed=init_seed)
