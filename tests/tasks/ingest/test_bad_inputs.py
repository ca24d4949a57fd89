"""The bad-input table (docs/reliability.md, issue 55): every truncated, mislabelled, empty or broken input is
named or audited, never lost.

Each case is one source folder holding a good file and a bad one, ingested by the stage function under both
`[ingest] on_bad_file` settings. A bad *file* (its container did not end, its first bytes contradict its name,
most of its records are broken) fails "fail" in one line naming it, before anything is published, and under
"quarantine" is left out with one `ingest_bad_file` row carrying its path. A bad *record* (one line that is
not JSON, one line of invalid UTF-8) and an empty file are audited with their path under both settings.
Either way the good file's documents all arrive and the stage's counts close: in = kept + removed.
"""
from __future__ import annotations

import gzip
import io
import json
import random
import zlib
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from conftest import PROSE, page, write_spec

from manifests.sources import load_spec_file
from manifests.stage_manifest import StageNotComplete, read_manifest
from tasks.ingest.ingest import BadInputFiles, IngestConfig, InputFileError, run_ingest
from tasks.runner.stage_runner import read_stage_audit, read_stage_docs

WORDS = "river stone cloud maple ocean tiger piano lemon garden winter summer letter window number".split()


def jsonl(n: int, seed: int = 0, words: int = 40) -> bytes:
    rng = random.Random(seed)  # varied words: a zstd frame of it spans several 128 KiB blocks
    return "".join(json.dumps({"url": f"https://b/{i}", "text": " ".join(rng.choice(WORDS) for _ in range(words))}) + "\n"
                   for i in range(n)).encode()


def cut(blob: bytes) -> bytes:
    return blob[: len(blob) // 2]  # a download that stopped half-way


def gzip_member_ends(blob: bytes) -> set[int]:
    ends, data = set(), blob
    while data:
        member = zlib.decompressobj(31)
        member.decompress(data)
        ends.add(len(blob) - len(member.unused_data))
        data = member.unused_data
    return ends


def cut_inside_a_record(blob: bytes) -> bytes:
    """Half-way, moved off a gzip member's end: a record-per-member .warc.gz cut exactly between two records is a
    complete WARC of fewer records (nothing in the format counts them), so no reader can tell. The records' random
    ids and dates made the half-way point land there about once in eight runs."""
    at = len(blob) // 2
    return blob[: at - 16 if at in gzip_member_ends(blob) else at]


def warc(n: int, compress: bool) -> bytes:
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    buffer = io.BytesIO()
    writer = WARCWriter(buffer, gzip=compress)
    for i in range(n):
        headers = StatusAndHeaders("200 OK", [("Content-Type", "text/html; charset=utf-8")], protocol="HTTP/1.1")
        body = page(f"Page {i}", PROSE[i % len(PROSE)] * 20).encode()
        writer.write_record(writer.create_warc_record(f"https://w/{i}", "response", payload=io.BytesIO(body), http_headers=headers))
    return buffer.getvalue()


def parquet(rows: int) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table({"text": [f"{PROSE[i % len(PROSE)]} row {i}" for i in range(rows)], "url": [f"https://p/{i}" for i in range(rows)]}), sink)
    return sink.getvalue()


def zstd_one_block() -> bytes:
    blob = zstandard.ZstdCompressor().compress(jsonl(20))
    assert len(jsonl(20)) < 128 << 10  # one block
    return cut(blob)


def zstd_many_blocks() -> bytes:
    raw = jsonl(2000)
    assert len(raw) > 4 * (128 << 10)  # several blocks in one frame
    return cut(zstandard.ZstdCompressor().compress(raw))


def plain_warc_cut_mid_record() -> bytes:
    blob = warc(4, compress=False)
    last = blob.rfind(b"WARC/1.")  # the last record's header, then half its body
    return blob[: last + (len(blob) - last) // 2]


def plain_warc_cut_in_headers(keep: int) -> bytes:
    blob = warc(4, compress=False)
    return blob[: blob.rfind(b"WARC/1.") + keep]  # warcio ends there quietly: the last record never shows


# kind, good file (name, bytes, documents it gives), bad file name, bad bytes
GOOD = {
    "jsonl": ("a-good.jsonl", jsonl(5, seed=1), 5),
    "warc": ("a-good.warc.gz", warc(3, compress=True), 3),
    "html_dir": ("a-good.html", page("Good", PROSE[0] * 3).encode(), 1),
    "parquet": ("a-good.parquet", parquet(4), 4),
}
BAD_FILES: dict[str, tuple[str, str, Callable[[], bytes], str]] = {
    "truncated gz": ("jsonl", "b.jsonl.gz", lambda: cut(gzip.compress(jsonl(200))), "truncated"),
    "truncated zst, one block": ("jsonl", "b.jsonl.zst", zstd_one_block, "truncated"),
    "truncated zst, many blocks": ("jsonl", "b.jsonl.zst", zstd_many_blocks, "truncated"),
    "truncated warc.gz": ("warc", "b.warc.gz", lambda: cut_inside_a_record(warc(6, compress=True)), "truncated"),
    "plain warc cut mid-record": ("warc", "b.warc", plain_warc_cut_mid_record, "short of its Content-Length"),
    "plain warc cut inside a record's headers": ("warc", "b.warc", lambda: plain_warc_cut_in_headers(60), "truncated WARC"),
    "plain warc cut inside its first header line": ("warc", "b.warc", lambda: warc(2, compress=False)[:10], "truncated WARC"),
    "gzip named .jsonl": ("jsonl", "b.jsonl", lambda: gzip.compress(jsonl(20)), "gzip data in a file named b.jsonl"),
    "zstd named .jsonl": ("jsonl", "b.jsonl", lambda: zstandard.ZstdCompressor().compress(jsonl(20)), "zstd data in a file named b.jsonl"),
    "binary named .jsonl": ("jsonl", "b.jsonl", lambda: random.Random(3).randbytes(4096), "binary content"),
    "gzip named .html": ("html_dir", "b.html", lambda: gzip.compress(page("Zipped", PROSE[1]).encode()), "gzip data in a file named b.html"),
    "zstd named .html": ("html_dir", "b.html", lambda: zstandard.ZstdCompressor().compress(page("Z", PROSE[1]).encode()), "zstd data"),
    "parquet without its footer": ("parquet", "b.parquet", lambda: parquet(4)[:-12], "unreadable Parquet"),
    "csv named .jsonl": ("jsonl", "b.jsonl", lambda: b"url,text\n" + b"".join(b"https://c/%d,some text\n" % i for i in range(9)), "max_malformed_share"),
}


def source(root: Path, kind: str, bad_name: str, bad_bytes: bytes) -> Path:
    folder = root / "src"
    folder.mkdir(parents=True)
    good_name, good_bytes, _ = GOOD[kind]
    (folder / good_name).write_bytes(good_bytes)
    (folder / bad_name).write_bytes(bad_bytes)
    return write_spec(root, "src", kind, "src", **({"glob": "*"} if kind in ("jsonl", "warc") else {}))


def closes(manifest) -> None:
    counts = manifest.counts
    assert counts["in"] == counts["kept"] + sum(counts["removed"].values()), counts


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_a_bad_file_fails_the_stage_naming_it(case: str, tmp_path: Path) -> None:
    kind, name, make, reason = BAD_FILES[case]
    spec = load_spec_file(source(tmp_path, kind, name, make()))
    with pytest.raises(BadInputFiles) as error:
        run_ingest([spec], IngestConfig(), tmp_path / "run" / "01_ingest", workers=1)
    message = str(error.value)
    assert message.startswith("1 input file cannot be read, nothing was published: ") and "\n" not in message
    assert f"src/{name}:" in message and reason in message and "a-good" not in message
    with pytest.raises(StageNotComplete):
        read_manifest(tmp_path / "run" / "01_ingest")


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_a_bad_file_is_quarantined_with_its_path(case: str, tmp_path: Path) -> None:
    kind, name, make, reason = BAD_FILES[case]
    spec = load_spec_file(source(tmp_path, kind, name, make()))
    manifest = run_ingest([spec], IngestConfig(on_bad_file="quarantine"), tmp_path / "run" / "01_ingest", workers=1)
    closes(manifest)
    docs = read_stage_docs(manifest.directory).column("meta").to_pylist()
    assert [json.loads(m)["origin_file"] for m in docs] == [GOOD[kind][0]] * GOOD[kind][2]  # every good document, none of the bad file
    rows = [r for r in read_stage_audit(manifest.directory).to_pylist() if r["rule"] == "ingest_bad_file"]
    assert len(rows) == 1 and json.loads(rows[0]["detail"])["file"] == name and reason in json.loads(rows[0]["detail"])["reason"]
    assert manifest.counts["removed"]["ingest_bad_file"] == 1


# Audited, never a bad file: the run goes on under either setting. (name, bytes, rule, what the row's detail holds)
AUDITED: dict[str, tuple[str, str, bytes, str, dict]] = {
    "empty file": ("jsonl", "b.jsonl", b"", "ingest_empty_file", {"file": "b.jsonl"}),
    "empty .jsonl.gz": ("jsonl", "b.jsonl.gz", gzip.compress(b""), "ingest_empty_file", {"file": "b.jsonl.gz"}),
    "a line that is not JSON": ("jsonl", "b.jsonl", jsonl(3, seed=2) + b"{not json\n" + jsonl(3, seed=3), "ingest_malformed_record",
                                {"file": "b.jsonl", "ordinal": 4}),
    "a line of invalid UTF-8": ("jsonl", "b.jsonl", jsonl(3, seed=2) + b'{"text": "caf\xe9 cr\xe8me"}\n' + jsonl(3, seed=3),
                                "ingest_malformed_record", {"file": "b.jsonl", "ordinal": 4}),
    "an image named .html": ("html_dir", "b.html", b"\x89PNG\r\n\x1a\n" + bytes(200), "ingest_binary", {"file": "b.html"}),
}


@pytest.mark.parametrize("on_bad_file", ["fail", "quarantine"])
@pytest.mark.parametrize("case", list(AUDITED))
def test_an_empty_file_or_a_bad_record_is_audited_with_its_path(case: str, on_bad_file: str, tmp_path: Path) -> None:
    kind, name, blob, rule, where = AUDITED[case]
    spec = load_spec_file(source(tmp_path, kind, name, blob))
    manifest = run_ingest([spec], IngestConfig(on_bad_file=on_bad_file), tmp_path / "run" / "01_ingest", workers=1)
    closes(manifest)
    origins = [json.loads(m)["origin_file"] for m in read_stage_docs(manifest.directory).column("meta").to_pylist()]
    assert origins[: GOOD[kind][2]] == [GOOD[kind][0]] * GOOD[kind][2]
    rows = [json.loads(r["detail"]) for r in read_stage_audit(manifest.directory).to_pylist() if r["rule"] == rule]
    assert len(rows) == 1 and {k: rows[0][k] for k in where} == where, rows
    assert manifest.counts["removed"][rule] == 1


def test_invalid_utf8_in_a_page_is_kept_and_its_guess_audited(tmp_path: Path) -> None:
    spec = load_spec_file(source(tmp_path, "html_dir", "b.html", page("Latin", "Une crème brûlée, un café, et voilà.").encode("cp1252")))
    manifest = run_ingest([spec], IngestConfig(), tmp_path / "run" / "01_ingest", workers=1)
    closes(manifest)
    assert manifest.counts["kept"] == 2
    rows = [json.loads(r["detail"]) for r in read_stage_audit(manifest.directory).to_pylist() if r["rule"] == "ingest_encoding_guessed"]
    assert [r["file"] for r in rows] == ["b.html"]


def test_one_bad_line_among_many_stays_a_record_and_a_mostly_bad_split_file_is_a_bad_file(tmp_path: Path, monkeypatch) -> None:
    """Errors are counted per file: a share, not a count, and over a split file's ranges together."""
    import tasks.ingest.ingest as ingest

    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "few.jsonl").write_bytes(jsonl(40, seed=4) + b"oops\n" + jsonl(40, seed=5))
    (folder / "mostly.jsonl").write_bytes(b"".join(b"line %d is prose, not JSON at all\n" % i for i in range(60)) + jsonl(20, seed=6))
    spec = load_spec_file(write_spec(tmp_path, "src", "jsonl", "src"))
    monkeypatch.setattr(ingest, "JSONL_SPLIT_BYTES", 1024)  # each file is read as several byte ranges
    manifest = run_ingest([spec], IngestConfig(on_bad_file="quarantine"), tmp_path / "run" / "01_ingest", workers=1)
    closes(manifest)
    assert manifest.counts["kept"] == 80 and manifest.counts["removed"] == {"ingest_malformed_record": 1, "ingest_bad_file": 1}
    rows = [json.loads(r["detail"]) for r in read_stage_audit(manifest.directory).to_pylist() if r["rule"] == "ingest_bad_file"]
    assert [r["file"] for r in rows] == ["mostly.jsonl"] and "60 of its 80 records are malformed" in rows[0]["reason"]


@pytest.mark.parametrize("on_bad_file", ["fail", "quarantine"])
def test_two_sources_with_one_name_are_refused(on_bad_file: str, tmp_path: Path) -> None:
    """A copied spec that kept `name = "forum"` would never be read; whatever on_bad_file says, that is an error."""
    for folder, text in (("one", PROSE[0]), ("two", PROSE[1])):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "f.jsonl").write_text(json.dumps({"text": text}) + "\n", encoding="utf-8")
    first = load_spec_file(write_spec(tmp_path / "one", "forum", "jsonl", "."))
    second = load_spec_file(write_spec(tmp_path / "two", "forum", "jsonl", "."))
    with pytest.raises(InputFileError, match="two different sources are named 'forum'") as error:
        run_ingest([first, second], IngestConfig(on_bad_file=on_bad_file), tmp_path / "run" / "01_ingest", workers=1)
    assert str(tmp_path / "one") in str(error.value) and str(tmp_path / "two") in str(error.value)
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


@pytest.mark.parametrize("on_bad_file", ["fail", "quarantine"])
def test_the_same_rule_reads_a_remote_source(on_bad_file: str, tmp_path: Path) -> None:
    """Through fsspec (memory://, as s3:// or gs://): a cut .zst and gzip named .jsonl are bad files there too."""
    import fsspec

    fs = fsspec.filesystem("memory")
    root = f"/i55-{on_bad_file}"
    fs.pipe(f"{root}/a-good.jsonl", jsonl(5, seed=1))
    fs.pipe(f"{root}/b.jsonl.zst", zstd_many_blocks())
    fs.pipe(f"{root}/c.jsonl", gzip.compress(jsonl(5)))
    spec = load_spec_file(write_spec(tmp_path, "remote", "jsonl", f"memory://{root}"))
    try:
        if on_bad_file == "fail":
            with pytest.raises(BadInputFiles, match=r"^2 input files cannot be read.*b\.jsonl\.zst: .*truncated.*c\.jsonl: gzip data"):
                run_ingest([spec], IngestConfig(), tmp_path / "run" / "01_ingest", workers=1)
            return
        manifest = run_ingest([spec], IngestConfig(on_bad_file="quarantine"), tmp_path / "run" / "01_ingest", workers=1)
        closes(manifest)
        assert manifest.counts["kept"] == 5 and manifest.counts["removed"] == {"ingest_bad_file": 2}
        rows = [json.loads(r["detail"]) for r in read_stage_audit(manifest.directory).to_pylist() if r["rule"] == "ingest_bad_file"]
        assert [r["file"] for r in rows] == ["b.jsonl.zst", "c.jsonl"]
    finally:
        fs.rm(root, recursive=True)
