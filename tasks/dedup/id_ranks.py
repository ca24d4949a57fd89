"""The near-duplicate pass's global id order as an external sort: every step a runner task, the host holds splitters and counts.

Rank r is the r-th smallest id in UTF-8 byte order (Arrow's string sort, the
order of Python's min()), so "smallest rank" is "smallest id" whatever the
shard layout. No process sees every id:
1. each signature task writes its shard's documents sorted by id (a sorted
   run: id bytes, id offsets, and per document its row, shingle span and
   fingerprints) and returns the ids whose hash falls under a sampling
   probability, about SAMPLES_PER_RANGE per id range over the whole corpus;
2. the host picks range splitters from those samples (`choose_splitters`);
3. one task per shard (`bound_id_ranges`) finds where each splitter cuts its
   run and the sha256 of each cut, kept beside the run as a slice index
   (tasks/dedup/slice_index.py), so every later reader checks exactly the
   bytes it reads; the host adds the counts up into each range's first rank;
4. one task per id range (`rank_id_range`) merges its cut of every run (one
   index entry per run) and writes the rank-indexed files of its range (ids,
   spans, fingerprints: see tasks/dedup/near_dup_files.py) and each shard's
   (row, rank) pairs, indexed by shard;
5. one task per shard (`rank_band_records`) rewrites its band records with
   ranks in place of rows, so bucket tasks need no rank lookup at all.
Every task holds one shard's or one id range's documents; the host holds one
count per range, the runs' names (sent to tasks as a checked file, like the
splitters), and SAMPLES_PER_RANGE × ranges ids: no
(shard, range) table, which at 10k shards and 1k ranges would be 10M entries.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from manifests.atomic import atomic_write_parquet, atomic_write_text
from manifests.digest import sha256_file
from tasks.dedup.minhash import ChecksumMismatch, check_intermediate, write_checked_array
from tasks.dedup.near_dup_files import RANK_BITS, RANKED_RECORD, RECORD, RankRange, Slice, range_file, read_slices, shard_file, write_partitioned
from tasks.dedup.slice_index import indexed_slice, write_slice_index, writer_slices
from tasks.dedup.spill_reader import SpillFiles

SAMPLES_PER_RANGE = 32  # expected splitter candidates per id range: the largest range is then ~1.6× the mean
SPLITTERS_FILE = "splitters.json"
SHARDS_FILE = "shards.json"  # the input shards' names, in shard-index order
RANKED_ROW = np.dtype([("shard", "<i8"), ("row", "<i8"), ("rank", "<i8")])  # a range's ranks, sorted by (shard, row)


def run_dtype(num_hashes: int) -> np.dtype:
    """A sorted run's record: the document's row in its shard, its shingle span there, its fingerprints (zero without shingles)."""
    return np.dtype([("row", "<i8"), ("start", "<i8"), ("stop", "<i8"), ("print", "u1", (num_hashes,))])


@dataclass(frozen=True)
class SortedRun:
    """A shard's documents in id order, as three checked files in the spill directory."""

    directory: str
    shard: str

    def path(self, part: str) -> str:
        return str(Path(self.directory) / f"{self.shard}.{part}.npy")  # part: run, idbytes, idoffsets

    PARTS = ("idoffsets", "idbytes", "run")


def sample_probability(documents: int, ranges: int) -> float:
    return min(1.0, SAMPLES_PER_RANGE * ranges / max(documents, 1))


def sampled(ids: pa.Array, probability: float) -> list[str]:
    """The ids whose 64-bit blake2b hash falls under `probability`: the same sample whatever the shard layout."""
    if probability >= 1.0:
        return ids.to_pylist()
    limit = int(probability * 2**64)
    return [i for i in ids.to_pylist() if int.from_bytes(hashlib.blake2b(i.encode(), digest_size=8).digest(), "little") < limit]


def write_sorted_run(run: SortedRun, ids: pa.Array, offsets: np.ndarray, rows_with_shingles: np.ndarray, prints: np.ndarray,
                     probability: float) -> dict[str, Any]:
    """Write the shard's sorted run (ids unique, as the pass requires); (path, sha256) of each file, its id sample."""
    ids = ids.cast(pa.large_string())
    order = np.asarray(pc.sort_indices(ids), dtype=np.int64)
    records = np.zeros(len(ids), run_dtype(prints.shape[1]))
    records["row"], records["start"], records["stop"] = order, offsets[:-1][order], offsets[1:][order]
    by_row = np.zeros((len(ids), prints.shape[1]), np.uint8)
    by_row[rows_with_shingles.astype(np.int64)] = prints
    records["print"] = by_row[order]
    sorted_ids = ids.take(pa.array(order))
    id_offsets, id_bytes = np.zeros(1, np.int64), np.zeros(0, np.uint8)
    if len(ids):
        _, value_offsets, value_bytes = sorted_ids.buffers()
        id_offsets = np.frombuffer(value_offsets, np.int64, len(ids) + 1, sorted_ids.offset * 8)
        id_bytes = np.frombuffer(value_bytes, np.uint8)[int(id_offsets[0]): int(id_offsets[-1])]
        id_offsets = id_offsets - id_offsets[0]
    digests = {part: write_checked_array(Path(run.path(part)), array)
               for part, array in zip(SortedRun.PARTS, (id_offsets, id_bytes, records))}
    return {"run": run, "run_sha256": digests, "samples": sampled(sorted_ids, probability)}


def choose_splitters(samples: list[str], ranges: int) -> list[str]:
    """Up to ranges - 1 ids cutting the sorted samples into equal parts (distinct: ids are unique)."""
    ordered = sorted(samples)
    return sorted({ordered[i * len(ordered) // ranges] for i in range(1, ranges) if i * len(ordered) // ranges > 0})


def cut_digest(id_offsets: np.ndarray, id_bytes: np.ndarray, records: np.ndarray) -> bytes:
    """sha256 of one cut of a sorted run: its offsets (rebased), its id bytes, its records."""
    digest = hashlib.sha256((id_offsets - id_offsets[0]).tobytes())
    digest.update(id_bytes.tobytes())
    digest.update(records.tobytes())
    return digest.digest()


def save_list(directory: str, name: str, values: list[str]) -> tuple[str, str]:
    """A list every task of a step needs (the splitters, the shard names) as a checked file, (path, sha256): each task is
    sent these two strings, not ranges - 1 ids or one name per shard (Dask holds every submitted job at once)."""
    path = Path(directory) / name
    atomic_write_text(path, json.dumps(values))
    return str(path), sha256_file(path)


def load_list(path: str, sha256: str) -> list[str]:
    return json.loads(check_intermediate(path, sha256).read_text())


def bound_id_ranges(run: SortedRun, sha256: dict[str, str], splitters_file: tuple[str, str]) -> dict[str, Any]:
    """Task: where each splitter cuts this shard's sorted run and the sha256 of every cut, stored as the run's slice index;
    returns the number of documents in each cut."""
    splitters = load_list(*splitters_file)
    spill = SpillFiles()
    try:
        parts = {}
        for part in SortedRun.PARTS:
            spill.verify(run.path(part), sha256[part])
            parts[part] = spill.read(run.path(part), 0, int(np.prod(spill.shape(run.path(part)))))
        id_offsets, id_bytes, records = parts["idoffsets"], parts["idbytes"], parts["run"]
        ids = pa.LargeStringArray.from_buffers(len(records), pa.py_buffer(id_offsets), pa.py_buffer(id_bytes))
        cuts = np.searchsorted(np.asarray(ids.to_pylist(), dtype=object), np.asarray(splitters, dtype=object), side="left")
        bounds = np.concatenate(([0], np.asarray(cuts, np.int64), [len(records)])).astype(np.int64)
        write_slice_index(run.path("run"), [Slice(run.path("run"), lo, hi, cut_digest(id_offsets[lo: hi + 1],
                                                                                      id_bytes[id_offsets[lo]: id_offsets[hi]],
                                                                                      records[lo:hi]).hex())
                                            for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist())])
        return {"shard": run.shard, "counts": np.diff(bounds)}
    finally:
        spill.close()


def rank_id_range(directory: str, index: int, first_rank: int, shards_file: tuple[str, str], num_hashes: int) -> dict[str, Any]:
    """Task: merge this id range's cut of every shard's run; write its rank-indexed files and each shard's (row, rank) pairs."""
    runs = [SortedRun(directory, shard) for shard in load_list(*shards_file)]
    spill = SpillFiles()
    try:
        id_parts, record_parts, shard_parts = [], [], []
        for shard_index, run in enumerate(runs):
            cut = indexed_slice(spill, run.path("run"), index)
            lo, hi, digest = cut.start, cut.stop, bytes.fromhex(cut.sha256)
            # unverified as whole files: the cut is checked below, against the digest its cutter recorded
            id_offsets = spill.read_unverified(run.path("idoffsets"), lo, hi + 1)
            id_bytes = spill.read_unverified(run.path("idbytes"), int(id_offsets[0]), int(id_offsets[-1]))
            records = spill.read_unverified(run.path("run"), lo, hi)
            if cut_digest(id_offsets, id_bytes, records) != digest:
                raise ChecksumMismatch(f"{run.path('run')}: sha256 of documents [{lo}, {hi}) differs from what was recorded when the "
                                       "run was cut; the intermediate file is corrupt, nothing was published")
            id_parts.append(pa.LargeStringArray.from_buffers(hi - lo, pa.py_buffer(id_offsets - id_offsets[0]), pa.py_buffer(id_bytes)))
            record_parts.append(records)
            shard_parts.append(np.full(hi - lo, shard_index, np.int64))
        ids = pa.concat_arrays(id_parts) if id_parts else pa.array([], pa.large_string())
        records = np.concatenate(record_parts) if record_parts else np.zeros(0, run_dtype(num_hashes))
        shards = np.concatenate(shard_parts) if shard_parts else np.zeros(0, np.int64)
        order = np.asarray(pc.sort_indices(ids), dtype=np.int64)
        records, shards = records[order], shards[order]
        ids_path = range_file(directory, index, "ids.parquet")
        atomic_write_parquet(Path(ids_path), pa.table({"id": ids.take(pa.array(order)).cast(pa.string())}))
        spans = np.stack([shards, records["start"], records["stop"]], axis=1) if len(records) else np.zeros((0, 3), np.int64)
        ranked = np.empty(len(records), RANKED_ROW)
        ranked["shard"], ranked["row"], ranked["rank"] = shards, records["row"], first_rank + np.arange(len(records), dtype=np.int64)
        ranked = ranked[np.lexsort((ranked["row"], ranked["shard"]))]
        ranked_path = range_file(directory, index, "ranked.npy")
        write_slice_index(ranked_path, write_partitioned(Path(ranked_path), ranked, ranked["shard"], len(runs)))
        return {"range": RankRange(first_rank, first_rank + len(records), sha256_file(Path(ids_path)),
                                   write_checked_array(Path(range_file(directory, index, "spans.npy")), spans),
                                   write_checked_array(Path(range_file(directory, index, "prints.npy")), records["print"]))}
    finally:
        spill.close()


def rank_band_records(directory: str, shard_index: int, shard: str, rows: int, ranges: int) -> dict[str, Any]:
    """Task: this shard's band records with each row replaced by its document's rank, in the same key partitions.

    Its cut of each id range's (row, rank) pairs is entry `shard_index` of that range's index; its band records are its
    signature task's file, one slice per key partition. Both are written here the same way: file plus slice index.
    """
    spill = SpillFiles()
    try:
        rank_of_row = np.full(rows, -1, np.int64)
        for index in range(ranges):
            cut = indexed_slice(spill, range_file(directory, index, "ranked.npy"), shard_index)
            pairs = spill.read_checked_slice(cut.path, cut.start, cut.stop, cut.sha256)
            rank_of_row[pairs["row"]] = pairs["rank"]
        if rows and rank_of_row.min() < 0:
            raise ChecksumMismatch(f"{shard}: {int((rank_of_row < 0).sum())} documents got no rank; the id ranges do not cover the shard")
        band_slices = writer_slices(spill, shard_file(directory, shard, "bands"))
        records = read_slices(spill, band_slices, RECORD)
        ranked = np.empty(len(records), RANKED_RECORD)
        ranked["key"] = records["key"]
        band, row = records["band_row"] >> np.uint64(32), records["band_row"] & np.uint64(0xFFFFFFFF)
        ranked["band_rank"] = (band << np.uint64(RANK_BITS)) | rank_of_row[row.astype(np.int64)].astype(np.uint64)
        partition_of = np.repeat(np.arange(len(band_slices)), [s.stop - s.start for s in band_slices])
        ranked_path = shard_file(directory, shard, "ranked_bands")
        write_slice_index(ranked_path, write_partitioned(Path(ranked_path), ranked, partition_of, len(band_slices)))
        return {"shard": shard}
    finally:
        spill.close()
