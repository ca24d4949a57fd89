"""`[ingest] on_bad_file` (issue 45, part 4): "fail" names every unreadable file of the run and publishes
nothing; "quarantine" leaves each out with a file-level audit row and ingests the rest, and
`hymo audit summary` lists them."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from conftest import PROSE, write_spec

from flows.cli import main
from manifests.audit_query import quarantined_files
from manifests.sources import load_spec_file
from manifests.stage_manifest import StageNotComplete, read_manifest
from tasks.ingest.ingest import IngestConfig, InputFileError, run_ingest
from tasks.runner.stage_runner import read_stage_audit, read_stage_docs


def crawl_with_two_cut_files(root: Path) -> Path:
    folder = root / "crawl"
    folder.mkdir(parents=True)
    (folder / "a-good.jsonl").write_text("".join(json.dumps({"url": f"https://a/{i}", "text": p}) + "\n" for i, p in enumerate(PROSE)), encoding="utf-8")
    for name in ("b-cut.jsonl.gz", "c-cut.jsonl.gz"):
        blob = gzip.compress("".join(json.dumps({"text": p * 30}) + "\n" for p in PROSE * 20).encode())
        (folder / name).write_bytes(blob[: len(blob) // 2])  # a download that stopped half-way
    return write_spec(root, "crawl", "jsonl", "crawl")


def test_fail_names_every_bad_file_and_publishes_nothing(tmp_path: Path) -> None:
    spec = load_spec_file(crawl_with_two_cut_files(tmp_path))
    with pytest.raises(InputFileError) as error:
        run_ingest([spec], IngestConfig(), tmp_path / "run" / "01_ingest", workers=2)
    message = str(error.value)
    assert "b-cut.jsonl.gz" in message and "c-cut.jsonl.gz" in message and "a-good" not in message
    assert message.startswith("2 input files cannot be read") and "\n" not in message
    with pytest.raises(StageNotComplete):
        read_manifest(tmp_path / "run" / "01_ingest")
    assert not list((tmp_path / "run").glob(".01_ingest*"))


def test_quarantine_audits_each_bad_file_and_ingests_the_rest(tmp_path: Path, capsys) -> None:
    spec = load_spec_file(crawl_with_two_cut_files(tmp_path))
    run = tmp_path / "run"
    manifest = run_ingest([spec], IngestConfig(on_bad_file="quarantine"), run / "01_ingest", workers=1)
    docs = read_stage_docs(manifest.directory)
    assert docs.column("url").to_pylist() == ["https://a/0", "https://a/1", "https://a/2"]
    rows = [r for r in read_stage_audit(manifest.directory).to_pylist() if r["rule"] == "ingest_bad_file"]
    assert [json.loads(r["detail"])["file"] for r in rows] == ["b-cut.jsonl.gz", "c-cut.jsonl.gz"]
    assert all("truncated" in json.loads(r["detail"])["reason"] for r in rows) and len({r["id"] for r in rows}) == 2
    assert manifest.counts["removed"] == {"ingest_bad_file": 2}
    assert [f["file"] for f in quarantined_files(run)] == ["b-cut.jsonl.gz", "c-cut.jsonl.gz"]
    capsys.readouterr()
    assert main(["audit", "summary", str(run)]) == 0
    out = capsys.readouterr().out
    assert "quarantined input files (2" in out and "b-cut.jsonl.gz: " in out and "c-cut.jsonl.gz: " in out
