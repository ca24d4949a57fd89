"""One pipeline per run directory: the stage directories a run may hold, given its stage list.

A run records its stage list (`config.json`, "stages"). A run whose list differs
(an optional stage toggled, a user filter added or removed), or a directory that
also holds stage directories of another list (written by older code, which
numbered stages by position), is refused unless the caller allows the change.
Allowed, every stage directory that is not this list's, and every one from the
first stage where the lists part on (their inputs changed, they recompute
anyway), moves with its hidden work directories into `RUN.replaced-TIME/` beside
the run, with the old `config.json`: a readable record, and nothing of the other
pipeline is left among the run's stages. Stages numbered by older code but in the
same list are renamed to their fixed number (renames keep files' inode and mtime,
so they stay published). The caller writes the new `config.json` last: a crash
in between leaves stray directories that the next run moves on.
"""
from __future__ import annotations

import os
import shutil
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from manifests.run_dir import StageDir, list_stage_dirs

REPLACED_SUFFIX = ".replaced-"


class StageListChanged(RuntimeError):
    """This run's stage list is not the one the run directory holds; the message is one line naming both."""


@dataclass
class LayoutPlan:
    changed: bool  # the recorded stage list differs from this run's
    renames: list[tuple[Path, Path]] = field(default_factory=list)  # same stage, older numbering -> its fixed name
    aside: list[StageDir] = field(default_factory=list)  # stage directories that are not this run's

    @property
    def conflict(self) -> bool:
        return self.changed or bool(self.aside)


def common_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def plan_layout(run: Path, wanted: dict[str, str], recorded: list[str] | None) -> LayoutPlan:
    """`wanted`: this run's stage name -> directory name, in order; `recorded`: the stage names the run holds (None: no record)."""
    names = list(wanted)
    changed = recorded is not None and recorded != names
    keep = set(names[:common_prefix(recorded, names)] if changed else names)
    present = list_stage_dirs(run) if Path(run).is_dir() else []
    count = Counter(s.stage for s in present)
    exact = {s.stage for s in present if s.path.name == wanted.get(s.stage)}
    plan = LayoutPlan(changed)
    for stage_dir in present:
        if stage_dir.stage not in keep:
            plan.aside.append(stage_dir)
        elif stage_dir.path.name == wanted[stage_dir.stage]:
            continue
        elif count[stage_dir.stage] == 1 and stage_dir.stage not in exact:
            plan.renames.append((stage_dir.path, stage_dir.path.with_name(wanted[stage_dir.stage])))
        else:  # a second directory of one stage: the other numbering
            plan.aside.append(stage_dir)
    return plan


def refusal(run: Path, plan: LayoutPlan, wanted: dict[str, str], recorded: list[str] | None, flag: str) -> str:
    """One line naming both stage lists (or the stray directories) and the flag that allows the change."""
    fix = (f"a run directory holds one pipeline: pass {flag} to move the other's stage directories aside "
           f"(to {Path(run).name}{REPLACED_SUFFIX}TIME beside it), or choose another output directory")
    if plan.changed:
        return f"{run} holds the stages {', '.join(recorded or [])}; this run's are {', '.join(wanted)}; {fix}"
    return (f"{run} holds stage directories of another stage list ({', '.join(s.path.name for s in plan.aside)}) beside this run's "
            f"({', '.join(wanted.values())}); {fix}")


def replaced_dir(run: Path) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    target = run.parent / f"{run.name}{REPLACED_SUFFIX}{stamp}"
    n = 1
    while target.exists():
        n += 1
        target = run.parent / f"{run.name}{REPLACED_SUFFIX}{stamp}-{n}"
    return target


def settle_layout(run: Path, wanted: dict[str, str], recorded: list[str] | None, allow_change: bool, flag: str,
                  record_name: str = "config.json") -> list[str]:
    """Make `run` hold only this run's stage directories, or raise StageListChanged. Returns what was done, one line each."""
    run = Path(run)
    plan = plan_layout(run, wanted, recorded)
    if plan.conflict and not allow_change:
        raise StageListChanged(refusal(run, plan, wanted, recorded, flag))
    done = []
    if plan.aside:
        target = replaced_dir(run)
        target.mkdir()
        if (run / record_name).is_file():
            shutil.copy2(run / record_name, target / record_name)
        for stage_dir in plan.aside:
            for hidden in (run / f".{stage_dir.path.name}.partial", run / f".{stage_dir.path.name}.old"):
                if hidden.exists():
                    os.replace(hidden, target / hidden.name)
            os.replace(stage_dir.path, target / stage_dir.path.name)
        what = f"the stage list changed from {', '.join(recorded or [])} to {', '.join(wanted)}" if plan.changed else "another stage list's directories were found"
        done.append(f"{run}: {what}; moved {', '.join(s.path.name for s in plan.aside)} aside to {target}")
    elif plan.changed:
        done.append(f"{run}: the stage list changed from {', '.join(recorded or [])} to {', '.join(wanted)}; no stage directory had to move")
    for old, new in plan.renames:
        os.replace(old, new)
    if plan.renames:
        done.append(f"{run}: renamed to the fixed stage numbering: {', '.join(f'{o.name} -> {n.name}' for o, n in plan.renames)}")
    return done
