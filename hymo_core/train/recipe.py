"""A training recipe TOML ([train], [model], [parallel], [[alerts]]) read into configs, without torch: `hymo train`
checks it in the CLI process before the trainer (and torch) is imported (flows.preflight)."""
from __future__ import annotations

import tomllib
from pathlib import Path

from hymo_core.models.configs import SAMPLE_MODEL, ModelConfig
from hymo_core.models.presets import model_config_from_table, preset_training
from hymo_core.overrides import apply_overrides
from hymo_core.train.config import SAMPLE_TRAIN, TrainConfig

PARALLEL_KEYS = ("replicate", "shard", "expert")  # [parallel]: the mesh (TrainConfig.replicate / shard / expert)
RECIPE_TABLES = ("train", "model", "parallel", "alerts")


def read_recipe_tables(path: str | Path | None, overrides: list[str] | None = None) -> dict:
    """The recipe's tables (none without a path: the sample recipe), `--set table.key=value` overrides applied."""
    raw: dict = {}
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"{path}: cannot read training config ({exc})") from exc
    return apply_overrides(raw, overrides)


def load_run_config(path: str | Path | None, overrides: list[str] | None = None) -> tuple[TrainConfig, ModelConfig]:
    """A TOML with optional [train], [model] and [parallel] tables and [[alerts]]; missing keys take the sample recipe's values."""
    if path is None and not overrides:
        return SAMPLE_TRAIN, SAMPLE_MODEL
    raw = read_recipe_tables(path, overrides)
    where = str(path) if path is not None else "--set"
    unknown = sorted(set(raw) - set(RECIPE_TABLES))
    if unknown:
        raise ValueError(f"{where}: unknown tables {unknown}; expected [train], [model], [parallel] and [[alerts]]")
    if "alerts" in raw:  # [[alerts]] tables: TrainConfig.alerts (hymo_core/train/alerts.py)
        raw["train"] = {**raw.get("train", {}), "alerts": raw["alerts"]}
    parallel = raw.get("parallel", {})
    if sorted(set(parallel) - set(PARALLEL_KEYS)):
        raise ValueError(f"{where}: unknown [parallel] keys {sorted(set(parallel) - set(PARALLEL_KEYS))}; known: {', '.join(PARALLEL_KEYS)}")
    model = model_config_from_table(raw.get("model", {}), SAMPLE_MODEL, where)  # `preset = "..."` allowed
    try:
        defaults = {**SAMPLE_TRAIN.to_dict(), **preset_training(raw.get("model", {}))}
        return TrainConfig.from_dict({**defaults, **raw.get("train", {}), **parallel}), model
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from exc
