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


def group_codes(table: pa.Table) -> np.ndarray:
    """An int per row naming its (rule, source) group, in order of first appearance (Arrow does the hashing)."""
    keys = pc.binary_join_element_wise(table.column("rule"), table.column("source"), "\x1f")
    return pc.dictionary_encode(keys).combine_chunks().indices.to_numpy(zero_copy_only=False).astype(np.int64)


def smallest_per_group(codes: np.ndarray, ranks: np.ndarray, k: int) -> np.ndarray:
    """Row indices of the k smallest ranks of each group, grouped, each group by rank (numpy sorts: no per-row Python)."""
    order = np.lexsort((ranks, codes))
    sorted_codes = codes[order]
    starts = np.ones(len(order), dtype=bool)
    starts[1:] = sorted_codes[1:] != sorted_codes[:-1]
    group_start = np.maximum.accumulate(np.where(starts, np.arange(len(order)), 0))
    return order[(np.arange(len(order)) - group_start) < k]


def bottom_k(table: pa.Table, k: int) -> pa.Table:
    """The k rows of smallest rank per (rule, source)."""
    if table.num_rows == 0:
        return table
    ranks = table.column("rank").to_numpy()
    return table.take(pa.array(smallest_per_group(group_codes(table), ranks, k)))


class ShardStats:
    """What a shard's batches measured: exact reach counts, and the bottom-k sample, trimmed after every batch.

    Groups get a code that stays fixed for the shard (`keys`), so counting and trimming are numpy work on codes
    and ranks; the sample's rows keep their code."""

    def __init__(self, k: int | None = None) -> None:
        self.k = k or SAMPLE_PER_GROUP
        self.keys: dict[str, int] = {}
        self.reached = np.zeros(0, dtype=np.int64)
        self.sample: pa.Table | None = None
        self.codes = np.zeros(0, dtype=np.int64)

    def add(self, rows: pa.Table) -> None:
        joined = pc.binary_join_element_wise(rows.column("rule"), rows.column("source"), "\x1f")
        for key in pc.unique(joined).to_pylist():
            self.keys.setdefault(key, len(self.keys))
        codes = pc.index_in(joined, value_set=pa.array(list(self.keys), pa.string())).to_numpy(zero_copy_only=False).astype(np.int64)
        self.reached = np.concatenate([self.reached, np.zeros(len(self.keys) - len(self.reached), dtype=np.int64)])
        self.reached += np.bincount(codes, minlength=len(self.keys))
        merged = rows if self.sample is None else pa.concat_tables([self.sample, rows.select(self.sample.column_names)])
        all_codes = np.concatenate([self.codes, codes])
        keep = smallest_per_group(all_codes, merged.column("rank").to_numpy(), self.k)
        self.sample, self.codes = merged.take(pa.array(keep)), all_codes[keep]

    def table(self) -> pa.Table | None:
        if self.sample is None:
            return None
        return self.sample.append_column("reached", pa.array(self.reached[self.codes], pa.int64())).cast(STATS_SCHEMA)


FIRES_WHEN = pa.array(["", "<", ">"], pa.string())  # equal: no side; below the threshold fires; above fires


def measured_rows(doc_ids: list[str], sources: list[str], profiles: list[str], counts: list[int], verdicts: list[tuple]) -> pa.Table:
    """Stats rows from each document's verdicts, built column-wise: `verdicts` holds (keep, rule, value, threshold)
    tuples, document i's `counts[i]` of them in a row (a rule's Verdict is such a tuple)."""
    index = np.repeat(np.arange(len(doc_ids)), counts)
    # One comprehension a field: zip(*verdicts) takes every verdict as an argument and cost 0.6 us a verdict.
    keeps, rules = [v[0] for v in verdicts], [v[1] for v in verdicts]
    values, thresholds = [v[2] for v in verdicts], [v[3] for v in verdicts]
    value, threshold = np.array(values, dtype=np.float64), np.array(thresholds, dtype=np.float64)
    fired = ~np.array(keeps, dtype=bool)
    # Which side fires, as codes into FIRES_WHEN taken by Arrow (a numpy string array and its tolist() made a
    # Python str per verdict: ~25 a document).
    side = FIRES_WHEN.take(pa.array(np.where(value == threshold, 0, np.where((value < threshold) == fired, 1, 2)).astype(np.int8)))
    ranks = np.array([doc_rank(doc_id) for doc_id in doc_ids], dtype=np.uint64)
    take = pa.array(index, pa.int64())
    return stats_rows({"rule": rules, "source": pa.array(sources, pa.string()).take(take), "id": pa.array(doc_ids, pa.string()).take(take),
                       "rank": ranks[index], "value": value, "threshold": threshold, "fired": fired, "fires_when": side,
                       "profile": pa.array(profiles, pa.string()).take(take)})


def stats_rows(columns: dict[str, list]) -> pa.Table:
    """The rows a stage function returns (every field of STATS_SCHEMA but `reached`), from column lists."""
    schema = pa.schema([f for f in STATS_SCHEMA if f.name != "reached"])
    return pa.Table.from_pydict(columns, schema=schema)
