"""Ingest reads each source file once per run for its digest (issue 57: "Digest each artifact once").

The flow learns a stage's cache key before its task run starts by running the stage under `probing()`; for
ingest that key needs every source file's sha256. The task run that follows reuses those digests (same path,
same stat) instead of reading every file again; a file whose stat moved is read again."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import write_spec

from manifests.sources import load_spec_file
from tasks.ingest import ingest as ingest_module
from tasks.ingest.ingest import IngestConfig, run_ingest
from tasks.runner.stage_runner import StageWouldRun, probing


def write_files(root: Path, count: int = 3) -> Path:
    folder = root / "crawl"
    folder.mkdir(parents=True)
    for index in range(count):
        rows = [{"url": f"https://example.org/{index}/{line}", "text": f"page {line} of file {index}: the mill by the river."} for line in range(20)]
        (folder / f"part-{index}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return write_spec(root, "crawl", "jsonl", "crawl")


@pytest.mark.parametrize("workers", [1, 2])
def test_the_key_probe_and_the_task_run_read_each_source_once(tmp_path: Path, monkeypatch, workers: int) -> None:
    spec = load_spec_file(write_files(tmp_path))
    reads: list[str] = []
    real = ingest_module.input_digest
    monkeypatch.setattr(ingest_module, "input_digest", lambda spec, path: reads.append(Path(path).name) or real(spec, path))
    out = tmp_path / "01_ingest"
    with probing(), pytest.raises(StageWouldRun) as probe:  # what the flow's cache policy does before the task run starts
        run_ingest([spec], IngestConfig(), out, workers=workers)
    manifest = run_ingest([spec], IngestConfig(), out, workers=workers)
    assert sorted(reads) == ["part-0.jsonl", "part-1.jsonl", "part-2.jsonl"]  # each file read once, by the probe
    assert manifest.cache_key == probe.value.key

    changed = tmp_path / "crawl" / "part-1.jsonl"
    changed.write_text(changed.read_text(encoding="utf-8") + json.dumps({"url": "https://example.org/new", "text": "one more page."}) + "\n",
                       encoding="utf-8")
    os.utime(changed, ns=(changed.stat().st_atime_ns, changed.stat().st_mtime_ns + 10**9))
    reads.clear()
    run_ingest([spec], IngestConfig(), out, workers=workers)
    assert reads == ["part-1.jsonl"]  # the others keep the digest recorded in the published stage
