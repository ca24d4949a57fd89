"""The data report's parts that a small sample run cannot show: a rule's values stay bounded however many
sources and documents reached it (and still add up to the exact count), and recorded edits are highlighted."""
from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
from conftest import publish_docs

from flows import data_report
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
