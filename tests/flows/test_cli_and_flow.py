"""The user's surface: `hymo run` as a Prefect flow, then `hymo audit` and `hymo manifest` on its output."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import PROSE, page, write_spec

from flows.cli import main
from flows.config import PipelineConfig
from flows.pipeline import hymo_pipeline

# The pipeline ends with pretraining; a few updates of a tiny model keep this test about the flow.
TINY_PRETRAIN = {"train": {"batch_size": 2, "seq_len": 8, "max_steps": 2, "warmup_steps": 1, "eval_batches": 1},
                 "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "n_kv_heads": 2, "ffn_dim": 32, "max_seq_len": 8}}
# Two-sentence pages: relax the quality stage's length rules so documents reach the stages after it.
TINY_QUALITY = {"min_words": 20, "c4_min_sentences": 1}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory, prefect_harness) -> Path:
    tmp_path = tmp_path_factory.mktemp("tiny")
    (tmp_path / "pages").mkdir()
    for i in range(3):
        (tmp_path / "pages" / f"p{i}.html").write_text(page(f"Story {i}", PROSE[i] + " " + PROSE[(i + 1) % 3]), encoding="utf-8")
    (tmp_path / "pages" / "empty.html").write_text("", encoding="utf-8")
    (tmp_path / "pages" / "plain.html").write_text("no markup in this file at all, only words", encoding="utf-8")
    spec = write_spec(tmp_path, "pages", "html_dir", "pages", glob="*.html", url_prefix="https://example.org/")
    config = PipelineConfig(sources=[str(spec)], workers=1, quality=TINY_QUALITY, pretrain=TINY_PRETRAIN)
    summary = hymo_pipeline(config=config, out=str(tmp_path / "run"))
    assert [s["stage"] for s in summary["stages"]][:2] == ["ingest", "extract"]
    assert summary["stages"][-1]["stage"] == "pretrain"
    return tmp_path / "run"


def test_flow_run_then_audit_why_for_removed_and_kept(tiny_run: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["audit", "summary", str(tiny_run), "--json"]) == 0
    funnel = {row["stage"]: row for row in json.loads(capsys.readouterr().out)}
    assert funnel["ingest"]["in"] == 5 and funnel["ingest"]["removed"] == {"ingest_empty": 1}
    assert funnel["extract"]["removed"] == {"extract_not_html": 1}

    assert main(["audit", "sample", str(tiny_run), "--stage", "extract", "--rule", "extract_not_html", "--json"]) == 0
    removed_id = json.loads(capsys.readouterr().out)[0]["id"]
    assert main(["audit", "why", str(tiny_run), removed_id, "--json"]) == 0
    why = json.loads(capsys.readouterr().out)
    assert why["final"] == "removed at extract (extract_not_html)"
    assert [s["decision"] for s in why["stages"]] == ["kept", "removed"]

    from manifests.run_dir import find_stage
    from tasks.runner.stage_runner import read_stage_docs

    kept_id = read_stage_docs(find_stage(tiny_run, "extract")[0].path).column("id")[0].as_py()
    assert main(["audit", "why", str(tiny_run), kept_id]) == 0
    text = capsys.readouterr().out
    assert "kept" in text and "html_main_text" in text

    assert main(["audit", "why", str(tiny_run), "no-such-id"]) == 1


def test_second_identical_run_reuses_every_stage(tiny_run: Path) -> None:
    before = {p: p.stat().st_mtime_ns for p in tiny_run.rglob("manifest.json")}
    spec = tiny_run.parent / "pages.toml"
    hymo_pipeline(config=PipelineConfig(sources=[str(spec)], workers=1, quality=TINY_QUALITY, pretrain=TINY_PRETRAIN), out=str(tiny_run))
    assert {p: p.stat().st_mtime_ns for p in tiny_run.rglob("manifest.json")} == before


def test_manifest_show_lists_each_stage(tiny_run: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["manifest", "show", str(tiny_run), "--json", "--verify"]) == 0
    manifests = json.loads(capsys.readouterr().out)
    assert [m["stage"] for m in manifests][:2] == ["ingest", "extract"]
    assert all(m["complete"] is True and len(m["cache_key"]) == 64 for m in manifests)
