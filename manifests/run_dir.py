"""A run directory: `RUN/NN_stage/` per stage, in pipeline order.

`NN` is the stage's fixed number in the built-in stage list, whether or not the
optional stages before it run (`06_pii` with or without `05_quality_model`), so
toggling a stage never renumbers the others. A user-defined filter stage takes
the number of the built-in stage it follows plus a letter, in pipeline order
(`03a_no_lorem`, `03b_second`). Directories numbered by older code (position in
the run's own list) read the same: only the order matters to a reader.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from manifests.stage_manifest import StageManifest, StageNotComplete, read_manifest

# group 1: the number, group 2: a user filter's letter (empty for a built-in stage), group 3: the stage name
STAGE_DIR_RE = re.compile(r"^(\d{2})([a-z]?)_([a-z0-9_]+)$")


@dataclass(frozen=True)
class StageDir:
    order: int
    stage: str
    path: Path
    sub: str = ""  # a user filter's letter after the number it shares with the stage it follows

    @property
    def position(self) -> tuple[int, str]:
        """Sort key: pipeline order, a filter right after the stage it follows."""
        return self.order, self.sub


def stage_dir_name(order: int, stage: str, sub: str = "") -> str:
    return f"{order:02d}{sub}_{stage}"


def parse_stage_dir(path: Path) -> StageDir | None:
    match = STAGE_DIR_RE.match(Path(path).name)
    return StageDir(int(match.group(1)), match.group(3), Path(path), match.group(2)) if match else None


def list_stage_dirs(run: Path) -> list[StageDir]:
    """Published-or-not stage directories of a run, in pipeline order (hidden work dirs excluded)."""
    run = Path(run)
    if not run.is_dir():
        raise FileNotFoundError(f"{run}: not a run directory")
    found = [stage_dir for child in run.iterdir() if child.is_dir() and (stage_dir := parse_stage_dir(child)) is not None]
    return sorted(found, key=lambda s: (s.position, s.stage))


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
