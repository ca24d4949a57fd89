"""Audit sampling: rows per rule in audit order with the text they entered with, read from a few files, not the log."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

import manifests.audit_query as audit_query
from manifests.audit_query import sample_by_rule
from manifests.schema import DOC_SCHEMA
from tasks.runner.stage_runner import StageWriter

SHARDS, DOCS_PER_SHARD = 6, 40


def docs(ids: list[str]) -> pa.Table:
    n = len(ids)
    return pa.table({"id": ids, "text": [f"text of {i}" for i in ids], "source": ["test"] * n, "url": [f"test://{i}" for i in ids],
                     "lang": pa.nulls(n, pa.string()), "lang_score": pa.nulls(n, pa.float32()), "meta": ["{}"] * n}, schema=DOC_SCHEMA)


def filtered_run(run: Path) -> Path:
    """01_ingest with SHARDS shards; 02_quality removes every 4th document (rule short), every 10th too (rule long)."""
    ingest = StageWriter("ingest", "test", {}, "k-ingest", [], run / "01_ingest")
    quality = StageWriter("quality", "test", {}, "k-quality", [], run / "02_quality")
    for shard in range(SHARDS):
        ids = [f"d{shard}-{row:03d}" for row in range(DOCS_PER_SHARD)]
        ingest.write_shard(shard, docs(ids), [])
        gone = {i: ("short" if row % 4 == 0 else "long") for row, i in enumerate(ids) if row % 4 == 0 or row % 10 == 3}
        audit = [{"id": i, "stage": "quality", "action": "removed", "rule": rule, "value": 1.0, "threshold": 2.0, "detail": "{}"}
                 for i, rule in gone.items()]
        quality.write_shard(shard, docs([i for i in ids if i not in gone]), audit, pa.array(ids))
    ingest.publish()
    quality.publish()
    return run


def test_samples_rules_in_audit_order_with_their_text(tmp_path):
    run = filtered_run(tmp_path)
    rows = sample_by_rule(run, "quality", ["long", "short"], 3)
    assert [(r["rule"], r["id"]) for r in rows] == [("long", "d0-003"), ("long", "d0-013"), ("long", "d0-023"),
                                                     ("short", "d0-000"), ("short", "d0-004"), ("short", "d0-008")]
    assert all(r["snippet"] == f"text of {r['id']}" and r["detail"] == {} for r in rows)
    across = sample_by_rule(run, "quality", ["long"], 7)  # 4 a shard: the sample runs on into the next files
    assert [r["id"] for r in across] == ["d0-003", "d0-013", "d0-023", "d0-033", "d1-003", "d1-013", "d1-023"]
    assert [r["id"] for r in sample_by_rule(run, "quality", None, 2, with_text=False)] == ["d0-000", "d0-003"]


def test_a_sample_reads_the_files_it_needs_not_the_whole_log(tmp_path, monkeypatch):
    run = filtered_run(tmp_path)
    opened: list[str] = []
    real_read = pq.read_table

    def counting_read(path, *args, **kwargs):
        opened.append(Path(path).parent.name + "/" + Path(path).stem)
        return real_read(path, *args, **kwargs)

    real_file = pq.ParquetFile

    def counting_file(path, *args, **kwargs):
        opened.append(Path(path).parent.name + "/" + Path(path).stem + " (batches)")
        return real_file(path, *args, **kwargs)

    monkeypatch.setattr(audit_query.pq, "read_table", counting_read)
    monkeypatch.setattr(audit_query.pq, "ParquetFile", counting_file)
    sample_by_rule(run, "quality", ["long", "short"], 3)
    # one audit file (its rule column, then its rows) and the one upstream shard of the same name (ids, then texts in batches)
    assert opened == ["audit/part-00000", "audit/part-00000", "data/part-00000", "data/part-00000 (batches)"], opened
