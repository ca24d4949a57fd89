"""Each quality rule's statistic on the documents that reached it: exact reach counts, a bounded sample that merges."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from conftest import publish_docs

from tasks.filters import quality as q
from tasks.filters.quality_config import QualityConfig
from tasks.runner import rule_stats
from tasks.runner.rule_stats import bottom_k, doc_rank, stats_rows
from tasks.runner.stage_runner import read_stage_audit


def rows(ids: list[str], rule: str = "r", source: str = "s") -> pa.Table:
    n = len(ids)
    return stats_rows({"rule": [rule] * n, "source": [source] * n, "id": ids, "rank": [doc_rank(i) for i in ids], "value": [float(len(d)) for d in ids],
                       "threshold": [1.0] * n, "fired": [False] * n, "fires_when": ["<"] * n, "profile": ["web"] * n})


def test_bottom_k_of_shard_samples_is_the_bottom_k_of_the_whole() -> None:
    ids = [f"doc-{i}" for i in range(500)]
    whole = bottom_k(rows(ids), 50)
    shard_samples = [bottom_k(rows(ids[i::7]), 50) for i in range(7)]
    merged = bottom_k(pa.concat_tables(shard_samples), 50)
    assert merged.column("id").to_pylist() == whole.column("id").to_pylist()
    assert len(set(whole.column("id").to_pylist())) == 50
    assert whole.column("rank").to_pylist() == sorted(doc_rank(i) for i in ids)[:50]


def test_quality_records_every_reached_rule_with_exact_counts_and_a_bounded_sample(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(rule_stats, "SAMPLE_PER_GROUP", 5)
    sentence = "The river and the stone have a quiet reason to be with the garden."
    texts = {f"d{i:02d}": " ".join([sentence] * (1 + i % 8)) for i in range(30)}
    texts["empty"] = "   "
    upstream = publish_docs(tmp_path / "01_ingest", texts, shards=2)
    config = QualityConfig(min_words=40, c4_min_sentences=1)
    manifest = q.run_quality(config, upstream, tmp_path / "04_quality", workers=1)
    stats = pa.concat_tables([pq.read_table(manifest.path_of(f)) for f in manifest.files("stats")])
    assert len(manifest.files("stats")) == 2

    def reached(rule: str) -> int:  # summed over shards: one `reached` per (shard, rule, source)
        per_shard = {}
        for f in manifest.files("stats"):
            table = pq.read_table(manifest.path_of(f), filters=[("rule", "=", rule)])
            per_shard[f.path] = table.column("reached")[0].as_py() if table.num_rows else 0
        return sum(per_shard.values())

    assert reached("quality_empty_text") == 31  # every document
    assert reached("gopher_too_few_words") == 30  # all but the empty one
    audit = read_stage_audit(manifest.directory).to_pylist()
    too_few = [r for r in audit if r["rule"] == "gopher_too_few_words"]
    # documents of 13 words x 1..3 sentences (under 40) fail; the rest go on to the next rule
    assert reached("gopher_too_many_words") == 30 - len(too_few) == manifest.counts["in"] - 1 - len(too_few)
    sample = stats.filter(pa.compute.equal(stats.column("rule"), "gopher_too_few_words")).to_pylist()
    assert len(sample) == 10  # 5 a shard: bounded
    for row in sample:
        assert row["value"] == len(texts[row["id"]].split()) and row["threshold"] == 40 and row["fires_when"] == "<"
        assert row["fired"] == (row["value"] < 40)
