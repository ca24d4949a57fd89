"""A run directory holds one pipeline, through `hymo run` as a user types it (real Prefect server):
toggling quality_model on an existing run is refused in one line, with --change-stages the directory
holds only the new list's stages (the old ones beside it), and a run numbered by older code still re-runs."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import write_pipeline_config

from flows.cli import main
from manifests.run_dir import list_stage_dirs
from manifests.run_layout import REPLACED_SUFFIX

pytestmark = pytest.mark.usefixtures("prefect_harness")

WITHOUT_QM = ["01_ingest", "02_extract", "03_langid", "04_quality", "06_pii"]
WITH_QM = ["01_ingest", "02_extract", "03_langid", "04_quality", "05_quality_model", "06_pii"]


@pytest.fixture(scope="module")
def configs(tmp_path_factory) -> tuple[Path, Path]:
    """The tiny pipeline without and with quality_model, over the same sources."""
    root = tmp_path_factory.mktemp("toggle")
    without = write_pipeline_config(root)
    with_qm = root / "pipeline-qm.toml"
    with_qm.write_text(without.read_text(encoding="utf-8") + '\n[quality_model]\nenabled = true\nlangs = ["*"]\n', encoding="utf-8")
    return without, with_qm


@pytest.fixture(scope="module")
def base_run(configs, tmp_path_factory) -> Path:
    """`hymo run --until pii` without quality_model; each test works on a copy. Run outside capsys: Prefect's console
    handler keeps the stream it was first given, and capsys closes its stream after the test."""
    run = tmp_path_factory.mktemp("base") / "run"
    assert main(["run", "--config", str(configs[0]), "--out", str(run), "--until", "pii"]) == 0
    return run


def copy_of(run: Path, where: Path) -> Path:
    shutil.copytree(run, where / "run", symlinks=True)
    return where / "run"


def stage_dirs(run: Path) -> list[str]:
    return [s.path.name for s in list_stage_dirs(run)]


def listing(run: Path) -> dict[str, int]:
    return {str(p.relative_to(run)): p.stat().st_mtime_ns for p in sorted(run.rglob("*")) if p.name != ".lock"}


def test_toggling_quality_model_is_refused_then_replaced_with_the_flag(configs, base_run: Path, tmp_path: Path, capsys) -> None:
    _, with_qm = configs
    run = copy_of(base_run, tmp_path)
    assert stage_dirs(run) == WITHOUT_QM
    before, record = listing(run), (run / "config.json").read_bytes()
    capsys.readouterr()

    assert main(["run", "--config", str(with_qm), "--out", str(run), "--until", "pii"]) == 1
    err = capsys.readouterr().err
    line = [text for text in err.splitlines() if text.strip()][-1]  # the command's last word, after Prefect's log lines
    assert "Traceback" not in err and line.startswith("hymo: StageListChanged: ")
    assert "holds the stages ingest, extract, langid, quality, pii, dedup_exact" in line
    assert "this run's are ingest, extract, langid, quality, quality_model, pii, dedup_exact" in line
    assert "--change-stages" in line
    assert listing(run) == before and (run / "config.json").read_bytes() == record  # refused before anything was written

    assert main(["run", "--config", str(with_qm), "--out", str(run), "--until", "pii", "--change-stages"]) == 0
    assert stage_dirs(run) == WITH_QM  # only the new list's stages: no 06_pii of the old pipeline beside them
    assert json.loads((run / "config.json").read_text())["stages"][:6] == WITH_QM
    (aside,) = tmp_path.glob(f"run{REPLACED_SUFFIX}*")
    assert stage_dirs(aside) == ["06_pii"] and json.loads((aside / "config.json").read_bytes()) == json.loads(record)

    capsys.readouterr()
    assert main(["audit", "summary", str(run), "--json"]) == 0
    assert [row["stage"] for row in json.loads(capsys.readouterr().out)] == [d[3:] for d in WITH_QM]
    assert main(["manifest", "show", str(run), "--json", "--verify"]) == 0
    assert [m["stage"] for m in json.loads(capsys.readouterr().out)] == [d[3:] for d in WITH_QM]
    published = (run / "06_pii" / "manifest.json").stat().st_mtime_ns
    assert main(["rerun", str(run), "--stage", "pii", "--until", "pii"]) == 0
    assert (run / "06_pii" / "manifest.json").stat().st_mtime_ns == published  # the same pipeline: nothing to recompute


def test_a_run_numbered_by_older_code_is_renamed_and_reruns_cached(base_run: Path, tmp_path: Path) -> None:
    """Before the fixed numbering, a run without quality_model had pii at 05, and config.json no stage list."""
    run = copy_of(base_run, tmp_path)
    os.rename(run / "06_pii", run / "05_pii")
    saved = json.loads((run / "config.json").read_text())
    del saved["stages"]
    (run / "config.json").write_text(json.dumps(saved), encoding="utf-8")
    published = (run / "05_pii" / "manifest.json").stat().st_mtime_ns

    assert main(["rerun", str(run), "--stage", "pii", "--until", "pii"]) == 0
    assert stage_dirs(run) == WITHOUT_QM
    assert (run / "06_pii" / "manifest.json").stat().st_mtime_ns == published
