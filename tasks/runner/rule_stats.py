"""Each rule's statistic on the documents that reached it, kept as a bounded sample a report can plot.

A removing rule's audit row holds its statistic only for the documents it removed; a histogram with
its threshold line, and a "what if the threshold moved" count, need the statistic of the documents it
kept too. A stage that measures (quality) hands one row per (document, rule reached) to the runner,
which keeps, per shard and per (rule, source), the SAMPLE_PER_GROUP rows of smallest `rank` (a hash of
the document id) and the exact number of documents that reached the rule (`reached`).

Bottom-k by a hash is a sample that merges: the SAMPLE_PER_GROUP smallest ranks over every shard's
sample are the SAMPLE_PER_GROUP smallest of the whole run, a uniform sample of its documents, the same
on every re-run and every layout of workers. So a shard's stats file has at most
SAMPLE_PER_GROUP x rules x sources rows, and a reader holds no more than that per (rule, source).
"""
from __future__ import annotations

import hashlib
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SAMPLE_PER_GROUP = 1000  # documents per (rule, source) kept in a shard's stats file, and in a run's merged sample

STATS_SCHEMA = pa.schema([
    ("rule", pa.string()),
    ("source", pa.string()),
    ("id", pa.string()),
    ("rank", pa.uint64()),  # doc_rank(id): the sample's order
    ("value", pa.float64()),  # the rule's statistic (for the n-gram duplicate rules, possibly the upper bound that kept it)
    ("threshold", pa.float64()),  # the threshold in effect for this document (its profile's)
    ("fired", pa.bool_()),  # the rule failed: removed the document, or flagged it when report-only
    ("fires_when", pa.string()),  # "<" / "<=" (fires below the threshold), ">" / ">=" (above), "" (value == threshold: not told)
    ("profile", pa.string()),
    ("reached", pa.int64()),  # documents of this source that reached this rule in this shard (exact, not sampled)
])


def doc_rank(doc_id: str) -> int:
    """A 64-bit hash of the id: the same document has the same rank in every shard, run and stage."""
    return int.from_bytes(hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest(), "big")


def fires_when(fired: bool, value: float, threshold: float) -> str:
    if value == threshold:
        return ""
    return "<" if (value < threshold) == fired else ">"


def bottom_k(table: pa.Table, k: int) -> pa.Table:
    """The k rows of smallest rank per (rule, source); ties (one id twice) broken by id, so bytes are stable."""
    if table.num_rows == 0:
        return table
    order = pc.sort_indices(table, sort_keys=[("rule", "ascending"), ("source", "ascending"), ("rank", "ascending"), ("id", "ascending")])
    ordered = table.take(order)
    rules = ordered.column("rule").to_numpy(zero_copy_only=False)
    sources = ordered.column("source").to_numpy(zero_copy_only=False)
    starts = np.ones(len(rules), dtype=bool)
    starts[1:] = (rules[1:] != rules[:-1]) | (sources[1:] != sources[:-1])
    group_start = np.maximum.accumulate(np.where(starts, np.arange(len(rules)), 0))
    keep = (np.arange(len(rules)) - group_start) < k
    return ordered.filter(pa.array(keep))


class ShardStats:
    """What a shard's batches measured: exact reach counts, and the bottom-k sample, trimmed after every batch."""

    def __init__(self, k: int | None = None) -> None:
        self.k, self.reached, self.sample = k or SAMPLE_PER_GROUP, Counter(), None

    def add(self, rows: pa.Table) -> None:
        for group in rows.group_by(["rule", "source"]).aggregate([("id", "count")]).to_pylist():
            self.reached[(group["rule"], group["source"])] += group["id_count"]
        merged = rows if self.sample is None else pa.concat_tables([self.sample, rows])
        self.sample = bottom_k(merged.select([f.name for f in STATS_SCHEMA if f.name != "reached"]), self.k)

    def table(self) -> pa.Table | None:
        if self.sample is None:
            return None
        reached = [self.reached[(rule, source)] for rule, source in zip(self.sample.column("rule").to_pylist(), self.sample.column("source").to_pylist())]
        return self.sample.append_column("reached", pa.array(reached, pa.int64())).cast(STATS_SCHEMA)


def stats_rows(columns: dict[str, list]) -> pa.Table:
    """The rows a stage function returns (every field of STATS_SCHEMA but `reached`), from column lists."""
    schema = pa.schema([f for f in STATS_SCHEMA if f.name != "reached"])
    return pa.Table.from_pydict(columns, schema=schema)
