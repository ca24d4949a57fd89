"""Ingest's flow host holds a summary per file, never a value per record (issue 45, part 2).

The per-record accounting (document or not, text bytes, audit rows) stays in each file task's .npy file;
the shard cuts are computed from those files in chunks. Counted: the host's traced Python bytes while
ingest runs on the process runner are the same when the same files hold 8× the records, and the cuts
are the ones one sequential pass over the records makes."""
from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from conftest import write_spec

from manifests.sources import load_spec_file
from tasks.ingest import ingest as ingest_module
from tasks.ingest.ingest import IngestConfig, run_ingest, shard_pieces
from tasks.runner.stage_runner import read_stage_docs

FILES = 4


def sequential_cuts(tables: list[np.ndarray], config: IngestConfig) -> list[list[tuple[int, int, int, int, int]]]:
    """The definition: one pass over every record, a shard ending after the record that fills it."""
    shards: list[list[tuple[int, int, int, int, int]]] = [[]]
    shard_docs = shard_bytes = 0
    for index, table in enumerate(tables):
        doc_at = audit_at = doc_from = audit_from = 0
        for has_doc, text_bytes, audit_rows in table.tolist():
            doc_at += has_doc
            audit_at += audit_rows
            shard_docs += has_doc
            shard_bytes += text_bytes
            if shard_docs >= config.docs_per_shard or shard_bytes >= config.bytes_per_shard:
                shards[-1].append((index, doc_from, doc_at, audit_from, audit_at))
                shards.append([])
                doc_from, audit_from, shard_docs, shard_bytes = doc_at, audit_at, 0, 0
        if doc_at > doc_from or audit_at > audit_from:
            shards[-1].append((index, doc_from, doc_at, audit_from, audit_at))
    return shards


@pytest.mark.parametrize("chunk", [7, 1 << 18])
def test_chunked_cuts_equal_the_sequential_pass(tmp_path: Path, monkeypatch, chunk: int) -> None:
    monkeypatch.setattr(ingest_module, "RECORDS_CHUNK", chunk)
    rng = np.random.default_rng(0)
    tables = []
    for index, size in enumerate([0, 1, 50, 333, 12, 90]):
        has_doc = rng.random(size) < 0.8
        table = np.stack([has_doc, np.where(has_doc, rng.integers(1, 400, size), 0), rng.integers(0, 3, size)], axis=1).astype(np.int64)
        tables.append(table)
        np.save(tmp_path / f"{index}.npy", table)
    files = [(index, str(tmp_path / f"{index}.npy")) for index in range(len(tables))]
    for config in (IngestConfig(docs_per_shard=10, bytes_per_shard=10**9), IngestConfig(docs_per_shard=10**9, bytes_per_shard=1500),
                   IngestConfig(docs_per_shard=17, bytes_per_shard=2000), IngestConfig(docs_per_shard=1, bytes_per_shard=1),
                   IngestConfig(docs_per_shard=10**9, bytes_per_shard=10**12)):
        assert shard_pieces(files, config) == sequential_cuts(tables, config), config


def write_files(root: Path, per_file: int) -> Path:
    folder = root / "crawl"
    folder.mkdir(parents=True)
    for index in range(FILES):
        with open(folder / f"part-{index}.jsonl", "w", encoding="utf-8") as handle:
            for line in range(per_file):
                text = "" if line % 50 == 0 else f"page {line} of file {index}: the mill by the river."  # some audited
                handle.write(json.dumps({"url": f"https://example.org/{index}/{line}", "text": text}) + "\n")
    return write_spec(root, "crawl", "jsonl", "crawl")


def host_peak(root: Path, per_file: int) -> tuple[int, int]:
    """(traced peak bytes of this process while ingest runs on 2 worker processes, documents published)."""
    spec = load_spec_file(write_files(root, per_file))
    config = IngestConfig(docs_per_shard=2 * per_file)  # the same number of shards at both sizes
    tracemalloc.start()
    try:
        manifest = run_ingest([spec], config, root / "01_ingest", workers=2)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak, read_stage_docs(manifest.directory).num_rows


def test_the_hosts_traced_bytes_stay_flat_at_8x_the_records(tmp_path: Path, monkeypatch) -> None:
    # The cut pass is one job, so the process runner runs it here; it reads RECORDS_CHUNK records at a time
    # (a constant, 2^18 by default): 1,024 here, so that a file of 8,000 records is several chunks.
    monkeypatch.setattr(ingest_module, "RECORDS_CHUNK", 1024)
    run_ingest([load_spec_file(write_files(tmp_path / "warm", 10))], IngestConfig(), tmp_path / "warm" / "01_ingest", workers=2)
    small, small_docs = host_peak(tmp_path / "small", 1_000)
    large, large_docs = host_peak(tmp_path / "large", 8_000)
    assert (small_docs, large_docs) == (FILES * 980, FILES * 7_840)
    # per record the old host held 24 B of int64s plus a Python list of them while cutting (> 750 KB at 32k records)
    print(f"host traced peak: {small} B at {FILES} x 1,000 records, {large} B at {FILES} x 8,000")
    assert large - small < 100_000, (small, large)
