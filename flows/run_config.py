"""A run directory's `config.json`: the config, runner and stage list it was run with, and the check that
a new run (CLI, UI or a re-run) is the same pipeline before anything is written (manifests.run_layout)."""
from __future__ import annotations

import json
from pathlib import Path

from manifests.atomic import atomic_write_text
from manifests.run_dir import parse_stage_dir
from manifests.run_layout import settle_layout

from flows.config import RUN_CONFIG, PipelineConfig
from flows.stages import pipeline_stages, stage_dir_names

CHANGE_FLAG = "--change-stages (UI: change_stages)"


def recorded_stages(run: Path) -> list[str] | None:
    """The stage names the run directory records; from the saved config for a run written before the list was kept."""
    path = Path(run) / RUN_CONFIG
    if not path.is_file():
        return None
    saved = json.loads(path.read_text(encoding="utf-8"))
    if "stages" in saved:
        return [parsed.stage for name in saved["stages"] if (parsed := parse_stage_dir(Path(name))) is not None]
    return [entry.name for entry in pipeline_stages(PipelineConfig(**saved["config"]), import_functions=False)]


def saved_runner(run: Path) -> str:
    """The runner the run directory's config.json records (`process` for a record without one)."""
    return json.loads((Path(run) / RUN_CONFIG).read_text(encoding="utf-8")).get("runner") or "process"


def run_record(config: PipelineConfig, runner: str) -> str:
    stages = list(stage_dir_names(pipeline_stages(config)).values())
    return json.dumps({"config": config.model_dump(mode="json"), "runner": runner, "stages": stages}, indent=2) + "\n"


def claim_run_dir(run: Path, config: PipelineConfig, runner: str | None, change_stages: bool = False) -> list[str]:
    """Refuse a run whose stage list is not the directory's (StageListChanged), or with `change_stages` move the
    other list's directories aside; then record this run (`runner` None: a re-run, which keeps the record as it is).
    Call under the run lock. Returns what was moved or renamed, one line each."""
    run = Path(run)
    done = settle_layout(run, stage_dir_names(pipeline_stages(config)), recorded_stages(run), change_stages, CHANGE_FLAG, RUN_CONFIG)
    path = run / RUN_CONFIG
    if runner is not None:
        record = run_record(config, runner)
        if not path.is_file() or path.read_text(encoding="utf-8") != record:  # an identical record stays untouched
            atomic_write_text(path, record)
    return done
