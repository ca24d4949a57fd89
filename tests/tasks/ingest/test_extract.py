"""Extraction on real pages and on every kind of bad page; the watchdog that bounds each page."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from conftest import SAMPLE, page, write_spec

from manifests.schema import docs_table
from manifests.sources import load_spec_file
from tasks.ingest.extract import ExtractConfig, extract_shard, repair_mojibake, run_extract
from tasks.ingest.ingest import IngestConfig, run_ingest
from tasks.runner.stage_runner import read_stage_audit, read_stage_docs
from tasks.ingest.watchdog import ERROR, OK, TIMEOUT, SupervisedPool, map_with_deadline
from watchdog_items import pid_of, sleepy


def html_doc(doc_id: str, html: str) -> dict:
    return {"id": doc_id, "text": html, "source": "t", "url": f"https://t/{doc_id}", "meta": {"content_type": "html"}}


def test_real_docs_page_keeps_body_text_and_drops_navigation(tmp_path: Path) -> None:
    (tmp_path / "pages").mkdir()
    for name in ("atexit.html", "codeop.html"):
        (tmp_path / "pages" / name).write_bytes((SAMPLE / "python-docs" / "library" / name).read_bytes())
    spec = write_spec(tmp_path, "docs", "html_dir", "pages", glob="*.html", url_prefix="https://docs.python.org/3.11/library/")
    ingested = run_ingest([load_spec_file(spec)], IngestConfig(), tmp_path / "01_ingest")
    run_extract(ExtractConfig(), ingested.directory, tmp_path / "02_extract", workers=1)
    texts = dict(zip(read_stage_docs(tmp_path / "02_extract").column("url").to_pylist(), read_stage_docs(tmp_path / "02_extract").column("text").to_pylist()))
    atexit = texts["https://docs.python.org/3.11/library/atexit.html"]
    assert "functions registered via this module are not called when the" in atexit
    for navigation in ("Previous topic", "Quick search", "Report a Bug", "Table of Contents"):
        assert navigation not in atexit
    audit = read_stage_audit(tmp_path / "02_extract").to_pylist()
    assert {r["rule"] for r in audit} == {"html_main_text"} and len(audit) == 2


def test_each_bad_page_gets_a_rule_and_the_shard_goes_on() -> None:
    nested = "<html><body>" + "<div>" * 50_000 + "deep text " * 50 + "</div>" * 50_000 + "</body></html>"
    docs = docs_table([
        html_doc("good", page("Mill", "The river ran quietly past the old mill where the miller worked every single day of the year.")),
        html_doc("not-html", "just a line of plain text that somebody saved with an .html name"),
        html_doc("no-body", "<html><head><title>x</title></head><body><div></div></body></html>"),
        html_doc("huge", "<html><body>" + "<p>word " * 4_000_000 + "</body></html>"),
        html_doc("nested", nested),
    ])
    outcome = extract_shard(docs, ExtractConfig(timeout_s=60), None)
    removed = {r["id"]: r["rule"] for r in outcome.audit if r["action"] == "removed"}
    assert removed["not-html"] == "extract_not_html"
    assert removed["no-body"] == "extract_empty"
    assert removed["huge"] == "extract_too_large"
    assert "good" in outcome.kept.column("id").to_pylist()
    # The pathological page either yields text or is quarantined with an extraction rule: never a crash.
    assert "nested" in outcome.kept.column("id").to_pylist() or removed["nested"].startswith("extract_")


def test_a_page_over_its_time_limit_is_killed_and_logged() -> None:
    big = html_doc("slow", "<html><body>" + "<p>many words in a paragraph here</p>" * 300_000 + "</body></html>")
    quick = html_doc("quick", page("Quick", "A short page that extracts in milliseconds, long before the limit."))
    outcome = extract_shard(docs_table([big, quick]), ExtractConfig(timeout_s=5.0, max_html_bytes=50 << 20), None)
    rules = {r["id"]: r for r in outcome.audit}
    assert rules["slow"]["rule"] == "extract_timeout" and rules["slow"]["action"] == "removed"
    assert outcome.kept.column("id").to_pylist() == ["quick"]


def test_mojibake_repair_skipping_ascii_lines_equals_ftfy_on_the_whole_text() -> None:
    """ASCII lines skip ftfy; every other line still gets ftfy's fix, so the result is ftfy's on the whole text."""
    import random

    import ftfy

    from tasks.ingest.mojibake import mojibake_config

    pieces = ["sÃ³ ", "voilÃ le ", "“", "”", "» ", "© ", "├─│", "± ", "§", "Â ", "× ²", "œ.", "Ã\xa0", "â€œquotedâ€\x9d ", "\ufffd", "\x85", "caf\xe9 ", "Ã©tÃ© ", "\x1a", "naïve ", "日本語",
              "ï¿½", "\n", "\r\n", "\r", "plain ascii words ", "&amp; ", "\x1b[31m"]
    rng = random.Random(7)
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 40))) for _ in range(3000)]
    texts += ["only ascii\nlines here\n", "", "\n\n", "mixed\nsÃ³\nascii again"]
    changed = 0
    for text in texts:
        expected = ftfy.fix_text(text, config=mojibake_config())
        assert repair_mojibake(text) == expected, repr(text)
        changed += expected != text
    assert changed > 1000  # the texts do exercise the repairs


def test_mojibake_fast_test_answers_as_ftfy_on_characters_its_regex_names() -> None:
    """The trigger scan and the windowed regex give ftfy's answer: lines built from the very characters ftfy's
    badness branches name (so near-misses and hits are both common), plus clean non-ASCII prose."""
    import random

    import ftfy

    from ftfy.badness import is_bad

    from tasks.ingest.mojibake import badness_triggers, mojibake_config, needs_ftfy

    triggers, _, _ = badness_triggers()
    named = [chr(c) for c in range(0x80, 0x3000) if triggers.match(chr(c))]
    others = list("abc XYZ.,?!-1 é ü ñ ß ç") + ["\t", "°", "²", "œ", "Ø", "В", "Γ", "€", "™"]
    rng = random.Random(11)
    lines = ["".join(rng.choice(named if rng.random() < 0.4 else others) for _ in range(rng.randint(1, 12))) for _ in range(20000)]
    lines += ["He said “fine” — and left.", "© 2024 Café » Menü", "├── src │", "x × ² y", "naïve résumé", "sÃ³ x"]
    flagged = 0
    for line in lines:
        changed = ftfy.fix_text(line, config=mojibake_config()) != line
        fast = needs_ftfy(line)
        assert fast or not changed, repr(line)  # a line the fast test skips is one ftfy leaves alone
        flagged += fast
        assert fast == (is_bad(line) or any(0x80 <= ord(c) < 0xA0 or 0xD800 <= ord(c) < 0xE000 for c in line)), repr(line)
    assert 1000 < flagged < len(lines) - 1000  # both answers are exercised
    assert not any(needs_ftfy(t) for t in ["He said “fine” — and left.", "© 2024 Café » Menü", "├── src │", "naïve résumé"])


def test_mojibake_windows_reach_back_to_where_a_match_can_start() -> None:
    """A badness match may start up to the longest branch's width before the character the scan finds: lines drawn
    from every character any branch's classes name (not only the trigger set) put those early starts in play, so a
    window that starts too late misses matches ftfy's regex finds."""
    import random
    import re._parser as parser

    from ftfy.badness import BADNESS_RE, is_bad

    from tasks.ingest.mojibake import _class_chars, needs_ftfy

    tree = parser.parse(BADNESS_RE.pattern, BADNESS_RE.flags)
    alphabet = sorted({chr(c) for branch in tree[0][1][1] for item in branch for c in (_class_chars(item) or ()) if c < 0x3000})
    rng = random.Random(5)
    lines = ["".join(rng.choice(alphabet) for _ in range(rng.randint(2, 10))) for _ in range(30000)]
    bad = 0
    for line in lines:
        expected = is_bad(line) or any(0x80 <= ord(c) < 0xA0 or 0xD800 <= ord(c) < 0xE000 for c in line)
        assert needs_ftfy(line) == expected, repr(line)
        bad += expected
    assert 0 < bad < len(lines)


def test_mojibake_is_repaired_and_logged_without_touching_quotes() -> None:
    broken = "The meeting â€” as planned â€” started at noon. He said “fine” and left."
    assert repair_mojibake(broken) == "The meeting — as planned — started at noon. He said “fine” and left."
    docs = docs_table([{"id": "m", "text": broken, "source": "t", "url": "u", "meta": {"content_type": "text"}}])
    outcome = extract_shard(docs, ExtractConfig(), None)
    assert [r["rule"] for r in outcome.audit] == ["mojibake_repaired"]
    assert outcome.audit[0]["detail"]["after"].startswith("eeting —") or "—" in outcome.audit[0]["detail"]["after"]


def test_watchdog_kills_a_hung_item_and_continues() -> None:
    started = time.monotonic()
    results = map_with_deadline(sleepy, [1, 2, 3, 4, 5], timeout_s=1.0)
    assert results[0] == (OK, 10) and results[2] == (OK, 30) and results[4] == (OK, 50)
    assert results[1] == (TIMEOUT, None)
    assert results[3][0] == ERROR and "bad item" in results[3][1]
    assert time.monotonic() - started < 55  # the 60 s sleep was cut short, not waited out


def test_parallel_children_keep_item_order_and_isolate_a_hang() -> None:
    results = map_with_deadline(sleepy, [1, 2, 3, 4, 5, 6, 7], timeout_s=2.0, workers=2)
    assert [r[0] for r in results] == [OK, TIMEOUT, OK, ERROR, OK, OK, OK]
    assert [r[1] for r in results if r[0] == OK] == [10, 30, 50, 60, 70]


def test_pool_children_serve_every_map_and_a_hung_one_is_replaced() -> None:
    with SupervisedPool(pid_of, timeout_s=2.0, workers=2) as pool:
        assert all(status == OK for status, _ in pool.map([1, 1, 1, 1]))
        children = {c.process.pid for c in pool.children}
        answered = {pid for _, pid in pool.map([1, 1, 1, 1])}
        assert len(children) == 2 and answered <= children  # no restart between maps (one per shard in a stage)
        assert {c.process.pid for c in pool.children} == children
        assert pool.map([2, 1, 1])[0] == (TIMEOUT, None)
        assert all(status == OK for status, _ in pool.map([1, 1]))  # tops the pool up again
        survivors = {c.process.pid for c in pool.children}
        assert len(survivors) == 2 and len(survivors & children) == 1  # the hung child was killed and replaced
    assert pool.children == []


def text_records_ingested(tmp_path: Path, records: list[dict]) -> Path:
    (tmp_path / "jsonl").mkdir()
    (tmp_path / "jsonl" / "docs.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    spec = write_spec(tmp_path, "notes", "jsonl", "jsonl", glob="*.jsonl")
    return run_ingest([load_spec_file(spec)], IngestConfig(docs_per_shard=2), tmp_path / "01_ingest").directory


def test_text_records_only_are_repaired_shard_by_shard_on_the_workers_without_page_children(tmp_path: Path, monkeypatch) -> None:
    """No page in the input: no extraction children start, and the shards go to the worker pool (their repair is the
    work) with the same result as the shared-pool path."""
    import tasks.ingest.extract as extract
    from tasks.ingest.extract import any_html

    broken = "The meeting \u00e2\u0080\u0094 as planned \u00e2\u0080\u0094 started at noon."
    ingested = text_records_ingested(tmp_path, [{"text": broken, "id": "a"}, {"text": "plain words", "id": "b"},
                                                {"text": "caf\u00c3\u00a9 au lait", "id": "c"}, {"text": "more", "id": "d"}])
    assert not any_html(ingested)
    started: list[int] = []
    real_run_stage = extract.run_stage
    monkeypatch.setattr(extract, "extraction_pool", lambda *a, **k: (_ for _ in ()).throw(AssertionError("page children started")))
    monkeypatch.setattr(extract, "run_stage", lambda stage, config, i, o, workers=None: started.append(workers) or real_run_stage(stage, config, i, o, workers))
    run_extract(ExtractConfig(), ingested, tmp_path / "02_extract", workers=2)
    assert started == [2]
    texts = dict(zip(read_stage_docs(tmp_path / "02_extract").column("id").to_pylist(), read_stage_docs(tmp_path / "02_extract").column("text").to_pylist()))
    assert sorted(texts.values()) == sorted([repair_mojibake(broken), "plain words", "café au lait", "more"])
    assert sorted(r["rule"] for r in read_stage_audit(tmp_path / "02_extract").to_pylist()) == ["mojibake_repaired"] * 2


def test_one_page_among_text_records_keeps_the_shared_page_children(tmp_path: Path) -> None:
    from tasks.ingest.extract import any_html

    records = [{"text": "plain words", "id": "a"}, {"text": "more", "id": "b"},
               {"text": page("Mill", "The river ran quietly past the old mill where the miller worked every day."), "id": "c", "content_type": "html"}]
    assert any_html(text_records_ingested(tmp_path, records))


def test_mojibake_repair_records_the_repaired_spans_of_its_input() -> None:
    """Issue 56: the row says which characters the repair changed, as offsets into the text it read."""
    broken = "Intro line stays.\nThe meeting â€” as planned â€” started at noon.\nLast line stays."
    docs = docs_table([{"id": "m", "text": broken, "source": "t", "url": "u", "meta": {"content_type": "text"}}])
    (row,) = extract_shard(docs, ExtractConfig(), None).audit
    assert [(broken[start:end], label) for start, end, label in row["detail"]["edits"]] == [("â€”", "mojibake"), ("â€”", "mojibake")]


def test_a_text_shard_is_repaired_on_its_column_as_the_row_path_repairs_it(monkeypatch) -> None:
    """Issue 57: a shard without a page keeps its table and sends to ftfy's line test only the texts holding a character
    some mojibake pattern needs; its documents and audit rows equal the row-by-row path's (forced here by one page)."""
    import pyarrow.compute as pc

    import tasks.ingest.extract as extract

    texts = {"a": "The meeting \u00e2\u0080\u0094 as planned.\nSecond line.", "b": "plain words", "c": "caf\u00c3\u00a9 au lait",
             "d": "caf\u00e9 au lait, na\u00efve", "e": "\u6570\u636e\u6e05\u6d17", "f": "Ã\u0080 la carte"}
    rows = [{"id": k, "text": v, "source": "t", "url": f"u/{k}", "meta": {"content_type": "text", "n": i}} for i, (k, v) in enumerate(texts.items())]
    reached: list[str] = []
    real = extract.repair_mojibake
    monkeypatch.setattr(extract, "repair_mojibake", lambda text: reached.append(text) or real(text))
    column = extract_shard(docs_table(rows), ExtractConfig(), None)
    suspects = sorted(reached)
    assert "plain words" not in suspects and texts["e"] not in suspects  # ASCII, and CJK: no mojibake trigger
    assert texts["a"] in suspects and texts["c"] in suspects

    page_row = {"id": "p", "text": page("Mill", "The river ran quietly past the old mill where the miller worked every day."),
                "source": "t", "url": "u/p", "meta": {"content_type": "html"}}
    by_rows = extract_shard(docs_table(rows + [page_row]), ExtractConfig(), None, children=1)
    kept = by_rows.kept.filter(pc.not_equal(by_rows.kept.column("id"), "p"))
    assert column.kept.equals(kept)
    assert column.audit == [r for r in by_rows.audit if r["id"] != "p"]
    ids = [r["id"] for r in column.audit]
    assert ids == sorted(ids) and {"a", "c"} <= set(ids) and not {"b", "e"} & set(ids)
