"""corpus.json keeps every ingested source (issue 45, part 6): one whose every document was removed before
training still has its row, with its licence, its removal counts and zero documents and tokens."""
from __future__ import annotations

import json
from pathlib import Path

from manifests.stage_manifest import read_manifest
from tasks.corpus.mixture import TABLE_FILE, plan_parts
from tasks.corpus.shards import corpus_sources, documents_by_source


def test_a_source_with_no_surviving_document_keeps_its_row(tiny_run: Path) -> None:
    mixture = json.loads((tiny_run / "06_mixture" / TABLE_FILE).read_text(encoding="utf-8"))
    assert sorted(row["name"] for row in mixture["sources"]) == ["mixed", "prose"]
    without_mixed = {**mixture, "sources": [row for row in mixture["sources"] if row["name"] == "prose"]}  # as if filters removed all of it
    rows = corpus_sources(tiny_run / "04_split", {"prose": 40}, without_mixed, {}, {})
    assert [row["source"] for row in rows] == ["prose", "mixed"]
    mixed = rows[1]
    assert mixed["license"] == "CC0-1.0" and mixed["snapshot"] == "2026-11-29" and mixed["documents_ingested"] == 41
    assert (mixed["train_documents"], mixed["train_unique_tokens"], mixed["tokens_contributed"], mixed["weight"]) == (0, 0, 0, 0.0)
    assert set(mixed) == set(rows[0])


def test_the_flow_host_reads_no_audit_or_data_file_for_the_source_counts(tiny_run: Path, monkeypatch) -> None:
    """The per-source counts of corpus.json come from runner tasks, one per ingest or audit file: the flow host sums
    their rows and reads no file's ids (it read every audit log of the run, serially, before: O(N) on one process)."""
    import manifests.corpus as corpus

    mixture = json.loads((tiny_run / "06_mixture" / TABLE_FILE).read_text(encoding="utf-8"))
    serial = corpus_sources(tiny_run / "04_split", {"prose": 40}, mixture, {}, {}, workers=1)
    assert any(row["filters"] for row in serial) and all(row["documents_ingested"] for row in serial)
    parts = plan_parts(read_manifest(tiny_run / "06_mixture")) * 2  # one part here; a single job would run on the host
    kept = documents_by_source(parts, workers=1)
    assert sum(kept.values()) > 0
    read: list[str] = []
    real_read_table = corpus.pq.read_table

    def counting(path, *args, **kwargs):
        read.append(Path(path).name)
        return real_read_table(path, *args, **kwargs)

    monkeypatch.setattr(corpus.pq, "read_table", counting)  # this process only: the spawned workers import their own
    assert corpus_sources(tiny_run / "04_split", {"prose": 40}, mixture, {}, {}, workers=2) == serial
    assert documents_by_source(parts, workers=2) == kept
    assert read == []  # (read_table is pyarrow.parquet's: a plan part read on the host would be counted too)
