"""Late-checkpoint averaging: uniform or EMA weights over checkpoints whose parameter layouts agree.

Seed 001 ("评估若干较晚检查点"): evaluate several late checkpoints; nearby weight
averaging or an EMA may help, but only judged under the same protocol, and
only models whose parameter layouts are compatible may be averaged. So:
`average_checkpoints` refuses checkpoints whose model configs, parameter names,
shapes or dtypes differ (naming the first difference), averages in float64,
and writes an ordinary single-file checkpoint (the newest one's metadata and
optimizer state, plus `averaged_from`) that `hymo eval` reads like any other.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch

from hymo_core.checkpoint.common import CheckpointError
from hymo_core.checkpoint.load import load_model
from hymo_core.checkpoint.single import read_checkpoint, write_payload

MODES = ("uniform", "ema")


def layout_of(model: torch.nn.Module) -> dict[str, tuple[tuple[int, ...], str]]:
    return {name: (tuple(t.shape), str(t.dtype)) for name, t in model.state_dict().items()}


def check_layouts(paths: Sequence[Path], configs: Sequence[dict[str, Any]], layouts: Sequence[dict[str, tuple]]) -> None:
    """Every checkpoint against the first; the first difference is the error."""
    for path, config, layout in zip(paths[1:], configs[1:], layouts[1:]):
        if config != configs[0]:
            keys = sorted(k for k in set(config) | set(configs[0]) if config.get(k) != configs[0].get(k))
            raise CheckpointError(f"{path}: model config differs from {paths[0]} in {keys[:5]}; averaging needs one parameter layout")
        if layout != layouts[0]:
            names = sorted(n for n in set(layout) | set(layouts[0]) if layout.get(n) != layouts[0].get(n))
            raise CheckpointError(f"{path}: parameters {names[:3]} differ from {paths[0]} in name, shape or dtype")


def average_weights(paths: Sequence[str | Path], mode: str = "uniform", decay: float = 0.9) -> tuple[dict[str, torch.Tensor], list[float], dict[str, Any]]:
    """(averaged state dict, the weight each checkpoint got, the newest checkpoint's metadata); oldest first in `paths`.

    EMA over the given order: checkpoint i (of n) weighs decay^(n-1-i), normalised, as an EMA taken at those points would.
    """
    if mode not in MODES:
        raise ValueError(f"averaging mode must be one of {MODES}, got {mode!r}")
    if len(paths) < 2:
        raise ValueError("averaging needs at least two checkpoints")
    if mode == "ema" and not 0 < decay < 1:
        raise ValueError(f"EMA decay must lie in (0, 1), got {decay}")
    paths = [Path(p) for p in paths]
    n = len(paths)
    raw = [1.0] * n if mode == "uniform" else [decay ** (n - 1 - i) for i in range(n)]
    weights = [w / sum(raw) for w in raw]
    total: dict[str, torch.Tensor] = {}
    configs, layouts, payload = [], [], {}
    for index, (path, weight) in enumerate(zip(paths, weights)):
        model, payload = load_model(path)
        configs.append(payload["model_config"])
        layouts.append(layout_of(model))
        check_layouts(paths[: index + 1], configs, layouts)
        for name, tensor in model.state_dict().items():
            value = tensor.detach().to(torch.float64) * weight
            total[name] = value if name not in total else total[name] + value
        del model
    dtypes = layouts[-1]
    averaged = {name: value.to(getattr(torch, dtypes[name][1].removeprefix("torch."))) for name, value in total.items()}
    return averaged, weights, payload


def average_checkpoints(paths: Sequence[str | Path], out: str | Path, mode: str = "uniform", decay: float = 0.9) -> dict[str, Any]:
    """Write the average as one checkpoint file at `out` (atomically); returns what was averaged."""
    paths = [Path(p) for p in paths]
    averaged, weights, newest = average_weights(paths, mode, decay)
    base = read_checkpoint(paths[-1]) if paths[-1].is_file() else {**newest, "optimizer": {"state": {}, "param_groups": []}}
    payload = {**base, "model": averaged,
               "averaged_from": [{"path": str(p.resolve()), "weight": w} for p, w in zip(paths, weights)],
               "average": {"mode": mode, "decay": decay if mode == "ema" else None}}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_payload(out, payload)
    return {"out": str(out), "mode": mode, "checkpoints": [str(p) for p in paths], "weights": weights,
            "step": payload["state"]["step"], "parameters": sum(t.numel() for t in averaged.values())}
