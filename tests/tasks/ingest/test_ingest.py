"""Ingestion: every source kind, stable ids, bounded shards, and each kind of bad input."""
from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import PROSE, page, write_spec

from manifests.sources import load_spec_file
from manifests.stage_manifest import StageNotComplete, read_manifest
from tasks.ingest.ingest import IngestConfig, InputFileError, make_doc_id, run_ingest
from tasks.runner.stage_runner import read_stage_audit, read_stage_docs


def ingest(tmp_path: Path, specs: list[Path], out: str = "01_ingest", **config) -> tuple[pa.Table, pa.Table]:
    manifest = run_ingest([load_spec_file(s) for s in specs], IngestConfig(**config), tmp_path / out)
    return read_stage_docs(manifest.directory), read_stage_audit(manifest.directory)


def audit_rules(audit: pa.Table) -> dict[str, str]:
    return {row["rule"]: json.loads(row["detail"]) for row in audit.to_pylist()}


def test_ids_are_stable_across_runs_and_shard_sizes(tmp_path: Path, html_dir: Path) -> None:
    spec = write_spec(tmp_path, "pages", "html_dir", str(html_dir), glob="*.html", url_prefix="https://example.org/")
    one, _ = ingest(tmp_path, [spec], "run_a", docs_per_shard=100)
    two, _ = ingest(tmp_path, [spec], "run_b", docs_per_shard=2)
    assert one.column("id").to_pylist() == two.column("id").to_pylist()
    assert len(read_manifest(tmp_path / "run_b").files("data")) == 3
    assert one.column("id")[0].as_py() == make_doc_id("pages", "2026-11-29", "page0.html", "https://example.org/page0.html", 0)


def test_outputs_load_with_hugging_face_datasets(tmp_path: Path, html_dir: Path) -> None:
    import datasets

    spec = write_spec(tmp_path, "pages", "html_dir", str(html_dir), glob="*.html")
    manifest = run_ingest([load_spec_file(spec)], IngestConfig(docs_per_shard=4), tmp_path / "01_ingest")
    files = [str(manifest.path_of(f)) for f in manifest.files("data")]
    loaded = datasets.load_dataset("parquet", data_files=files, split="train")
    assert loaded.num_rows == 6
    assert set(loaded.column_names) == {"id", "text", "source", "url", "lang", "lang_score", "meta"}


def test_jsonl_malformed_line_is_quarantined_and_the_rest_kept(tmp_path: Path) -> None:
    lines = [json.dumps({"text": PROSE[0], "url": "https://a/1"}), "{not json", json.dumps({"txt": "wrong field"}), json.dumps({"text": PROSE[1], "meta": {"label": "clean"}})]
    (tmp_path / "docs.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    docs, audit = ingest(tmp_path, [write_spec(tmp_path, "js", "jsonl", "docs.jsonl")])
    assert docs.num_rows == 2
    rows = audit.to_pylist()
    assert [r["rule"] for r in rows] == ["ingest_malformed_record", "ingest_malformed_record"]
    assert "line 2" in json.loads(rows[0]["detail"])["error"] and "docs.jsonl" in json.loads(rows[0]["detail"])["file"]
    assert json.loads(docs.column("meta")[1].as_py())["label"] == "clean"


def test_empty_binary_and_invalid_utf8_files(tmp_path: Path) -> None:
    root = tmp_path / "html"
    root.mkdir()
    (root / "empty.html").write_bytes(b"")
    (root / "binary.html").write_bytes(bytes(range(256)) * 40)
    (root / "latin1.html").write_bytes(page("Caf\xe9", "Le caf\xe9 \xe9tait plein de monde ce matin-l\xe0, et personne ne parlait.").encode("latin-1"))
    docs, audit = ingest(tmp_path, [write_spec(tmp_path, "h", "html_dir", "html", glob="*.html")])
    rules = {r["rule"]: r for r in audit.to_pylist()}
    assert set(rules) == {"ingest_empty", "ingest_binary", "ingest_encoding_guessed"}
    assert rules["ingest_encoding_guessed"]["action"] == "modified"
    assert docs.num_rows == 1 and "café était" in docs.column("text")[0].as_py()


def test_duplicate_input_paths_are_read_once(tmp_path: Path, html_dir: Path) -> None:
    spec_a = write_spec(tmp_path, "pages", "html_dir", str(html_dir), glob="*.html")
    spec_b = write_spec(tmp_path, "same-pages", "html_dir", str(html_dir), glob="*.html")
    manifest = run_ingest([load_spec_file(spec_a), load_spec_file(spec_a), load_spec_file(spec_b)], IngestConfig(), tmp_path / "out")
    assert manifest.counts["in"] == 6
    assert len(manifest.extra["skipped_duplicate_inputs"]) == 7  # the source named twice + 6 files seen already


def test_parquet_text_dir_and_hf_disk_sources(tmp_path: Path) -> None:
    import datasets

    pq.write_table(pa.table({"text": [PROSE[0], None, PROSE[2]], "url": ["https://p/0", "https://p/1", None]}), tmp_path / "p.parquet")
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_text(PROSE[1], encoding="utf-8")
    datasets.Dataset.from_dict({"text": PROSE}).save_to_disk(str(tmp_path / "hf"))
    specs = [
        write_spec(tmp_path, "pq", "parquet", "p.parquet"),
        write_spec(tmp_path, "tx", "text_dir", "texts", glob="*.txt"),
        write_spec(tmp_path, "hf", "hf_disk", "hf"),
    ]
    docs, audit = ingest(tmp_path, specs)
    assert docs.column("source").to_pylist() == ["pq", "pq", "tx", "hf", "hf", "hf"]
    assert audit.column("rule").to_pylist() == ["ingest_malformed_record"]
    assert docs.column("url")[1].as_py().endswith("p.parquet#row2")


def warc_bytes(pages: list[tuple[str, str]]) -> bytes:
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    buffer = io.BytesIO()
    writer = WARCWriter(buffer, gzip=True)
    for uri, html in pages:
        headers = StatusAndHeaders("200 OK", [("Content-Type", "text/html; charset=utf-8")], protocol="HTTP/1.1")
        writer.write_record(writer.create_warc_record(uri, "response", payload=io.BytesIO(html.encode()), http_headers=headers))
    return buffer.getvalue()


def test_warc_records_become_html_documents(tmp_path: Path) -> None:
    (tmp_path / "crawl.warc.gz").write_bytes(warc_bytes([(f"https://site/{i}", page(f"P{i}", PROSE[i])) for i in range(3)]))
    docs, _ = ingest(tmp_path, [write_spec(tmp_path, "w", "warc", "crawl.warc.gz")])
    assert docs.column("url").to_pylist() == ["https://site/0", "https://site/1", "https://site/2"]
    assert all(json.loads(m)["content_type"] == "html" for m in docs.column("meta").to_pylist())


def test_truncated_gzip_warc_fails_the_stage_naming_the_file(tmp_path: Path) -> None:
    payload = warc_bytes([(f"https://site/{i}", page(f"P{i}", PROSE[i % 3] * 20)) for i in range(6)])
    (tmp_path / "broken.warc.gz").write_bytes(payload[: len(payload) * 2 // 3])
    with pytest.raises(InputFileError, match="broken.warc.gz"):
        ingest(tmp_path, [write_spec(tmp_path, "w", "warc", "broken.warc.gz")])
    with pytest.raises(StageNotComplete):
        read_manifest(tmp_path / "01_ingest")
    assert not list(tmp_path.glob(".01_ingest*"))


def test_truncated_gzip_jsonl_and_unreadable_parquet_fail_the_stage(tmp_path: Path) -> None:
    blob = gzip.compress(("\n".join(json.dumps({"text": p * 30}) for p in PROSE * 20)).encode())
    (tmp_path / "cut.jsonl.gz").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(InputFileError, match="cut.jsonl.gz"):
        ingest(tmp_path, [write_spec(tmp_path, "j", "jsonl", "cut.jsonl.gz")])
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(InputFileError, match="bad.parquet"):
        ingest(tmp_path, [write_spec(tmp_path, "p", "parquet", "bad.parquet")])


def test_missing_source_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="does not exist"):
        ingest(tmp_path, [write_spec(tmp_path, "gone", "html_dir", "nowhere")])


def test_a_large_jsonl_file_read_as_byte_ranges_gives_the_same_bytes(tmp_path: Path, monkeypatch) -> None:
    """Ranges cut mid-line, blank and malformed lines, no final newline: ids (line numbers) and shards as one pass gives."""
    import tasks.ingest.ingest as ingest_module

    lines = ['{"text": "first document here"}', "", "   ", "not json", '{"text": "after blanks", "url": "https://x.org/1"}',
             '{"text": 3}', '{"text": "long ' + "word " * 40 + '"}'] * 6 + ['{"text": "no final newline"}']
    (tmp_path / "big.jsonl").write_text("\n".join(lines))
    specs = [load_spec_file(write_spec(tmp_path, "big", "jsonl", str(tmp_path / "big.jsonl")))]
    whole = run_ingest(specs, IngestConfig(docs_per_shard=5), tmp_path / "whole", workers=1)
    for split, workers in ((9, 1), (64, 2), (1000, 2)):
        monkeypatch.setattr(ingest_module, "JSONL_SPLIT_BYTES", split)
        ranged = run_ingest(specs, IngestConfig(docs_per_shard=5), tmp_path / f"ranges-{split}", workers=workers)
        assert [(o.path, o.sha256) for o in ranged.outputs] == [(o.path, o.sha256) for o in whole.outputs]
    assert whole.counts["kept"] == 19 and whole.counts["removed"] == {"ingest_malformed_record": 12}


def test_shards_are_cut_by_utf8_text_bytes_with_a_document_cap(tmp_path: Path) -> None:
    """Default: ~128 MB of text per shard plus a document cap; the byte count is UTF-8 (a Han character is 3 bytes)."""
    assert (IngestConfig().bytes_per_shard, IngestConfig().docs_per_shard) == (128_000_000, 100_000)
    rows = [{"url": f"https://zh.example/{i}", "text": "数据" * 250} for i in range(7)]  # 500 characters, 1,500 bytes each
    (tmp_path / "zh.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    spec = write_spec(tmp_path, "zh", "jsonl", "zh.jsonl")
    by_bytes = run_ingest([load_spec_file(spec)], IngestConfig(bytes_per_shard=3000), tmp_path / "by_bytes")
    assert [f.rows for f in by_bytes.files("data")] == [2, 2, 2, 1]  # 1,000 characters would have allowed 6 a shard
    by_docs = run_ingest([load_spec_file(spec)], IngestConfig(bytes_per_shard=10**9, docs_per_shard=3), tmp_path / "by_docs")
    assert [f.rows for f in by_docs.files("data")] == [3, 3, 1]
    again = run_ingest([load_spec_file(spec)], IngestConfig(bytes_per_shard=3000), tmp_path / "again")
    assert [f.sha256 for f in again.files("data")] == [f.sha256 for f in by_bytes.files("data")]  # same config, same bytes


def test_guessed_encoding_and_removed_controls_record_their_spans(tmp_path: Path) -> None:
    """Issue 56: the characters a guessed codec decided, and the control characters stripped, as offsets into the
    decoded text; an empty record's row has its statistic and threshold."""
    root = tmp_path / "txt"
    root.mkdir()
    (root / "latin1.txt").write_bytes("Le café était plein\x07 ce matin-là.".encode("latin-1"))
    (root / "blank.txt").write_bytes(b"  \n ")
    docs, audit = ingest(tmp_path, [write_spec(tmp_path, "t", "text_dir", "txt", glob="*.txt")])
    decoded = "Le café était plein\x07 ce matin-là."
    rows = {r["rule"]: r for r in audit.to_pylist()}
    guessed = json.loads(rows["ingest_encoding_guessed"]["detail"])["edits"]
    assert [decoded[start:end] for start, end, _ in guessed] == ["é", "é", "à"] and {label for *_, label in guessed} == {"cp1252"}
    controls = json.loads(rows["ingest_control_chars_removed"]["detail"])["edits"]
    assert [(decoded[start:end], label) for start, end, label in controls] == [("\x07", "control_chars")]
    assert (rows["ingest_empty"]["value"], rows["ingest_empty"]["threshold"]) == (0, 1)
