"""A run directory: `RUN/NN_stage/` per stage, in pipeline order."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from manifests.stage_manifest import StageManifest, StageNotComplete, read_manifest

STAGE_DIR_RE = re.compile(r"^(\d{2})_([a-z0-9_]+)$")


@dataclass(frozen=True)
class StageDir:
    order: int
    stage: str
    path: Path


def stage_dir_name(order: int, stage: str) -> str:
    return f"{order:02d}_{stage}"


def list_stage_dirs(run: Path) -> list[StageDir]:
    """Published-or-not stage directories of a run, in pipeline order (hidden work dirs excluded)."""
    run = Path(run)
    if not run.is_dir():
        raise FileNotFoundError(f"{run}: not a run directory")
    found = []
    for child in run.iterdir():
        match = STAGE_DIR_RE.match(child.name)
        if match and child.is_dir():
            found.append(StageDir(int(match.group(1)), match.group(2), child))
    return sorted(found, key=lambda s: s.order)


def completed_stages(run: Path, verify: bool = False, full: bool = False) -> list[tuple[StageDir, StageManifest]]:
    """Stages whose manifest is complete; an unfinished stage is skipped as if absent.
    `full`: with `verify`, hash every file rather than trust unchanged stats."""
    done = []
    for stage_dir in list_stage_dirs(run):
        try:
            done.append((stage_dir, read_manifest(stage_dir.path, verify=verify, full=full)))
        except StageNotComplete:
            continue
    return done


def find_stage(run: Path, stage: str) -> tuple[StageDir, StageManifest]:
    for stage_dir, manifest in completed_stages(run):
        if stage_dir.stage == stage:
            return stage_dir, manifest
    names = [s.stage for s, _ in completed_stages(run)]
    raise KeyError(f"{run}: no completed stage {stage!r} (completed: {', '.join(names) or 'none'})")
