"""`hymo rerun --set` and the re-run path's staleness (issue 56), through the CLI as a user types it (real Prefect):
the rerun that leaves later stages stale prints their `!` lines, `audit why` warns, the suggested refresh command
(`--until shards`) recomputes the corpus and trains nothing, and `--set` is checked as `run --set` is."""
from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import write_pipeline_config

from flows.cli import main
from manifests.run_dir import list_stage_dirs
from manifests.staleness import stale_stages

pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.fixture(scope="module")
def data_run(tmp_path_factory) -> Path:
    """`hymo run --until shards` on the tiny pipeline (its stage list ends in pretrain); tests work on copies. Run
    outside capsys: Prefect's console handler keeps the stream it was first given."""
    root = tmp_path_factory.mktemp("rerun-set")
    run = root / "run"
    assert main(["run", "--config", str(write_pipeline_config(root)), "--out", str(run), "--until", "shards"]) == 0
    return run


def copy_of(run: Path, where: Path) -> Path:
    shutil.copytree(run, where / "run", symlinks=True)
    return where / "run"


def test_set_is_checked_as_run_set_is_before_anything_runs(data_run: Path, tmp_path: Path, capsys) -> None:
    run = copy_of(data_run, tmp_path)
    record = (run / "config.json").read_bytes()
    capsys.readouterr()
    assert main(["rerun", str(run), "--stage", "quality", "--set", "quality.min_wrds=60"]) == 2
    assert capsys.readouterr().err.strip() == ("hymo: --set quality.min_wrds=60: [quality] has no key 'min_wrds'; did you mean 'min_words'? "
                                               "— fix: rename it to 'min_words', or remove it")
    assert main(["rerun", str(run), "--stage", "quality", "--set", "quality.min_words=many"]) == 2
    assert "config.json with --set: " in capsys.readouterr().err
    assert main(["rerun", str(run), "--stage", "pii", "--set", "quality.min_words=60"]) == 2
    assert "changes quality, which comes before --stage pii" in capsys.readouterr().err
    assert (run / "config.json").read_bytes() == record


def test_a_set_rerun_flags_what_it_left_stale_and_the_suggested_refresh_trains_nothing(data_run: Path, tmp_path: Path, capsys) -> None:
    run = copy_of(data_run, tmp_path)
    before = json.loads((run / "04_quality" / "manifest.json").read_text())["counts"]["kept"]
    capsys.readouterr()
    assert main(["rerun", str(run), "--stage", "quality", "--set", "quality.min_words=150", "--until", "quality"]) == 0
    out = capsys.readouterr().out
    assert json.loads((run / "config.json").read_text())["config"]["quality"]["min_words"] == 150  # recorded for later reruns
    assert json.loads((run / "04_quality" / "manifest.json").read_text())["counts"]["kept"] < before
    stale_lines = [line for line in out.splitlines() if line.startswith("! ")]
    assert stale_lines and all("--until shards`" in line for line in stale_lines)

    removed = next(row["id"] for path in sorted((run / "04_quality" / "audit").glob("*.parquet"))
                   for row in pq.read_table(path).to_pylist() if row["rule"] == "gopher_too_few_words")
    assert main(["audit", "why", str(run), removed]) == 0
    out = capsys.readouterr().out
    assert "removed at quality" in out and "! warning: this run has stale stages" in out

    command = shlex.split(re.search(r"refresh with `([^`]+)`", stale_lines[0]).group(1))
    assert command[:2] == ["hymo", "rerun"] and command[-2:] == ["--until", "shards"]
    assert main(command[1:]) == 0
    assert stale_stages(run) == []
    assert [d.stage for d in list_stage_dirs(run)][-1] == "shards"  # the refresh trained nothing: no pretrain stage
    assert not any(line.startswith("! ") for line in capsys.readouterr().out.splitlines())
