"""The ordered list of pipeline stages; each entry runs one stage of a run directory.

The position in this list is the `NN_` prefix of the stage's directory. A new
stage is one entry here plus its module in `tasks/`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from manifests.run_dir import stage_dir_name
from manifests.stage_manifest import StageManifest
from tasks.extract import extract_task
from tasks.ingest import ingest_task
from tasks.langid import langid_task
from tasks.mixture import mixture_task
from tasks.pii import pii_task
from tasks.quality import quality_task
from tasks.shards import shards_task
from tasks.split import split_task
from tasks.tokenizer import tokenizer_task

from flows.config import PipelineConfig


@dataclass(frozen=True)
class StageEntry:
    name: str
    # (config, run directory, previous stage's directory or None, own directory) -> manifest
    run: Callable[[PipelineConfig, Path, Path | None, Path], StageManifest]


def _ingest(config: PipelineConfig, run: Path, previous: Path | None, out: Path) -> StageManifest:
    return ingest_task(config.source_specs(), config.ingest, out)


def _extract(config: PipelineConfig, run: Path, previous: Path | None, out: Path) -> StageManifest:
    return extract_task(config.extract, previous, out, config.workers)


def _langid(config: PipelineConfig, run: Path, previous: Path | None, out: Path) -> StageManifest:
    return langid_task(config.langid, previous, out, config.workers)


def _quality(config: PipelineConfig, run: Path, previous: Path | None, out: Path) -> StageManifest:
    return quality_task(config.quality, previous, out, config.workers)


def _pii(config: PipelineConfig, run: Path, previous: Path | None, out: Path) -> StageManifest:
    return pii_task(config.pii, previous, out, config.workers)


def _split(config: PipelineConfig, run: Path, previous: Path | None, out: Path) -> StageManifest:
    return split_task(config.split, previous, out, config.workers)


def _tokenizer(config: PipelineConfig, run: Path, previous: Path | None, out: Path) -> StageManifest:
    return tokenizer_task(config.tokenizer, stage_path(run, "split"), out, dict(config.mixture.weights))


def _mixture(config: PipelineConfig, run: Path, previous: Path | None, out: Path) -> StageManifest:
    return mixture_task(config.mixture, stage_path(run, "split"), stage_path(run, "tokenizer"), out)


def _shards(config: PipelineConfig, run: Path, previous: Path | None, out: Path) -> StageManifest:
    return shards_task(config.shards, stage_path(run, "split"), stage_path(run, "tokenizer"), stage_path(run, "mixture"), out)


STAGES: list[StageEntry] = [
    StageEntry("ingest", _ingest),
    StageEntry("extract", _extract),
    StageEntry("langid", _langid),
    StageEntry("quality", _quality),
    StageEntry("pii", _pii),
    # (dedup_exact, dedup_fuzzy, decontam go here, before split)
    StageEntry("split", _split),
    StageEntry("tokenizer", _tokenizer),
    StageEntry("mixture", _mixture),
    StageEntry("shards", _shards),
]

STAGE_NAMES = [entry.name for entry in STAGES]


def stage_path(run: Path, name: str) -> Path:
    index = STAGE_NAMES.index(name)
    return Path(run) / stage_dir_name(index + 1, name)


def stages_until(until: str | None) -> list[StageEntry]:
    if until is None:
        return list(STAGES)
    if until not in STAGE_NAMES:
        raise ValueError(f"unknown stage {until!r}; stages: {', '.join(STAGE_NAMES)}")
    return STAGES[: STAGE_NAMES.index(until) + 1]
