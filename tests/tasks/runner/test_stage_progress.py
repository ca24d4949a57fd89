"""Progress inside long stages: extraction reports page by page, global passes name their phases, and
listening changes no output byte. (What the Prefect UI then shows: tests/flows/test_prefect_conventions.py.)"""
from __future__ import annotations

from pathlib import Path

from conftest import PROSE

from manifests.sources import load_spec_file
from manifests.stage_manifest import read_manifest
from tasks.dedup.fuzzy import DedupFuzzyConfig, run_dedup_fuzzy
from tasks.ingest.extract import ExtractConfig, run_extract
from tasks.ingest.ingest import IngestConfig, run_ingest
from tasks.runner.stage_runner import PROGRESS_SINK
from conftest import write_spec


def listened(fn, *args, **kwargs) -> tuple[object, list[tuple[str, int, int]]]:
    """`fn(*args)` with a PROGRESS_SINK that records every report."""
    reports: list[tuple[str, int, int]] = []
    token = PROGRESS_SINK.set(lambda label, done, total: reports.append((label, done, total)))
    try:
        return fn(*args, **kwargs), reports
    finally:
        PROGRESS_SINK.reset(token)


def test_extraction_reports_every_page_inside_a_shard_and_writes_the_same_bytes(tmp_path: Path, html_dir: Path) -> None:
    spec = write_spec(tmp_path, "pages", "html_dir", str(html_dir), glob="*.html", url_prefix="https://t/")
    ingested = run_ingest([load_spec_file(spec)], IngestConfig(), tmp_path / "01_ingest")
    assert len(ingested.files("data")) == 1  # one shard: every report but the last comes from inside it
    listening, reports = listened(run_extract, ExtractConfig(), ingested.directory, tmp_path / "02_extract", workers=2)
    silent = run_extract(ExtractConfig(), ingested.directory, tmp_path / "02_silent", workers=2)
    assert [(o.path, o.sha256) for o in listening.outputs] == [(o.path, o.sha256) for o in silent.outputs]
    assert {label for label, _, _ in reports} == {"extract"} and {total for _, _, total in reports} == {6}
    done = [d for _, d, _ in reports]
    assert done == sorted(done) and set(range(1, 7)) <= set(done) and done[-1] == 6


def test_fuzzy_dedup_names_the_phases_of_its_global_pass(upstream) -> None:
    texts = {f"d{i}": PROSE[i % 3] + f" Copy {i // 3}." for i in range(24)}
    previous = upstream(texts, shards=3)
    manifest, reports = listened(run_dedup_fuzzy, DedupFuzzyConfig(), previous, previous.parent / "08_dedup_fuzzy", workers=1)
    phases = [label for i, (label, _, _) in enumerate(reports) if i == 0 or reports[i - 1][0] != label]
    assert phases == ["minhash", "id ranges", "ranks", "rank bands", "lsh buckets", "verify pairs", "best edges", "clusters",
                      "cluster names asked", "cluster names answered", "cluster rows", "clusters.parquet", "removals by shard", "dedup_fuzzy"]
    assert [(done, total) for label, done, total in reports if label == "minhash"][-1] == (24, 24)
    assert read_manifest(manifest.directory).counts["removed"]  # the copies were found: the pass did its work
