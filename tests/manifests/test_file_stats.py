"""Cheap cache checks: a published stage is checked by stat, and hashed only where the stat moved."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import publish_docs, write_sources

import manifests.stage_manifest as stage_manifest
import tasks.ingest.ingest as ingest
from manifests.sources import load_spec_file
from manifests.stage_manifest import DigestMismatch, is_complete, read_manifest
from tasks.ingest.ingest import IngestConfig, run_ingest


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the files sha256 is computed over (the real function still runs)."""
    seen: list[str] = []

    def spy(module):
        real = module.sha256_file

        def sha256_file(path):
            seen.append(Path(path).name)
            return real(path)

        monkeypatch.setattr(module, "sha256_file", sha256_file)

    spy(stage_manifest)
    spy(ingest)
    return seen


@pytest.fixture
def stage(tmp_path: Path) -> Path:
    return publish_docs(tmp_path / "01_ingest", {f"d{i}": f"document number {i}" for i in range(6)}, shards=2)


def test_unchanged_stage_is_verified_without_reading_its_files(stage: Path, hashed: list[str]) -> None:
    read_manifest(stage)
    assert hashed == []
    read_manifest(stage, full=True)
    assert sorted(hashed) == ["part-00000.parquet", "part-00000.parquet", "part-00001.parquet", "part-00001.parquet"]


def test_touched_but_equal_file_is_hashed_and_accepted(stage: Path, hashed: list[str]) -> None:
    victim = stage / "data" / "part-00001.parquet"
    os.utime(victim, ns=(victim.stat().st_atime_ns, victim.stat().st_mtime_ns + 10**9))
    assert read_manifest(stage).stage == "ingest"
    assert hashed == ["part-00001.parquet"]


def test_changed_file_is_caught(stage: Path) -> None:
    victim = stage / "audit" / "part-00000.parquet"
    payload = victim.read_bytes()
    victim.write_bytes(payload[:-4] + b"XXXX")
    with pytest.raises(DigestMismatch, match="part-00000.parquet"):
        read_manifest(stage)
    assert not is_complete(stage)


def test_full_verify_catches_a_change_that_kept_size_mtime_and_inode(stage: Path) -> None:
    victim = stage / "data" / "part-00000.parquet"
    before = victim.stat()
    with open(victim, "r+b") as handle:  # same inode, same size
        handle.seek(before.st_size - 4)
        handle.write(b"XXXX")
    os.utime(victim, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert is_complete(stage)  # the fast path trusts the recorded stat, by design
    with pytest.raises(DigestMismatch, match="part-00000.parquet"):
        read_manifest(stage, full=True)


def test_missing_stats_sidecar_falls_back_to_hashing(stage: Path, hashed: list[str]) -> None:
    (stage / ".file_stats.json").unlink()
    assert is_complete(stage)
    assert len(hashed) == 4


def test_ingest_rerun_trusts_unchanged_sources_and_rehashes_a_changed_one(tmp_path: Path, hashed: list[str]) -> None:
    specs = [load_spec_file(p) for p in write_sources(tmp_path / "sources")]
    first = run_ingest(specs, IngestConfig(docs_per_shard=40), tmp_path / "01_ingest")
    hashed.clear()
    again = run_ingest(specs, IngestConfig(docs_per_shard=40), tmp_path / "01_ingest")
    assert hashed == [] and again.digest == first.digest

    source = tmp_path / "sources" / "prose" / "docs.jsonl"
    source.write_text(source.read_text(encoding="utf-8") + '{"url": "https://prose.example/new", "text": "A new document."}\n', encoding="utf-8")
    changed = run_ingest(specs, IngestConfig(docs_per_shard=40), tmp_path / "01_ingest")
    assert "docs.jsonl" in hashed and changed.cache_key != first.cache_key
    assert changed.counts["in"] == first.counts["in"] + 1
