"""The data report's parts that a small sample run cannot show: a rule's values stay bounded however many
sources and documents reached it (and still add up to the exact count), and recorded edits are highlighted."""
from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from conftest import publish_docs

from flows import data_report
from manifests.audit_query import decisions_for_many
from manifests.schema import docs_table
from manifests.stage_manifest import read_manifest
from tasks.runner.rule_stats import ShardStats, doc_rank, stats_rows
from tasks.runner.stage_runner import StageWriter, read_stage_docs, write_shard_files


def quality_stage(previous: Path, out: Path, sources: int, per_source: int, shards: int) -> None:
    """A quality stage whose stats say `sources` x `per_source` documents reached gopher_too_few_words (values 0..99)."""
    rng = random.Random(0)
    writer = StageWriter("quality", "test", {"min_words": 50}, "stand-in", [{"stage_dir": previous.name, "digest": read_manifest(previous).digest}], out)
    docs = read_stage_docs(previous).to_pylist()
    for shard in range(shards):
        stats = ShardStats()
        ids = [f"s{s}-{shard}-{i}" for s in range(sources) for i in range(per_source // shards)]
        values = [float(rng.randrange(100)) for _ in ids]
        stats.add(stats_rows({"rule": ["gopher_too_few_words"] * len(ids), "source": [i.split("-")[0] for i in ids], "id": ids,
                              "rank": [doc_rank(i) for i in ids], "value": values, "threshold": [50.0] * len(ids),
                              "fired": [v < 50 for v in values], "fires_when": ["<"] * len(ids), "profile": ["web"] * len(ids)}))
        part = docs[shard::shards]
        writer.add_result(write_shard_files(writer.work_dir, "quality", f"part-{shard:05d}", docs_table(part), [],
                                            pa.array([d["id"] for d in part]), stats.table()))
    writer.publish()


def test_a_rules_values_are_bounded_and_scale_to_the_exact_count(tmp_path: Path) -> None:
    run = tmp_path / "run"
    publish_docs(run / "01_ingest", {f"d{i}": "text" for i in range(4)})
    quality_stage(run / "01_ingest", run / "04_quality", sources=30, per_source=2000, shards=2)
    rules, _ = data_report.rule_distributions(run, data_report.document_stages(run))
    (rule,) = rules
    assert rule["reached"] == 30 * 2000 and rule["sampled"]
    values = sum(len(e["values"]) for e in rule["entries"])
    assert values <= data_report.VALUES_PER_RULE
    assert len({e["source"] for e in rule["entries"]}) == data_report.MAX_SOURCES  # 19 apart, the others pooled
    assert round(sum(e["weight"] * len(e["values"]) for e in rule["entries"])) == 30 * 2000
    assert rule["controls"][0]["key"] == "quality.min_words"


def test_recorded_edits_are_highlighted_in_the_text_the_stage_read(tmp_path: Path) -> None:
    run = tmp_path / "run"
    text = "Write to jane@example.org today."
    ingest = publish_docs(run / "01_ingest", {"a": text, "b": "plain"})
    writer = StageWriter("pii", "test", {}, "stand-in", [{"stage_dir": "01_ingest", "digest": read_manifest(ingest).digest}], run / "06_pii")
    docs = read_stage_docs(ingest).to_pylist()
    docs[0]["text"] = text.replace("jane@example.org", "<EMAIL>")
    writer.write_shard(0, docs_table(docs), [{"id": "a", "action": "modified", "rule": "pii_email_masked", "value": 1, "threshold": None,
                                              "detail": {"kind": "email", "count": 1, "edits": [[9, 25, "email"]], "edits_total": 1}}])
    writer.publish()
    (shown,) = data_report.modification_examples(run, data_report.document_stages(run))
    assert shown["recorded_edits"] and shown["spans"] == [[9, 25, "email"]]
    assert shown["text"][9:25] == "jane@example.org"


def two_stage_run(run: Path, shards: int, per_shard: int = 40) -> Path:
    """ingest with `shards` shards of `per_shard` documents, then a stage that removes every third document."""
    ingest = publish_docs(run / "01_ingest", {f"d{i:05d}": f"text {i}" for i in range(shards * per_shard)}, shards=shards)
    writer = StageWriter("quality", "test", {}, f"q-{shards}", [{"stage_dir": "01_ingest", "digest": read_manifest(ingest).digest}], run / "02_quality")
    for shard in range(shards):
        docs = pq.read_table(ingest / "data" / f"part-{shard:05d}.parquet").to_pylist()
        writer.write_shard(shard, docs_table([d for i, d in enumerate(docs) if i % 3]), [
            {"id": d["id"], "action": "removed", "rule": "too_short", "value": 2.0, "threshold": 3.0, "detail": {}} for i, d in enumerate(docs) if i % 3 == 0],
            pa.array([d["id"] for d in docs]))
    writer.publish()
    return run


def test_the_search_reads_the_same_rows_when_the_run_has_8x_the_shards(tmp_path: Path, monkeypatch) -> None:
    """At 8x the documents (8x the shards of the same size), the search reads the same number of Parquet rows and the
    page keeps its size: it reads SEARCH_SHARDS shards' files, never every audit log (it did: 8x the rows)."""
    monkeypatch.setattr(data_report, "SEARCH_DOCS", 60)
    monkeypatch.setattr(data_report, "SEARCH_SHARDS", 2, raising=False)  # raising=False: the test also runs on the code before it
    read_rows = []
    original = pq.read_table

    def counted(*args, **kwargs):
        table = original(*args, **kwargs)
        read_rows.append(table.num_rows)
        return table

    measured, answers = {}, {}
    for shards in (4, 32):
        run = two_stage_run(tmp_path / f"run{shards}", shards)
        stages = data_report.document_stages(run)
        read_rows.clear()
        with monkeypatch.context() as patch:
            patch.setattr(pq, "read_table", counted)
            answers[shards] = data_report.searchable(run, stages, {"d00005": f"part-{5 % shards:05d}"}, [])  # round-robin shards
        measured[shards] = sum(read_rows)
    assert measured[32] == measured[4], measured
    for shards, (entries, note) in answers.items():
        assert len(entries) == 60 and "hymo audit why" in note and f"in {shards} shards" in note
        assert "d00005" in {e["id"] for e in entries}  # a document the page shows is searchable
        full = decisions_for_many(tmp_path / f"run{shards}", [e["id"] for e in entries])
        assert all(entry["why"] == full[entry["id"]] for entry in entries)  # the same answer as `audit why`, which reads every file


def test_per_source_counts_come_from_corpus_json_without_reading_the_documents(tiny_run: Path, monkeypatch) -> None:
    """A run through shards: documents in and out per source are corpus.json's (counted by runner tasks), the same
    numbers as one source column of every ingest and last-stage file, which the page then does not read."""
    stages = data_report.document_stages(tiny_run)
    read = data_report.per_source(tiny_run, stages, corpus_current=False)
    monkeypatch.setattr(data_report, "ingested_by_source", None)  # calling it (a read of every ingest file) fails
    monkeypatch.setattr(data_report, "source_counts", None)
    assert data_report.per_source(tiny_run, stages, corpus_current=True) == read
    assert data_report.gather(tiny_run)["by_source"] == read


def test_a_stages_examples_sit_in_at_most_example_shards_shards_however_many_it_has(tmp_path: Path) -> None:
    """Each shard an example sits in is a read of its text: a uniform stats sample over 32 shards would name ~all of
    them, so the examples are chosen in the EXAMPLE_SHARDS shards that hold the most sampled rows."""
    run = tmp_path / "run"
    publish_docs(run / "01_ingest", {f"d{i}": "text" for i in range(64)}, shards=32)
    quality_stage(run / "01_ingest", run / "04_quality", sources=3, per_source=3200, shards=32)
    rules, example_shards = data_report.rule_distributions(run, data_report.document_stages(run))
    (rule,) = rules
    assert len(rule["examples"]) >= 2 * data_report.EXAMPLES_PER_SIDE
    assert 0 < len(set(example_shards.values())) <= data_report.EXAMPLE_SHARDS < 32
