"""`hymo audit show` (a document's text at a stage, its diff against the stage's input, the edits) and `hymo audit
sample` at 80 columns with its detail column (issue 56). No Prefect: the stages are published directly."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.cli import main
from flows.console import console
from manifests.schema import docs_table
from tasks.filters.quality import run_quality
from tasks.filters.quality_config import QualityConfig
from tasks.runner.stage_runner import StageWriter

def word(i: int) -> str:
    """The i-th distinct made-up word (no repeats: Gopher's repetition rules keep the prose)."""
    return "q" + "".join(chr(ord("a") + (i // 26 ** k) % 26) for k in range(4))


PROSE = "\n".join(" ".join(["The"] + [word(100 * i + j) for j in range(8)] + ["and", "the", word(100 * i + 50)]) + "." for i in range(12))
NOISY = PROSE.replace("\n", "\nMenu: Home.\n", 1) + "\nRead our privacy policy before you use this site today."


def doc(doc_id: str, text: str) -> dict:
    return {"id": doc_id, "text": text, "source": "t", "url": f"https://x.org/{doc_id}", "lang": "en", "lang_score": 0.9,
            "meta": {"profile": "web", "record_id": f"rec-{doc_id}"}}


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """ingest (with a malformed record and a quarantined file in its audit) then quality, published as a run."""
    writer = StageWriter("ingest", "test", {}, "key", [], tmp_path / "01_ingest")
    bad = [{"id": "t-bad-record", "action": "removed", "rule": "ingest_malformed_record",
            "detail": {"file": "crawl/part-0001.jsonl", "uri": "crawl/part-0001.jsonl#L7", "ordinal": 7, "error": "line 7: Expecting ',' delimiter"}},
           {"id": "t-bad-file", "action": "removed", "rule": "ingest_bad_file",
            "detail": {"file": "crawl/part-0002.jsonl.gz", "uri": "crawl/part-0002.jsonl.gz", "reason": "truncated gzip stream"}}]
    writer.write_shard(0, docs_table([doc("noisy", NOISY), doc("clean", PROSE)]), bad)
    writer.publish()
    run_quality(QualityConfig(), tmp_path / "01_ingest", tmp_path / "02_quality", workers=1)
    return tmp_path


def test_show_prints_the_text_at_a_stage_and_its_edits_found_by_url(run: Path, capsys) -> None:
    capsys.readouterr()
    assert main(["audit", "show", str(run), "https://x.org/noisy", "--stage", "quality"]) == 0
    out = capsys.readouterr().out
    assert "noisy at quality: modified" in out and "c4_lines_removed" in out
    assert "Menu: Home." in out.split("edits (")[1] and "Menu: Home." not in out.split("edits (")[0]  # listed as an edit, gone from the text
    assert "too_few_words" in out and "policy" in out


def test_show_diff_is_a_unified_diff_against_the_stage_input(run: Path, capsys) -> None:
    capsys.readouterr()
    assert main(["audit", "show", str(run), "rec-noisy", "--stage", "quality", "--diff", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["entered"] == NOISY and answer["previous_stage"] == "ingest"
    assert [line for line in answer["diff"] if line.startswith("-") and not line.startswith("---")] == [
        "-Menu: Home.", "-Read our privacy policy before you use this site today."]
    assert [(e["text"], e["label"]) for e in answer["edits"]] == [("Menu: Home.", "too_few_words"),
                                                                  ("Read our privacy policy before you use this site today.", "policy")]
    assert main(["audit", "show", str(run), "clean", "--stage", "quality", "--diff"]) == 0
    out = capsys.readouterr().out
    assert "clean at quality: kept unchanged" in out and "@@" not in out


def test_show_of_an_unknown_document_says_so_in_one_line(run: Path, capsys) -> None:
    capsys.readouterr()
    assert main(["audit", "show", str(run), "nowhere", "--stage", "quality"]) == 1
    assert capsys.readouterr().out == f"{run}: no document has the id, the source's own id or the URL 'nowhere'\n"


def test_sample_at_80_columns_is_one_block_per_row_with_the_file_and_reason(run: Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(console, "width", 80)
    capsys.readouterr()
    assert main(["audit", "sample", str(run), "--stage", "ingest"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 80
    assert "t-bad-record  removed ingest_malformed_record" in lines
    assert "  detail: file=crawl/part-0001.jsonl, error=line 7: Expecting ',' delimiter" in lines
    assert "  detail: file=crawl/part-0002.jsonl.gz, reason=truncated gzip stream" in lines
    assert main(["audit", "sample", str(run), "--stage", "quality"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 80 and sum(line.startswith("noisy  modified c4_lines_removed") for line in lines) == 1


def test_sample_in_a_wide_terminal_is_a_table_with_a_detail_column(run: Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(console, "width", 200)
    capsys.readouterr()
    assert main(["audit", "sample", str(run), "--stage", "ingest"]) == 0
    out = capsys.readouterr().out
    assert "detail" in out and "reason=truncated gzip stream" in out


@pytest.fixture
def opened(tmp_path: Path, monkeypatch) -> list[tuple[str, str, tuple]]:
    """A run of 8 shards (ingest, then quality) in tmp_path, and the (stage dir, shard, columns) of every Parquet read
    after it is built."""
    import pyarrow.parquet as pq

    ingest = StageWriter("ingest", "test", {}, "key", [], tmp_path / "01_ingest")
    for index in range(8):
        ingest.write_shard(index, docs_table([doc(f"s{index}-d{i}", PROSE if i else NOISY) for i in range(3)]), [])
    ingest.publish()
    run_quality(QualityConfig(), tmp_path / "01_ingest", tmp_path / "02_quality", workers=1)
    reads: list[tuple[str, str, tuple]] = []
    read_table, parquet_file = pq.read_table, pq.ParquetFile

    def counted_read(path, *args, **kwargs):
        reads.append((Path(path).parent.parent.name, Path(path).stem, tuple(kwargs.get("columns") or ())))
        return read_table(path, *args, **kwargs)

    def counted_file(path, *args, **kwargs):
        reads.append((Path(path).parent.parent.name, Path(path).stem, ("<streamed>",)))
        return parquet_file(path, *args, **kwargs)

    monkeypatch.setattr(pq, "read_table", counted_read)
    monkeypatch.setattr(pq, "ParquetFile", counted_file)
    return reads


def shards_read(reads: list[tuple[str, str, tuple]], stage_dir: str) -> set[str]:
    """The shards of a stage whose files were read beyond their id column (the id columns find the document)."""
    return {shard for stage, shard, columns in reads if stage == stage_dir and columns != ("id",)}


def test_show_reads_one_shard_of_the_stage_and_of_the_stage_before(tmp_path: Path, opened, capsys) -> None:
    """`audit show` reads the files of the document's shard only, at S and at the stage before (it read every shard of
    both: the reads grew with the corpus). Finding the shard reads id columns only."""
    capsys.readouterr()
    assert main(["audit", "show", str(tmp_path), "s5-d0", "--stage", "quality", "--diff", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["entered"] == NOISY and answer["decision"].startswith("modified")
    assert shards_read(opened, "02_quality") == shards_read(opened, "01_ingest") == {"part-00005"}, opened


def test_why_reads_one_shard_of_each_stage(tmp_path: Path, opened, capsys) -> None:
    capsys.readouterr()
    assert main(["audit", "why", str(tmp_path), "s6-d1", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["id"] == "s6-d1" and [step["stage"] for step in answer["stages"]] == ["ingest", "quality"]
    assert shards_read(opened, "02_quality") == shards_read(opened, "01_ingest") == {"part-00006"}, opened
