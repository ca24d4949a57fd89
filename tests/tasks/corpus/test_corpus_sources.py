"""corpus.json keeps every ingested source (issue 45, part 6): one whose every document was removed before
training still has its row, with its licence, its removal counts and zero documents and tokens."""
from __future__ import annotations

import json
from pathlib import Path

from tasks.corpus.mixture import TABLE_FILE
from tasks.corpus.shards import corpus_sources


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
