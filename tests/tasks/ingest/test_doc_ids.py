"""Ids are unique across files and snapshots (issue 45, part 1): the same URL and text at the same line of two
snapshot files are two documents, exact dedup keeps one of them, and `hymo audit why` finds a document by
HyMo id, by the source's own id or by URL."""
from __future__ import annotations

import json
from pathlib import Path

from conftest import PROSE, write_spec

from manifests.audit_query import decisions_for, find_documents
from manifests.sources import load_spec_file
from tasks.dedup.exact import DedupExactConfig, run_dedup_exact
from tasks.dedup.fuzzy import DedupFuzzyConfig, run_dedup_fuzzy
from tasks.ingest.ingest import IngestConfig, run_ingest
from tasks.runner.stage_runner import read_stage_audit, read_stage_docs

URL = "https://example.org/mill"
SHARED = " ".join(PROSE)


def two_snapshots(root: Path) -> Path:
    """One source, two crawl snapshots whose first lines are the same page (same URL, same text)."""
    for snapshot, extra in (("CC-2024-10", PROSE[0] + " Spring."), ("CC-2024-18", PROSE[1] + " Autumn.")):
        folder = root / "crawl" / snapshot
        folder.mkdir(parents=True)
        lines = [{"id": f"{snapshot}/0", "url": URL, "text": SHARED}, {"id": f"{snapshot}/1", "url": f"{URL}/{snapshot}", "text": extra * 4}]
        (folder / "part-000.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return write_spec(root, "crawl", "jsonl", "crawl")


def test_same_url_and_text_at_the_same_line_of_two_files_are_two_documents(tmp_path: Path) -> None:
    spec = load_spec_file(two_snapshots(tmp_path))
    for name, shard_docs in (("one_shard", 100), ("shard_per_doc", 1)):
        manifest = run_ingest([spec], IngestConfig(docs_per_shard=shard_docs), tmp_path / name / "01_ingest", workers=1)
        docs = read_stage_docs(manifest.directory)
        ids = docs.column("id").to_pylist()
        assert len(ids) == 4 and len(set(ids)) == 4, ids
        metas = [json.loads(m) for m in docs.column("meta").to_pylist()]
        assert sorted(m["record_id"] for m in metas) == ["CC-2024-10/0", "CC-2024-10/1", "CC-2024-18/0", "CC-2024-18/1"]
        exact = run_dedup_exact(DedupExactConfig(), manifest.directory, tmp_path / name / "02_dedup_exact", workers=1)
        kept = read_stage_docs(exact.directory).column("url").to_pylist()
        assert kept.count(URL) == 1 and len(kept) == 3
        removed = read_stage_audit(exact.directory).to_pylist()
        assert len(removed) == 1 and json.loads(removed[0]["detail"])["kept_id"] != removed[0]["id"]


def test_fuzzy_dedup_never_keeps_a_document_in_favour_of_itself(tmp_path: Path) -> None:
    manifest = run_ingest([load_spec_file(two_snapshots(tmp_path))], IngestConfig(docs_per_shard=1), tmp_path / "01_ingest", workers=1)
    fuzzy = run_dedup_fuzzy(DedupFuzzyConfig(), manifest.directory, tmp_path / "02_dedup_fuzzy", workers=1)
    removed = read_stage_audit(fuzzy.directory).to_pylist()
    assert len(removed) == 1, removed
    detail = json.loads(removed[0]["detail"])
    assert detail["kept_id"] != removed[0]["id"] and detail["matched_id"] != removed[0]["id"]
    assert removed[0]["id"] not in read_stage_docs(fuzzy.directory).column("id").to_pylist()


def test_audit_why_finds_a_document_by_id_by_its_own_id_and_by_url(tmp_path: Path, capsys) -> None:
    spec = load_spec_file(two_snapshots(tmp_path))
    run = tmp_path / "run"
    ingest = run_ingest([spec], IngestConfig(docs_per_shard=1), run / "01_ingest", workers=1)
    run_dedup_exact(DedupExactConfig(), ingest.directory, run / "02_dedup_exact", workers=1)
    by_url = find_documents(run, URL)
    assert len(by_url) == 2 and {m["file"] for m in by_url} == {"CC-2024-10/part-000.jsonl", "CC-2024-18/part-000.jsonl"}
    by_own = find_documents(run, "CC-2024-18/0")
    assert len(by_own) == 1 and by_own[0]["file"] == "CC-2024-18/part-000.jsonl" and by_own[0]["url"] == URL
    assert find_documents(run, by_own[0]["id"]) == [{"id": by_own[0]["id"], "shard": by_own[0]["shard"]}]  # the shard its own id names too
    finals = sorted(decisions_for(run, match["id"])["final"] for match in by_url)
    assert finals == ["kept", "removed at dedup_exact (exact_duplicate)"]
    assert find_documents(run, "https://nowhere.example/") == []
    from flows.cli import main

    capsys.readouterr()
    assert main(["audit", "why", str(run), URL]) == 0
    listed = capsys.readouterr().out
    assert "2 documents match" in listed and all(m["id"] in listed for m in by_url)
    assert main(["audit", "why", str(run), "CC-2024-18/0"]) == 0
    assert by_own[0]["id"] in capsys.readouterr().out
    assert main(["audit", "why", str(run), "https://nowhere.example/"]) == 1


def test_a_duplicate_id_is_named_with_its_urls_and_files() -> None:
    import pytest

    from manifests.schema import AUDIT_SCHEMA, docs_table
    from tasks.runner.stage_runner import AccountingError, check_accounting

    rows = [{"id": "crawl-0000000000000001", "text": "t", "source": "crawl", "url": URL, "meta": {"origin_file": f"{snapshot}/part-000.jsonl"}}
            for snapshot in ("CC-2024-10", "CC-2024-18")]
    with pytest.raises(AccountingError, match=r"duplicate ids among kept documents: crawl-0000000000000001 \(https://example.org/mill in "
                                              r"CC-2024-10/part-000.jsonl; https://example.org/mill in CC-2024-18/part-000.jsonl\)"):
        check_accounting("part-00000", None, docs_table(rows), AUDIT_SCHEMA.empty_table())
