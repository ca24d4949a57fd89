"""One pipeline per run directory: refusing another stage list, moving its directories aside when allowed,
renaming directories that older code numbered by position, and reading filter directories in order."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import publish_docs

from manifests.run_dir import completed_stages, list_stage_dirs, stage_dir_name
from manifests.run_layout import REPLACED_SUFFIX, StageListChanged, plan_layout, settle_layout
from manifests.stage_manifest import read_manifest

FLAG = "--change-stages"
WITH_QM = {"ingest": "01_ingest", "quality": "04_quality", "quality_model": "05_quality_model", "pii": "06_pii", "split": "10_split"}
WITHOUT_QM = {k: v for k, v in WITH_QM.items() if k != "quality_model"}


def make_run(root: Path, dirs: list[str], recorded: dict[str, str] | None) -> Path:
    run = root / "run"
    run.mkdir()
    for name in dirs:
        publish_docs(run / name, {f"{name}-doc": f"text of {name}"})
    if recorded is not None:
        (run / "config.json").write_text(json.dumps({"config": {}, "stages": list(recorded.values())}), encoding="utf-8")
    return run


def names(run: Path) -> list[str]:
    return sorted(p.name for p in run.iterdir())


def test_toggling_a_stage_is_refused_in_one_line_naming_both_lists_and_the_flag(tmp_path: Path) -> None:
    run = make_run(tmp_path, list(WITHOUT_QM.values()), WITHOUT_QM)
    before = names(run)
    with pytest.raises(StageListChanged) as refused:
        settle_layout(run, WITH_QM, list(WITHOUT_QM), allow_change=False, flag=FLAG)
    line = str(refused.value)
    assert "\n" not in line and FLAG in line
    assert "ingest, quality, pii, split;" in line and "ingest, quality, quality_model, pii, split;" in line
    assert names(run) == before and not list(tmp_path.glob(f"run{REPLACED_SUFFIX}*"))


def test_with_the_flag_only_the_new_lists_directories_stay(tmp_path: Path) -> None:
    run = make_run(tmp_path, list(WITHOUT_QM.values()), WITHOUT_QM)
    (run / ".06_pii.partial").mkdir()  # an interrupted attempt of a stage that moves aside goes with it
    done = settle_layout(run, WITH_QM, list(WITHOUT_QM), allow_change=True, flag=FLAG)
    # from quality_model on the lists part: pii and split had other inputs, so they move aside too
    assert names(run) == ["01_ingest", "04_quality", "config.json"]
    (aside,) = tmp_path.glob(f"run{REPLACED_SUFFIX}*")
    assert names(aside) == [".06_pii.partial", "06_pii", "10_split", "config.json"]
    assert [s.stage for s, _ in completed_stages(aside)] == ["pii", "split"]  # the moved stages stay readable
    assert len(done) == 1 and str(aside) in done[0] and "06_pii, 10_split" in done[0]


def test_directories_of_a_second_numbering_are_stray_even_when_the_list_is_the_same(tmp_path: Path) -> None:
    """What older code left after a UI run with other defaults: 05_pii beside 06_pii."""
    run = make_run(tmp_path, ["01_ingest", "04_quality", "05_pii", "05_quality_model", "06_pii", "09_split", "10_split"], WITH_QM)
    plan = plan_layout(run, WITH_QM, list(WITH_QM))
    assert not plan.changed and sorted(s.path.name for s in plan.aside) == ["05_pii", "09_split"]
    with pytest.raises(StageListChanged, match="another stage list .05_pii, 09_split. beside this run's"):
        settle_layout(run, WITH_QM, list(WITH_QM), allow_change=False, flag=FLAG)
    settle_layout(run, WITH_QM, list(WITH_QM), allow_change=True, flag=FLAG)
    assert names(run) == sorted([*WITH_QM.values(), "config.json"])


def test_the_same_list_numbered_by_position_is_renamed_and_stays_published(tmp_path: Path) -> None:
    """A run written before the fixed numbering, without quality_model: pii was 05, split 09."""
    run = make_run(tmp_path, ["01_ingest", "04_quality", "05_pii", "09_split"], None)
    sha = {o.path: o.sha256 for o in read_manifest(run / "05_pii").outputs}
    done = settle_layout(run, WITHOUT_QM, list(WITHOUT_QM), allow_change=False, flag=FLAG)
    assert names(run) == ["01_ingest", "04_quality", "06_pii", "10_split"]
    assert done == [f"{run}: renamed to the fixed stage numbering: 05_pii -> 06_pii, 09_split -> 10_split"]
    manifest = read_manifest(run / "06_pii", verify=True)  # renames keep inode and mtime: the stage checks out as published
    assert {o.path: o.sha256 for o in manifest.outputs} == sha


def test_a_fresh_directory_and_an_unchanged_one_need_nothing(tmp_path: Path) -> None:
    assert settle_layout(tmp_path / "new", WITH_QM, None, allow_change=False, flag=FLAG) == []
    run = make_run(tmp_path, list(WITH_QM.values())[:3], WITH_QM)
    assert settle_layout(run, WITH_QM, list(WITH_QM), allow_change=False, flag=FLAG) == []


def test_filter_directories_sort_right_after_the_stage_they_follow(tmp_path: Path) -> None:
    for name in ("04_quality", "03b_second", "03_langid", "03a_no_lorem", "05_quality_model", "10_split"):
        (tmp_path / name).mkdir()
    found = list_stage_dirs(tmp_path)
    assert [s.path.name for s in found] == ["03_langid", "03a_no_lorem", "03b_second", "04_quality", "05_quality_model", "10_split"]
    assert [(s.order, s.sub, s.stage) for s in found[:2]] == [(3, "", "langid"), (3, "a", "no_lorem")]
    assert stage_dir_name(3, "no_lorem", "a") == "03a_no_lorem" and sorted(p.name for p in tmp_path.iterdir()) == [s.path.name for s in found]
