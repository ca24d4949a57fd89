"""The ordered list of pipeline stages; each entry runs one stage of a run directory.

The position in this list is the `NN_` prefix of the stage's directory. A new
stage is one entry here plus its module in `tasks/`. A document stage whose
shards are independent also names its `StageDef`, so the flow can map its
shards over the task runner (processes, or Dask workers on other machines).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from manifests.run_dir import stage_dir_name
from manifests.stage_manifest import StageManifest
from tasks.decontam import DECONTAM, run_decontam
from tasks.dedup_exact import DEDUP_EXACT, run_dedup_exact
from tasks.dedup_fuzzy import DEDUP_FUZZY, run_dedup_fuzzy
from tasks.extract import run_extract
from tasks.ingest import run_ingest
from tasks.langid import LANGID, run_langid
from tasks.mixture import run_mixture
from tasks.pii import PII, run_pii
from tasks.quality import QUALITY, run_quality
from tasks.pretrain import run_pretrain
from tasks.shards import run_shards
from tasks.split import SPLIT, run_split
from tasks.stage_runner import StageDef
from tasks.tokenizer import run_tokenizer

from flows.config import PipelineConfig

RunFn = Callable[[PipelineConfig, Path, Path | None, Path], StageManifest]


@dataclass(frozen=True)
class StageEntry:
    name: str
    # (config, run directory, previous stage's directory or None, own directory) -> manifest
    run: RunFn
    # For document stages mapped shard by shard: (StageDef, its config) from the pipeline config.
    doc_stage: Callable[[PipelineConfig], tuple[StageDef, Any]] | None = None


def _on_previous(run_stage_fn: Callable[..., StageManifest], section: str) -> RunFn:
    """The common shape: this stage's config section, the previous stage's output, the worker count."""
    def run_on_previous(config: PipelineConfig, run: Path, previous: Path | None, out: Path) -> StageManifest:
        return run_stage_fn(getattr(config, section), previous, out, config.workers)

    return run_on_previous


def _ingest(config: PipelineConfig, run: Path, previous: Path | None, out: Path) -> StageManifest:
    return run_ingest(config.source_specs(), config.ingest, out)


def _tokenizer(config: PipelineConfig, run: Path, previous: Path | None, out: Path) -> StageManifest:
    return run_tokenizer(config.tokenizer, stage_path(run, "split"), out, dict(config.mixture.weights))


def _mixture(config: PipelineConfig, run: Path, previous: Path | None, out: Path) -> StageManifest:
    return run_mixture(config.mixture, stage_path(run, "split"), stage_path(run, "tokenizer"), out)


def _shards(config: PipelineConfig, run: Path, previous: Path | None, out: Path) -> StageManifest:
    return run_shards(config.shards, stage_path(run, "split"), stage_path(run, "tokenizer"), stage_path(run, "mixture"), out)


def _pretrain(config: PipelineConfig, run: Path, previous: Path | None, out: Path) -> StageManifest:
    from flows.run_report import training_report  # Prefect: only where the stage runs in a flow

    return run_pretrain(config.pretrain, stage_path(run, "shards"), out, report=training_report(config.pretrain.train.max_steps))


STAGES: list[StageEntry] = [
    StageEntry("ingest", _ingest),
    # Extraction spreads pages (not shards) over supervised children inside one task.
    StageEntry("extract", _on_previous(run_extract, "extract")),
    StageEntry("langid", _on_previous(run_langid, "langid"), lambda c: (LANGID, c.langid)),
    StageEntry("quality", _on_previous(run_quality, "quality"), lambda c: (QUALITY, c.quality)),
    StageEntry("pii", _on_previous(run_pii, "pii"), lambda c: (PII, c.pii)),
    # Global stages: the removal map is decided in `prepare` (inside planning), the shards only apply it.
    StageEntry("dedup_exact", _on_previous(run_dedup_exact, "dedup_exact"), lambda c: (DEDUP_EXACT, c.dedup_exact)),
    StageEntry("dedup_fuzzy", _on_previous(run_dedup_fuzzy, "dedup_fuzzy"), lambda c: (DEDUP_FUZZY, c.dedup_fuzzy)),
    StageEntry("decontam", _on_previous(run_decontam, "decontam"), lambda c: (DECONTAM, c.decontam)),
    StageEntry("split", _on_previous(run_split, "split"), lambda c: (SPLIT, c.split)),
    StageEntry("tokenizer", _tokenizer),
    StageEntry("mixture", _mixture),
    StageEntry("shards", _shards),
    StageEntry("pretrain", _pretrain),
]

STAGE_NAMES = [entry.name for entry in STAGES]
STAGE_BY_NAME = {entry.name: entry for entry in STAGES}


def stage_path(run: Path, name: str) -> Path:
    index = STAGE_NAMES.index(name)
    return Path(run) / stage_dir_name(index + 1, name)


def previous_stage_path(run: Path, name: str) -> Path | None:
    index = STAGE_NAMES.index(name)
    return stage_path(run, STAGE_NAMES[index - 1]) if index else None


def stages_between(start: str | None, until: str | None) -> list[StageEntry]:
    for name in (start, until):
        if name is not None and name not in STAGE_NAMES:
            raise ValueError(f"unknown stage {name!r}; stages: {', '.join(STAGE_NAMES)}")
    first = STAGE_NAMES.index(start) if start else 0
    last = STAGE_NAMES.index(until) + 1 if until else len(STAGES)
    return STAGES[first:last]


def stages_until(until: str | None) -> list[StageEntry]:
    return stages_between(None, until)
