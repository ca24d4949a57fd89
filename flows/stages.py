"""The ordered list of pipeline stages; each entry runs one stage of a run directory.

A built-in stage's position in `STAGES` is the `NN_` prefix of its directory in
every run, with or without the optional stages before it; a user filter takes
the number of the built-in stage it follows plus a letter (manifests.run_dir).
A new stage is one entry here plus its module in `tasks/`. A document stage whose
shards are independent also names its `StageDef`, so the flow can map its
shards over the task runner (processes, or Dask workers on other machines).

The list of a run depends on its config: optional stages (`quality_model`)
join when enabled, and `[[filters]]` tables insert user-defined filter stages
after the stage they name (`pipeline_stages`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from string import ascii_lowercase
from typing import Any, Callable

from manifests.run_dir import stage_dir_name
from manifests.stage_manifest import StageManifest
from tasks.dedup.decontam import DECONTAM, run_decontam
from tasks.dedup.exact import DEDUP_EXACT, run_dedup_exact
from tasks.dedup.fuzzy import DEDUP_FUZZY, run_dedup_fuzzy
from tasks.ingest.extract import run_extract
from tasks.ingest.ingest import run_ingest
from tasks.filters.langid import LANGID, LangIdConfig, run_langid
from tasks.corpus.mixture import run_mixture
from tasks.filters.pii import PII, run_pii
from tasks.filters.quality import QUALITY, run_quality
from tasks.filters.quality_model import QUALITY_MODEL, run_quality_model
from tasks.pretrain import run_pretrain
from tasks.corpus.shards import run_shards
from tasks.corpus.split import SPLIT, run_split
from tasks.runner.stage_runner import StageDef, run_stage
from tasks.corpus.tokenizer import run_tokenizer
from tasks.filters.user_filter import UserFilterConfig, UserFilterError, load_function, plugin_path_default, user_filter_stage

from flows.config import PipelineConfig, saved_run_config

RunFn = Callable[[PipelineConfig, Path, Path | None, Path], StageManifest]


@dataclass(frozen=True)
class StageEntry:
    name: str
    # (config, run directory, previous stage's directory or None, own directory) -> manifest
    run: RunFn
    # For document stages mapped shard by shard: (StageDef, its config) from the pipeline config.
    doc_stage: Callable[[PipelineConfig], tuple[StageDef, Any]] | None = None
    # Optional stages: in the run only when this says so.
    enabled: Callable[[PipelineConfig], bool] | None = None


def _on_previous(run_stage_fn: Callable[..., StageManifest], section: str) -> RunFn:
    """The common shape: this stage's config section, the previous stage's output, the worker count."""
    def run_on_previous(config: PipelineConfig, run: Path, previous: Path | None, out: Path) -> StageManifest:
        return run_stage_fn(getattr(config, section), previous, out, config.workers)

    return run_on_previous


def _ingest(config: PipelineConfig, run: Path, previous: Path | None, out: Path) -> StageManifest:
    return run_ingest(config.source_specs(), config.ingest, out)


def langid_config(config: PipelineConfig) -> LangIdConfig:
    """[langid] with each source spec's `langs`: a source keeps its own languages besides the stage's."""
    return replace(config.langid, source_langs={**{s.name: tuple(s.langs) for s in config.source_specs()}, **config.langid.source_langs})


def _langid(config: PipelineConfig, run: Path, previous: Path | None, out: Path) -> StageManifest:
    return run_langid(langid_config(config), previous, out, config.workers)


def _tokenizer(config: PipelineConfig, run: Path, previous: Path | None, out: Path) -> StageManifest:
    return run_tokenizer(config.tokenizer, stage_path(run, "split", config), out, dict(config.mixture.weights), config.workers)


def _mixture(config: PipelineConfig, run: Path, previous: Path | None, out: Path) -> StageManifest:
    return run_mixture(config.mixture, stage_path(run, "split", config), stage_path(run, "tokenizer", config), out, config.workers)


def _shards(config: PipelineConfig, run: Path, previous: Path | None, out: Path) -> StageManifest:
    return run_shards(config.shards, stage_path(run, "split", config), stage_path(run, "tokenizer", config), stage_path(run, "mixture", config), out,
                      config.workers)


def _pretrain(config: PipelineConfig, run: Path, previous: Path | None, out: Path) -> StageManifest:
    from flows.run_report import training_report  # Prefect: only where the stage runs in a flow

    return run_pretrain(config.pretrain, stage_path(run, "shards", config), out, report=training_report(
        config.pretrain.train.max_steps, config.pretrain.train.tokens_per_update * (config.pretrain.train.horizon_steps or config.pretrain.train.max_steps)))


STAGES: list[StageEntry] = [
    StageEntry("ingest", _ingest),
    # Extraction spreads pages (not shards) over supervised children inside one task.
    StageEntry("extract", _on_previous(run_extract, "extract")),
    StageEntry("langid", _langid, lambda c: (LANGID, langid_config(c))),
    StageEntry("quality", _on_previous(run_quality, "quality"), lambda c: (QUALITY, c.quality)),
    StageEntry("quality_model", _on_previous(run_quality_model, "quality_model"), lambda c: (QUALITY_MODEL, c.quality_model),
               enabled=lambda c: c.quality_model.enabled),
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

STAGE_NAMES = [entry.name for entry in STAGES]  # every built-in stage, optional ones included
STAGE_BY_NAME = {entry.name: entry for entry in STAGES}
STAGE_NUMBER = {name: number for number, name in enumerate(STAGE_NAMES, start=1)}  # the NN_ of its directory in every run
# A user filter may follow any stage that passes documents on, up to the split.
FILTERABLE = STAGE_NAMES[STAGE_NAMES.index("extract"): STAGE_NAMES.index("split")]


def user_filter_entry(spec: UserFilterConfig) -> StageEntry:
    stage = user_filter_stage(spec)

    def run_filter(config: PipelineConfig, run: Path, previous: Path | None, out: Path) -> StageManifest:
        return run_stage(stage, spec, previous, out, config.workers)

    return StageEntry(spec.name, run_filter, lambda c: (stage, spec))


def pipeline_stages(config: PipelineConfig, import_functions: bool = True) -> list[StageEntry]:
    """This config's stages in order. Every user filter's function is imported here, so one that
    cannot be imported fails the run before any stage starts (`import_functions=False`: only the list,
    e.g. of a run's recorded config whose plugin has gone)."""
    entries = [entry for entry in STAGES if entry.enabled is None or entry.enabled(config)]
    for spec in config.filters:
        spec = plugin_path_default(spec, config.config_dir)
        names = [entry.name for entry in entries]
        if spec.name in names or spec.name in STAGE_BY_NAME:
            raise UserFilterError(f"filter name {spec.name!r} is already a stage; stages: {', '.join(names)}")
        if spec.after not in names or (spec.after in STAGE_BY_NAME and spec.after not in FILTERABLE):
            allowed = [n for n in names if n in FILTERABLE or n not in STAGE_BY_NAME]
            raise UserFilterError(f"filter {spec.name!r}: after = {spec.after!r} is not a document stage of this run; one of {', '.join(allowed)}")
        if import_functions:
            load_function(spec)
        entries.insert(names.index(spec.after) + 1, user_filter_entry(spec))
    return entries


def stage_entry(config: PipelineConfig, name: str) -> StageEntry:
    for entry in pipeline_stages(config):
        if entry.name == name:
            return entry
    raise ValueError(f"unknown stage {name!r}; stages: {', '.join(e.name for e in pipeline_stages(config))}")


def stage_dir_names(entries: list[StageEntry]) -> dict[str, str]:
    """Stage name -> directory name, in pipeline order: `NN_stage` from the built-in list, `NNx_filter` after it."""
    names: dict[str, str] = {}
    number, letters = 0, iter(ascii_lowercase)
    for entry in entries:
        if entry.name in STAGE_NUMBER:
            number, letters = STAGE_NUMBER[entry.name], iter(ascii_lowercase)
            names[entry.name] = stage_dir_name(number, entry.name)
            continue
        letter = next(letters, None)
        if letter is None:
            raise UserFilterError(f"filter {entry.name!r}: at most {len(ascii_lowercase)} filters may follow one built-in stage")
        names[entry.name] = stage_dir_name(number, entry.name, letter)
    return names


def stage_path(run: Path, name: str, config: PipelineConfig | None = None) -> Path:
    """RUN/NN_name for this config (default: the config the run was started with, else the built-in default)."""
    dirs = stage_dir_names(pipeline_stages(config or saved_run_config(run)))
    if name not in dirs:
        raise ValueError(f"unknown stage {name!r}; stages: {', '.join(dirs)}")
    return Path(run) / dirs[name]


def previous_stage_path(run: Path, name: str, config: PipelineConfig | None = None) -> Path | None:
    names = [entry.name for entry in pipeline_stages(config or saved_run_config(run))]
    index = names.index(name)
    return stage_path(run, names[index - 1], config) if index else None


def stages_between(start: str | None, until: str | None, config: PipelineConfig | None = None) -> list[StageEntry]:
    entries = pipeline_stages(config or PipelineConfig())
    names = [entry.name for entry in entries]
    for name in (start, until):
        if name is not None and name not in names:
            raise ValueError(f"unknown stage {name!r}; stages: {', '.join(names)}")
    first = names.index(start) if start else 0
    last = names.index(until) + 1 if until else len(entries)
    return entries[first:last]
