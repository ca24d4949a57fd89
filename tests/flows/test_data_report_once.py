"""The data report page is built once for what a run holds (issue 57: a no-op rerun, every stage "Cached", read the
run's text again for ~3-6 s after its last stage to write the same page)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from flows import data_report
from flows.artifacts import publish_data_report
from flows.data_report_page import REPORT_FILE

pytestmark = pytest.mark.usefixtures("prefect_harness")


def test_the_page_is_rebuilt_only_when_what_it_shows_changed(tmp_path: Path, tiny_run: Path, monkeypatch) -> None:
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    gathered = []
    real = data_report.gather
    monkeypatch.setattr(data_report, "gather", lambda where: gathered.append(where) or real(where))

    page = publish_data_report(run)
    first = page.read_bytes()
    assert publish_data_report(run) == page and len(gathered) == 1  # a flow that changed nothing: the page is kept
    assert page.read_bytes() == first

    manifest_path = next(run.glob("*_split")) / "manifest.json"
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    manifest["wall_time_s"] += 1.0  # the stage published again (its funnel row's seconds change)
    manifest_path.write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    publish_data_report(run)
    assert len(gathered) == 2

    publish_data_report(run, frozenset({"split"}))  # a stage the flow builds the page beside does not count
    publish_data_report(run, frozenset({"split"}))
    assert len(gathered) == 3

    (run / REPORT_FILE).unlink()
    assert publish_data_report(run) == page and page.exists() and len(gathered) == 4


def test_the_funnel_picture_is_drawn_once_for_the_runs_funnel(tmp_path: Path, tiny_run: Path, monkeypatch) -> None:
    from flows import artifacts

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    drawn = []
    real = artifacts.funnel_png
    monkeypatch.setattr(artifacts, "funnel_png", lambda where, path: drawn.append(path) or real(where, path))
    picture = artifacts.draw_funnel(run)
    first = picture.read_bytes()
    assert artifacts.draw_funnel(run) == picture and len(drawn) == 1 and picture.read_bytes() == first  # kept

    manifest_path = next(run.glob("*_split")) / "manifest.json"
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    manifest["counts"]["routed"] = {"held_out": manifest["counts"]["routed"].get("held_out", 0) + 1}  # another funnel row
    manifest_path.write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    artifacts.draw_funnel(run)
    picture.unlink()
    artifacts.draw_funnel(run)
    assert len(drawn) == 3 and picture.exists()
