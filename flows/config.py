"""PipelineConfig: one object with every stage's config, loaded from TOML.

A pydantic model so the Prefect UI renders it as a form; each stage's section
is that stage's own frozen dataclass, defined beside the stage's code.
"""
from __future__ import annotations

import json
import os
import tomllib
from dataclasses import replace
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hymo_core.overrides import apply_overrides
from manifests.sources import PACKAGE_DIR, SourceSpec, load_source
from tasks.dedup.decontam import DecontamConfig
from tasks.dedup.exact import DedupExactConfig
from tasks.dedup.fuzzy import DedupFuzzyConfig
from tasks.ingest.extract import ExtractConfig
from tasks.ingest.ingest import IngestConfig
from tasks.filters.langid import LangIdConfig
from tasks.corpus.mixture import MixtureConfig
from tasks.filters.pii import PiiConfig
from tasks.pretrain import PretrainConfig
from tasks.filters.quality_config import QualityConfig
from tasks.filters.quality_model import QualityModelConfig
from tasks.corpus.shards import ShardsConfig
from tasks.corpus.split import SplitConfig
from tasks.corpus.tokenizer import TokenizerConfig
from tasks.filters.user_filter import UserFilterConfig

SAMPLE_CONFIG = PACKAGE_DIR / "configs" / "sample.toml"
RUN_CONFIG = "config.json"  # the config a run was started with, in its directory
HOME_ENV = "HYMO_HOME"  # where run directories go when no path is given (default: the current directory)
SAMPLE_RUN = "sample"  # the default run directory's name, under default_run_root()


class PipelineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sources: list[str] = Field(
        default_factory=lambda: ["python-docs", "python-docs-warc", "prose-enwiki", "multilingual", "generated"],
        description="Bundled source names or paths to source-spec TOML files, in ingestion order.",
    )
    config_dir: str | None = Field(None, description="Directory that relative source-spec paths resolve against.")
    workers: int | None = Field(None, ge=1, le=256, description="Worker processes per stage (default: all cores).")
    task_retries: int = Field(1, ge=0, le=10, description=(
        "Prefect retries of a stage task that failed with a fault a retry may clear (a worker process that died, an I/O or "
        "network error); user errors and a full disk fail at once. Safe: a stage recomputes into a fresh work directory."))
    task_retry_delay_s: float = Field(10.0, ge=0, le=3600, description="Seconds before a stage task's retry.")
    ingest: IngestConfig = Field(default_factory=IngestConfig)
    extract: ExtractConfig = Field(default_factory=ExtractConfig)
    langid: LangIdConfig = Field(default_factory=LangIdConfig)
    quality: QualityConfig = Field(default_factory=QualityConfig)
    quality_model: QualityModelConfig = Field(default_factory=QualityModelConfig)
    filters: list[UserFilterConfig] = Field(
        default_factory=list, description="User-defined filter stages ([[filters]] name, after, function = 'module:function').")
    pii: PiiConfig = Field(default_factory=PiiConfig)
    dedup_exact: DedupExactConfig = Field(default_factory=DedupExactConfig)
    dedup_fuzzy: DedupFuzzyConfig = Field(default_factory=DedupFuzzyConfig)
    decontam: DecontamConfig = Field(default_factory=DecontamConfig)
    split: SplitConfig = Field(default_factory=SplitConfig)
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    mixture: MixtureConfig = Field(default_factory=MixtureConfig)
    shards: ShardsConfig = Field(default_factory=ShardsConfig)
    pretrain: PretrainConfig = Field(default_factory=PretrainConfig)

    @model_validator(mode="after")
    def absolute_paths(self) -> "PipelineConfig":
        """Paths are made absolute here, on the flow host: the config's directory (against the working directory),
        and model files, filter plugin directories and an adopted tokenizer named by a relative path (against the
        config's directory, else the working directory). A worker elsewhere, in another working directory, must open
        the same file."""
        if self.config_dir and not Path(self.config_dir).is_absolute():
            self.config_dir = str(Path(self.config_dir).resolve())
        base = Path(self.config_dir) if self.config_dir else Path.cwd()
        for name in ("langid", "quality_model"):
            section = getattr(self, name)
            if section.model_path and not Path(section.model_path).is_absolute():
                setattr(self, name, replace(section, model_path=str((base / section.model_path).resolve())))
        self.filters = [replace(f, path=str((base / f.path).resolve())) if f.path and not Path(f.path).is_absolute() else f
                        for f in self.filters]
        if self.tokenizer.from_file and not Path(self.tokenizer.from_file).is_absolute():
            self.tokenizer = replace(self.tokenizer, from_file=str((base / self.tokenizer.from_file).resolve()))
        return self

    def source_specs(self) -> list[SourceSpec]:
        base = Path(self.config_dir) if self.config_dir else None
        return [load_source(name, base) for name in self.sources]


def read_config_tables(path: str | Path | None = None, overrides: list[str] | None = None) -> tuple[Path, dict]:
    """The pipeline TOML's tables (the bundled sample config without a path), `--set` overrides applied."""
    path = Path(path) if path else SAMPLE_CONFIG
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{path}: cannot read pipeline config ({exc})") from exc
    return path, apply_overrides(raw, overrides)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> PipelineConfig:
    """Read a pipeline TOML: a [run] table (sources, workers) and one table per stage, then the `--set
    section.key=value` overrides. Without a path: the bundled sample config, the one source of defaults for
    `hymo run` and the `hymo-pipeline` flow and form (the class defaults below leave the optional stages off)."""
    path, raw = read_config_tables(path, overrides)
    values = dict(raw.pop("run", {}))
    values.update(raw)
    values.setdefault("config_dir", str(path.parent.resolve()))
    pretrain = values.get("pretrain")
    if isinstance(pretrain, dict) and isinstance(pretrain.get("model"), dict):  # `preset = "hymo-tiny"`
        from hymo_core.train.config import SAMPLE_TRAIN
        from hymo_core.models.presets import expand_preset, preset_training

        train = pretrain.get("train", {})
        preset_train = preset_training(pretrain["model"])
        if preset_train and isinstance(train, dict):  # the preset's optimizer defaults beneath [pretrain.train]
            train = {**SAMPLE_TRAIN.to_dict(), **preset_train, **train}
        values["pretrain"] = {**pretrain, "model": expand_preset(pretrain["model"], f"{path} [pretrain.model]"),
                              **({"train": train} if train else {})}
    return PipelineConfig(**values)


def hymo_home() -> Path:
    """$HYMO_HOME, else the current directory; absolute, so a served deployment's defaults say where runs go."""
    return Path(os.environ.get(HOME_ENV) or ".").resolve()


def default_run_root() -> Path:
    return hymo_home() / "runs"


def default_run() -> Path:
    """`hymo run`'s output directory without --out, and the `hymo-pipeline/full` form's default under `hymo serve`."""
    return default_run_root() / SAMPLE_RUN


def load_run_config(run: Path) -> PipelineConfig:
    path = Path(run) / RUN_CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"{run}: no {RUN_CONFIG}; was this directory written by `hymo run`?")
    return PipelineConfig(**json.loads(path.read_text(encoding="utf-8"))["config"])


def with_overrides(config: PipelineConfig, overrides: list[str] | None) -> PipelineConfig:
    """`config` with `--set section.key=value` overrides, read as `hymo run` reads them (`run.workers` is the [run]
    table's key, stored at the top of a saved config); validated again as a whole."""
    if not overrides:
        return config
    flat = [text.removeprefix("run.") if text.startswith("run.") else text for text in overrides]
    return PipelineConfig(**apply_overrides(config.model_dump(mode="json"), flat))


def saved_run_config(run: Path) -> PipelineConfig:
    """The run's own config when it has one (its stage list and numbering), else the defaults."""
    return load_run_config(run) if (Path(run) / RUN_CONFIG).is_file() else PipelineConfig()
