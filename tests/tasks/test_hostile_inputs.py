"""Hostile inputs found by trying HyMo as a new user would: mis-declared charsets, stray bytes,
control characters, pages that defeat trafilatura, symlinks, non-HTML WARC records."""
from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pyarrow as pa
from conftest import PROSE, page, write_spec

from manifests.schema import docs_table
from manifests.sources import load_spec_file
from tasks.ingest.decoding import CONTROL_TEXT, decode_payload, strip_controls
from tasks.ingest.extract import ExtractConfig, extract_shard
from tasks.ingest.extract_page import visible_text
from tasks.ingest.ingest import IngestConfig, run_ingest
from tasks.runner.stage_runner import read_stage_audit, read_stage_docs

FRENCH = "Le café était plein de monde ce matin-là ; Élodie a commandé une crème brûlée près de la fenêtre, à côté du piano."
RUSSIAN = "Река тихо текла мимо старой мельницы, где дочь мельника проводила каждое лето своего детства."


def utf8_declared(body: str) -> str:
    return page("Café", body).replace("<head>", '<head><meta charset="utf-8">')


def ingest_dir(tmp_path: Path, files: dict[str, bytes]) -> tuple[list[dict], list[dict]]:
    root = tmp_path / "html"
    root.mkdir()
    for name, payload in files.items():
        (root / name).write_bytes(payload)
    manifest = run_ingest([load_spec_file(write_spec(tmp_path, "h", "html_dir", "html", glob="*.html"))], IngestConfig(), tmp_path / "01_ingest")
    audit = read_stage_audit(manifest.directory).to_pylist()
    for row in audit:
        row["detail"] = json.loads(row["detail"])
    return read_stage_docs(manifest.directory).to_pylist(), audit


def test_latin1_page_declared_utf8_is_read_as_cp1252_not_a_baltic_code_page() -> None:
    decoded = decode_payload(utf8_declared(FRENCH).encode("latin-1"))
    assert (decoded.encoding, decoded.method) == ("cp1252", "latin")
    assert FRENCH in decoded.text and 0 < decoded.confidence <= 1


def test_utf8_page_with_two_invalid_bytes_stays_utf8_with_replacement() -> None:
    payload = utf8_declared(FRENCH + " " + RUSSIAN).encode("utf-8")
    middle = len(payload) // 2
    broken = payload[:middle] + b"\xff" + payload[middle:middle + 40] + b"\xfe" + payload[middle + 40:]
    decoded = decode_payload(broken)
    assert (decoded.encoding, decoded.method) == ("utf-8", "utf-8-replace")
    assert decoded.text.count("\ufffd") == 2 and RUSSIAN[:20] in decoded.text or FRENCH[:20] in decoded.text
    assert 0.99 <= decoded.confidence < 1.0


def test_declared_charset_wins_over_guessing_and_undeclared_cyrillic_is_detected() -> None:
    declared = page("Река", RUSSIAN).replace("<head>", '<head><meta http-equiv="Content-Type" content="text/html; charset=koi8-r">')
    decoded = decode_payload(declared.encode("koi8-r"))
    assert (decoded.encoding, decoded.method) == ("koi8-r", "declared") and RUSSIAN in decoded.text
    header = decode_payload(page("Река", RUSSIAN).encode("cp1251"), header_charset="text/html; charset=windows-1251")
    assert (header.encoding, header.method) == ("cp1251", "declared")
    detected = decode_payload(page("Река", RUSSIAN).encode("cp1251"))
    assert detected.method == "detected" and RUSSIAN in detected.text


def test_binary_by_magic_or_control_share_but_not_for_a_few_controls() -> None:
    assert decode_payload(b"\x89PNG\r\n\x1a\n" + b"<html>" * 100).detail == "magic:png"
    assert decode_payload(bytes(range(256)) * 40).problem == "binary"
    text_with_nul = page("NUL", PROSE[0]).encode().replace(b"river", b"ri\x00ver", 1)
    assert decode_payload(text_with_nul).problem is None
    cleaned, removed = strip_controls("a\x00b\x1b[31mred\x1b[0m\tc\r\n\x07d")
    assert (cleaned, removed) == ("abred\tc\r\nd", 11)
    for code in range(0x80):  # each control alone, past the pre-scan that lets clean text skip the regex
        text = f"ab{chr(code)}cd"
        assert strip_controls(text) == (CONTROL_TEXT.sub("", text), len(text) - len(CONTROL_TEXT.sub("", text))), code


def test_ingest_audits_the_encoding_choice_and_strips_controls_as_a_modification(tmp_path: Path) -> None:
    docs, audit = ingest_dir(tmp_path, {
        "latin1.html": utf8_declared(FRENCH).encode("latin-1"),
        "controls.html": page("Terminal", PROSE[1]).replace("village", "vil\x00lage \x1b[1mbold\x1b[0m").encode(),
        "image.html": b"GIF89a" + bytes(range(256)) * 4,
    })
    by_rule = {row["rule"]: row for row in audit}
    assert by_rule["ingest_encoding_guessed"]["action"] == "modified"
    assert by_rule["ingest_encoding_guessed"]["detail"]["encoding"] == "cp1252" and by_rule["ingest_encoding_guessed"]["detail"]["method"] == "latin"
    assert by_rule["ingest_control_chars_removed"]["action"] == "modified" and by_rule["ingest_control_chars_removed"]["value"] == 9
    assert by_rule["ingest_binary"]["action"] == "removed" and by_rule["ingest_binary"]["detail"]["why"] == "magic:gif"
    texts = {json.loads(d["meta"])["origin_file"]: d["text"] for d in docs}
    assert FRENCH in texts["latin1.html"] and "village bold" in texts["controls.html"]


def test_symlinks_are_followed_once_and_unreadable_ones_are_audited(tmp_path: Path) -> None:
    root = tmp_path / "html"
    (root / "real").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    for i in range(2):
        (root / "real" / f"p{i}.html").write_text(page(f"P{i}", PROSE[i]), encoding="utf-8")
    (tmp_path / "elsewhere" / "far.html").write_text(page("Far", PROSE[2]), encoding="utf-8")
    os.symlink(tmp_path / "elsewhere", root / "linked")  # a directory link: walked
    os.symlink(root / "real" / "p0.html", root / "alias.html")  # a second path to a file: read once, audited
    os.symlink(tmp_path / "missing.html", root / "dangling.html")  # points nowhere: audited
    os.symlink(root, root / "real" / "loop")  # a loop: not walked twice
    manifest = run_ingest([load_spec_file(write_spec(tmp_path, "h", "html_dir", "html", glob="**/*.html"))], IngestConfig(), tmp_path / "out")
    docs = read_stage_docs(manifest.directory)
    files = sorted(json.loads(m)["origin_file"] for m in docs.column("meta").to_pylist())
    assert files == ["alias.html", "linked/far.html", "real/p1.html"]
    skipped = {json.loads(r["detail"])["file"]: json.loads(r["detail"])["reason"] for r in read_stage_audit(manifest.directory).to_pylist()
               if r["rule"] == "ingest_symlink_skipped"}
    assert skipped == {"dangling.html": "dangling_symlink", "real/p0.html": "same_file_already_read", "real/loop": "link_to_walked_directory"}
    assert manifest.counts["in"] == manifest.counts["kept"] + sum(manifest.counts["removed"].values())


def test_non_html_warc_records_are_audited_with_their_content_type(tmp_path: Path) -> None:
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    buffer = io.BytesIO()
    writer = WARCWriter(buffer, gzip=True)
    records = [("https://s/page", "text/html; charset=windows-1251", page("Река", RUSSIAN).encode("cp1251")),
               ("https://s/logo.png", "image/png", b"\x89PNG\r\n\x1a\n" + bytes(200)),
               ("https://s/doc.pdf", "application/pdf", b"%PDF-1.4 ...")]
    for uri, mime, payload in records:
        headers = StatusAndHeaders("200 OK", [("Content-Type", mime)], protocol="HTTP/1.1")
        writer.write_record(writer.create_warc_record(uri, "response", payload=io.BytesIO(payload), http_headers=headers))
    (tmp_path / "crawl.warc.gz").write_bytes(buffer.getvalue())
    manifest = run_ingest([load_spec_file(write_spec(tmp_path, "w", "warc", "crawl.warc.gz"))], IngestConfig(), tmp_path / "out")
    docs = read_stage_docs(manifest.directory).to_pylist()
    assert [d["url"] for d in docs] == ["https://s/page"] and RUSSIAN in docs[0]["text"]
    not_html = {json.loads(r["detail"])["uri"]: json.loads(r["detail"])["content_type"] for r in read_stage_audit(manifest.directory).to_pylist() if r["rule"] == "ingest_not_html"}
    assert not_html == {"https://s/logo.png": "image/png", "https://s/doc.pdf": "application/pdf"}


def test_page_trafilatura_returns_nothing_from_falls_back_and_says_which_path() -> None:
    words = " ".join(PROSE * 6).split()[:400]
    unclosed = "<!DOCTYPE html><html><head><title>Mill</title><style>p{color:red}</style></head><body><p>" + "<b><span>" * 1500 + " ".join(words) + "</p></body></html>"
    assert len(visible_text(unclosed).split()) == 400
    rows = [
        {"id": "unclosed", "text": unclosed, "source": "t", "url": "https://t/u", "meta": {"content_type": "html"}},
        {"id": "good", "text": page("Mill", PROSE[0] + "\n" + PROSE[1]), "source": "t", "url": "https://t/g", "meta": {"content_type": "html"}},
        {"id": "no-body", "text": "<html><head><title>x</title></head><body><div></div></body></html>", "source": "t", "url": "https://t/n", "meta": {"content_type": "html"}},
    ]
    outcome = extract_shard(docs_table(rows), ExtractConfig(), None)
    kept = dict(zip(outcome.kept.column("id").to_pylist(), outcome.kept.column("text").to_pylist()))
    assert len(kept["unclosed"].split()) == 400 and "color" not in kept["unclosed"]
    paths = {r["id"]: r["detail"]["extractor"] for r in outcome.audit if r["rule"] == "html_main_text"}
    assert paths == {"unclosed": "html_parser", "good": "trafilatura"}
    assert {r["id"]: r["rule"] for r in outcome.audit if r["action"] == "removed"} == {"no-body": "extract_empty"}
    off = extract_shard(docs_table(rows[:1]), ExtractConfig(fallback_min_words=0), None)
    assert off.kept.num_rows == 0 and isinstance(off.audit[0], dict) and off.audit[0]["rule"] == "extract_empty"
    assert pa.types.is_string(outcome.kept.schema.field("text").type)
