"""One loader for evaluation, sampling and export, whatever format and world size wrote the checkpoint."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from hymo_core.checkpoint.common import model_from_config
from hymo_core.checkpoint.sharded import load_sharded_model
from hymo_core.checkpoint.single import read_checkpoint
from hymo_core.models.model import Transformer


def load_model(path: str | Path, device: torch.device | str = "cpu") -> tuple[Transformer, dict[str, Any]]:
    """A model for evaluation or sampling, with the checkpoint's metadata (no optimizer, no runtime check).

    A DCP directory (written by any number of ranks) loads into one process too.
    """
    if Path(path).is_dir():
        model, payload = load_sharded_model(path)
    else:
        payload = read_checkpoint(path)
        model = model_from_config(payload["model_config"])
        model.load_state_dict(payload["model"])
    model.to(device).eval()
    return model, payload

