"""The held-out split's planning tasks: every per-document step of `plan_split`, run by the stage runner's workers.

They exchange rows as partitioned spill files (tasks/corpus/table_spill.py over tasks/dedup/table_slices.py);
each returns slices and per-partition totals, never rows. In order:
1. `doc_sizes`, per run of input shards: (id, source, UTF-8 bytes, shard) by hash of the id;
2. `exact_relations` per dedup_exact audit file and `fuzzy_relations` per row group of
   clusters.parquet: (member, kept) by hash of the exact keeper / the fuzzy member;
3. `resolve_keys`, per partition: each related document's family key, the fuzzy keeper of
   its exact keeper (or that keeper), by hash of the key;
4. `family_members`, per partition: family id (smallest id) and size (removed members
   counted) of every related document, by hash of the document id;
5. `rank_documents`, per partition: every surviving document with its family and the
   family's seeded rank, by rank range;
6. `rank_range_totals` per rank range: families, documents and bytes per source;
   `choose_in_range` per rank range, once the host has found each source's cutoff range:
   the chosen documents by input shard;
7. `write_validation_files`, per run of input shards with chosen documents: validation/<shard>.parquet.
Steps 1, 2 and 7 take runs of consecutive shards (or files, or row groups), as many runs as
there are partitions, so what the host holds is O(partitions²) slices, not O(shards × partitions).
A task holds one run's rows or one partition of one step.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tasks.corpus.split_rule import SplitConfig, taken_before_stop
from tasks.corpus.table_spill import hash_range, read_slices, string_hashes, write_partitioned_table
from tasks.dedup.near_dup_files import Slice
from tasks.dedup.removal_map import write_shard_file

READ_BATCH_ROWS = 2048  # rows decoded at a time when a task reads an input shard or a relation file
PARTITION_SALT = "split-partition"  # hash of an id for partitioning; ranks use the configured seed
VALIDATION_SCHEMA = pa.schema([("id", pa.string()), ("family_id", pa.string()), ("family_size", pa.int64())])
DOC_SIZES = pa.schema([("id", pa.string()), ("source", pa.string()), ("n_bytes", pa.int64()), ("shard", pa.int32())])
RELATIONS = pa.schema([("member", pa.string()), ("kept", pa.string()), ("fuzzy", pa.bool_())])
NODE_KEYS = pa.schema([("node", pa.string()), ("key", pa.string())])
MEMBERS = pa.schema([("node", pa.string()), ("family_id", pa.string()), ("family_size", pa.int64())])
RANKED = pa.schema([("rank", pa.uint64()), ("family_id", pa.string()), ("id", pa.string()), ("source", pa.string()),
                    ("n_bytes", pa.int64()), ("shard", pa.int32()), ("family_size", pa.int64())])
CHOSEN = pa.schema([("id", pa.string()), ("family_id", pa.string()), ("family_size", pa.int64()), ("shard", pa.int32())])


class RelationError(ValueError):
    """The duplicate relations are not what dedup_exact and dedup_fuzzy publish (one keeper per removed or clustered id)."""


def by_id_hash(values: pa.Array | pa.ChunkedArray, partitions: int) -> np.ndarray:
    return hash_range(string_hashes(values, PARTITION_SALT), partitions)


def doc_sizes(shards: list[tuple[str, int]], group: int, partitions: int, spill_dir: str) -> dict[str, Any]:
    """Task, a run of consecutive input shards ((path, shard index) each): id, source and UTF-8 size of every document,
    spilled by id hash; the texts go no further."""
    tables = [DOC_SIZES.empty_table()]
    for shard_path, shard_index in shards:
        for batch in pq.ParquetFile(shard_path, pre_buffer=False).iter_batches(READ_BATCH_ROWS, columns=["id", "source", "text"],
                                                                               use_threads=False):
            n_bytes = pc.binary_length(batch.column("text").cast(pa.binary())).cast(pa.int64())
            shard_column = pa.array(np.full(batch.num_rows, shard_index, np.int32))
            tables.append(pa.table([batch.column("id").cast(pa.string()), batch.column("source").cast(pa.string()), n_bytes, shard_column],
                                   schema=DOC_SIZES))
    table = pa.concat_tables(tables).combine_chunks()
    slices = write_partitioned_table(Path(spill_dir) / f"sizes-{group:05d}.arrow", table, by_id_hash(table.column("id"), partitions), partitions)
    return {"index": group, "documents": table.num_rows, "slices": slices}


def exact_relations(audit_paths: list[str], group: int, partitions: int, spill_dir: str) -> dict[str, Any]:
    """Task, a run of dedup_exact audit files: (removed id, kept id) of every exact removal, spilled by hash of the kept id."""
    members, kept = [], []
    for audit_path in audit_paths:
        for batch in pq.ParquetFile(audit_path, pre_buffer=False).iter_batches(READ_BATCH_ROWS, columns=["id", "action", "detail"],
                                                                               use_threads=False):
            removed = batch.filter(pc.equal(batch.column("action"), "removed"))
            for doc_id, detail in zip(removed.column("id").to_pylist(), removed.column("detail").to_pylist()):
                kept_id = json.loads(detail).get("kept_id")
                if kept_id:
                    members.append(doc_id)
                    kept.append(kept_id)
    table = pa.table([pa.array(members, pa.string()), pa.array(kept, pa.string()), pa.array([False] * len(members))], schema=RELATIONS)
    slices = write_partitioned_table(Path(spill_dir) / f"exact-{group:05d}.arrow", table, by_id_hash(table.column("kept"), partitions), partitions)
    return {"index": group, "slices": slices}


def fuzzy_relations(row_groups: list[tuple[str, int]], group: int, partitions: int, spill_dir: str) -> dict[str, Any]:
    """Task, a run of row groups of dedup_fuzzy's clusters.parquet ((path, row group) each): (member id, keeper id), spilled by
    hash of the member."""
    tables = [RELATIONS.empty_table()]
    for clusters_path, row_group in row_groups:
        rows = pq.ParquetFile(clusters_path).read_row_group(row_group, columns=["id", "kept_id"])
        tables.append(pa.table([rows.column("id").cast(pa.string()), rows.column("kept_id").cast(pa.string()),
                                pa.array([True] * rows.num_rows)], schema=RELATIONS))
    table = pa.concat_tables(tables).combine_chunks()
    slices = write_partitioned_table(Path(spill_dir) / f"fuzzy-{group:05d}.arrow", table, by_id_hash(table.column("member"), partitions),
                                     partitions)
    return {"index": group, "slices": slices}


def refuse_repeated_ids(table: pa.Table, column: str, message: str) -> None:
    """RelationError naming the first id that `column` holds twice (`message` formats it), if any."""
    if pc.count_distinct(table.column(column)).as_py() != table.num_rows:
        counts = table.group_by(column, use_threads=False).aggregate([([], "count_all")])
        raise RelationError(message.format(counts.filter(pc.greater(counts.column("count_all"), 1)).column(column)[0].as_py()))


def resolve_keys(slices: list[Slice], partition: int, partitions: int, spill_dir: str) -> dict[str, Any]:
    """Task, one partition: every related id with its family key (an exact keeper's fuzzy keeper, else the keeper), by key hash.

    The exact relations of a keeper and the fuzzy relation naming that keeper as a
    member share this partition (both hash the keeper), so the join is local.
    """
    relations = read_slices(slices, RELATIONS)
    fuzzy = relations.filter(relations.column("fuzzy")).drop_columns(["fuzzy"]).group_by(["member", "kept"], use_threads=False).aggregate([])
    exact = relations.filter(pc.invert(relations.column("fuzzy")))
    refuse_repeated_ids(fuzzy, "member", "clusters.parquet: id {!r} is in two near-duplicate clusters")
    keeper_row = pc.index_in(exact.column("kept"), value_set=fuzzy.column("member"))
    exact_key = pc.coalesce(fuzzy.column("kept").take(keeper_row), exact.column("kept"))
    nodes = pa.table([pa.concat_arrays([fuzzy.column("member").combine_chunks(), exact.column("member").combine_chunks(),
                                        exact.column("kept").combine_chunks()]),
                      pa.concat_arrays([fuzzy.column("kept").combine_chunks(), exact_key.combine_chunks(), exact_key.combine_chunks()])],
                     schema=NODE_KEYS)
    nodes = nodes.sort_by([("key", "ascending"), ("node", "ascending")])
    written = write_partitioned_table(Path(spill_dir) / f"keys-{partition:05d}.arrow", nodes, by_id_hash(nodes.column("key"), partitions), partitions)
    return {"index": partition, "slices": written}


def family_members(slices: list[Slice], partition: int, partitions: int, spill_dir: str) -> dict[str, Any]:
    """Task, one partition of keys: family id (smallest id) and size (distinct ids, removed ones counted) of every related id."""
    nodes = read_slices(slices, NODE_KEYS).group_by(["node", "key"], use_threads=False).aggregate([])
    families = nodes.group_by("key", use_threads=False).aggregate([("node", "min"), ("node", "count")])
    key_row = pc.index_in(nodes.column("key"), value_set=families.column("key"))
    members = pa.table([nodes.column("node"), families.column("node_min").take(key_row),
                        families.column("node_count").take(key_row).cast(pa.int64())], schema=MEMBERS).sort_by("node")
    written = write_partitioned_table(Path(spill_dir) / f"members-{partition:05d}.arrow", members, by_id_hash(members.column("node"), partitions),
                                      partitions)
    return {"index": partition, "slices": written}


def rank_documents(doc_slices: list[Slice], member_slices: list[Slice], partition: int, partitions: int, seed: int,
                   spill_dir: str) -> dict[str, Any]:
    """Task, one id-hash partition: each surviving document with its family (itself when unrelated) and the family's seeded
    rank, spilled by rank range, so a range holds whole families in rank order."""
    docs = read_slices(doc_slices, DOC_SIZES)
    members = read_slices(member_slices, MEMBERS)
    refuse_repeated_ids(members, "node", "id {!r} is linked to two duplicate families (an exact copy that is also in a near-duplicate cluster)")
    member_row = pc.index_in(docs.column("id"), value_set=members.column("node"))
    family_id = pc.coalesce(members.column("family_id").take(member_row), docs.column("id"))
    family_size = pc.coalesce(members.column("family_size").take(member_row), pa.scalar(1, pa.int64()))
    ranks = string_hashes(family_id, str(seed))  # = int(seeded_rank(seed, family_id), 16)
    ranked = pa.table([pa.chunked_array([pa.array(ranks, pa.uint64())]), family_id, docs.column("id"), docs.column("source"), docs.column("n_bytes"),
                       docs.column("shard"), family_size], schema=RANKED)
    written = write_partitioned_table(Path(spill_dir) / f"ranked-{partition:05d}.arrow", ranked, hash_range(ranks, partitions), partitions)
    return {"index": partition, "slices": written}


def families_in_order(slices: list[Slice]) -> tuple[pa.Table, pa.Table]:
    """One rank range's documents sorted by (rank, family id, id), and one row per family: its first row, source
    (that of its smallest surviving id), documents and bytes."""
    docs = read_slices(slices, RANKED).sort_by([("rank", "ascending"), ("family_id", "ascending"), ("id", "ascending")])
    family, rows = docs.column("family_id"), docs.num_rows
    changes = pc.not_equal(family.slice(1), family.slice(0, max(rows - 1, 0))).to_numpy(zero_copy_only=False)
    starts = np.flatnonzero(np.r_[True, changes]) if rows else np.zeros(0, np.int64)
    counts = np.diff(np.r_[starts, rows]).astype(np.int64)
    sizes = np.add.reduceat(docs.column("n_bytes").to_numpy(), starts) if len(starts) else np.zeros(0, np.int64)
    families = pa.table({"start": starts, "source": docs.column("source").take(pa.array(starts, pa.int64())), "docs": counts,
                         "bytes": sizes.astype(np.int64)})
    return docs, families


def rank_range_totals(slices: list[Slice], partition: int) -> dict[str, Any]:
    """Task, one rank range: families, documents and bytes per source (what the host needs to find each source's cutoff)."""
    _, families = families_in_order(slices)
    totals = families.group_by("source", use_threads=False).aggregate([("docs", "count"), ("docs", "sum"), ("bytes", "sum")])
    return {"index": partition, "families": families.num_rows,
            "sources": {source: (int(count), int(docs), int(size)) for source, count, docs, size in
                        zip(*(totals.column(c).to_pylist() for c in ("source", "docs_count", "docs_sum", "bytes_sum")))}}


def choose_in_range(slices: list[Slice], partition: int, decisions: dict[str, tuple], config: SplitConfig, group_starts: list[int],
                    spill_dir: str) -> dict[str, Any]:
    """Task, one rank range: the held-out documents of the sources the host decided here, spilled by run of input shards
    (`group_starts`: the first shard index of each run).

    decisions[source]: ("all",) every family of the source in this range; ("cut", docs_before, bytes_before, source_docs,
    last_range) the range where the source's choice stops, with the running totals where it starts (and, in the
    source's last range, its last family stays in training).
    """
    docs, families = families_in_order(slices)
    sources = families.column("source").to_numpy(zero_copy_only=False)
    counts, sizes = families.column("docs").to_numpy(), families.column("bytes").to_numpy()
    chosen_families = []
    for source, decision in sorted(decisions.items()):
        mine = np.flatnonzero(sources == source)
        if decision[0] == "cut":
            _, docs_before, bytes_before, source_docs, last_range = decision
            if last_range:
                mine = mine[:-1]  # at least one family stays in training
            mine = mine[:taken_before_stop(docs_before + np.cumsum(counts[mine]) - counts[mine],
                                           bytes_before + np.cumsum(sizes[mine]) - sizes[mine], source_docs, config)]
        chosen_families.append(mine)
    picked = np.concatenate([np.zeros(0, np.int64), *chosen_families])
    starts = families.column("start").to_numpy()[picked]
    rows = np.concatenate([np.zeros(0, np.int64), *(np.arange(start, start + count) for start, count in zip(starts, counts[picked]))])
    chosen = docs.take(pa.array(rows, pa.int64())).select(["id", "family_id", "family_size", "shard"]).cast(CHOSEN)
    group_of = np.searchsorted(np.asarray(group_starts, np.int64), chosen.column("shard").to_numpy().astype(np.int64), side="right") - 1
    written = write_partitioned_table(Path(spill_dir) / f"chosen-{partition:05d}.arrow", chosen, group_of, len(group_starts))
    return {"index": partition, "slices": written, "documents": chosen.num_rows}


def write_validation_files(slices: list[Slice], group: int, shards: list[tuple[int, str]], work_dir: str, relative_dir: str) -> dict[str, Any]:
    """Task, a run of input shards ((index, name) each): each one's held-out documents (id, family_id, family_size), sorted by
    id, as work_dir/relative_dir/<shard>.parquet, the file its shard job reads; a shard with none gets no file."""
    chosen = read_slices(slices, CHOSEN).sort_by([("shard", "ascending"), ("id", "ascending")])
    shard_column = chosen.column("shard").to_numpy()
    files = {}
    for index, name in shards:
        first, stop = np.searchsorted(shard_column, [index, index + 1]).tolist()
        if stop > first:
            rows = chosen.slice(first, stop - first).select(VALIDATION_SCHEMA.names).cast(VALIDATION_SCHEMA).combine_chunks()
            _, path, sha256, count = write_shard_file(Path(work_dir), relative_dir, name, rows)
            files[name] = (path, sha256, count)
    return {"index": group, "files": files}
