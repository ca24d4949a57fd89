"""The held-out side of the corpus, tokenised and planned per split shard by runner tasks; the flow host keeps sums.

At the split's default 5 %, a billion documents put 50M on this side. Held
as one counts table, a list of ids and two dictionaries on the flow host,
that was about 15 GB. Here each split shard's task tokenises its held-out
documents, writes their token file and its piece of `validation_documents`
(doc_id, source, lang, tokens), and returns totals and per-source sums. A
second task per shard writes that shard's plan part (id, offset into the
joined token file, tokens, repeats = 1) once the host knows where each
shard's tokens start. The host holds O(shards × sources) values and streams
the pieces into one `validation_documents.parquet`, a row group at a time.
The files are the bytes of the one-table version, whatever the shard count.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from manifests.atomic import atomic_write_parquet, atomic_write_parquet_stream
from manifests.corpus import source_column
from manifests.digest import sha256_file
from manifests.stage_manifest import read_manifest
from tasks.corpus.mixture import encode_shard_side
from tasks.corpus.token_join import join_token_files
from tasks.corpus.split import VALIDATION
from tasks.dedup.minhash import check_intermediate
from tasks.runner.stage_runner import map_shards

VALIDATION_DOCUMENTS_SCHEMA = pa.schema([("doc_id", pa.string()), ("source", pa.string()), ("lang", pa.string()), ("tokens", pa.int64())])
PLAN_SCHEMA = pa.schema([("id", pa.string()), ("offset", pa.int64()), ("tokens", pa.int64()), ("repeats", pa.int64())])


def encode_heldout_shard(shard_path: str, shard: str, tokenizer_path: str, tokenizer_sha256: str, spill_dir: str) -> dict[str, Any]:
    """Task: one split shard's held-out documents tokenised into their token file, and their documents piece written;
    returns paths, digests, totals and per-source sums (no per-document value)."""
    encoded = encode_shard_side(shard_path, shard, VALIDATION, tokenizer_path, tokenizer_sha256, str(Path(spill_dir) / f"{shard}.tokens"))
    counts = encoded["counts"]
    ids = counts.column("id")
    piece = pa.table([ids, source_column(ids), pc.fill_null(encoded["langs"], ""), counts.column("tokens")],
                     schema=VALIDATION_DOCUMENTS_SCHEMA)
    piece_path = Path(spill_dir) / f"{shard}.documents.parquet"
    atomic_write_parquet(piece_path, piece, sync=False)  # intermediate: HeldOutSide.close removes it before the stage publishes
    by_source = piece.group_by("source").aggregate([("tokens", "count"), ("tokens", "sum")]).to_pylist()
    return {"shard": shard, "path": encoded["path"], "sha256": encoded["sha256"], "documents": piece.num_rows,
            "tokens": int(pc.sum(counts.column("tokens")).as_py() or 0), "piece": str(piece_path), "piece_sha256": sha256_file(piece_path),
            "by_source": {row["source"]: {"documents": row["tokens_count"], "tokens": row["tokens_sum"]} for row in by_source}}


def read_piece(path: str, sha256: str, columns: list[str] | None = None) -> pa.Table:
    return pq.read_table(check_intermediate(path, sha256), columns=columns)


def write_heldout_plan_part(piece_path: str, piece_sha256: str, first_offset: int, out_path: str) -> str:
    """Task: one shard's plan part: its documents at their offsets in the joined token file, once each."""
    piece = read_piece(piece_path, piece_sha256, ["doc_id", "tokens"])
    lengths = piece.column("tokens").to_numpy()
    offsets = first_offset + np.cumsum(lengths) - lengths
    atomic_write_parquet(Path(out_path), pa.table([piece.column("doc_id"), pa.array(offsets, pa.int64()), pa.array(lengths, pa.int64()),
                                                   pa.array(np.ones(len(lengths), np.int64))], schema=PLAN_SCHEMA), sync=False)  # intermediate
    return out_path


def summed_by_source(shards: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Held-out documents and tokens per source over every shard, sources in order."""
    out: dict[str, dict[str, int]] = {}
    for shard in shards:
        for source, sums in shard["by_source"].items():
            row = out.setdefault(source, {"documents": 0, "tokens": 0})
            row["documents"] += sums["documents"]
            row["tokens"] += sums["tokens"]
    return dict(sorted(out.items()))


class HeldOutSide:
    """The held-out side planned for the shard writer: the joined token file, one plan part per split shard, the sums."""

    def __init__(self, split_dir: Path, tokenizer_path: Path, work_dir: Path, workers: int):
        self.spill_dir = Path(work_dir) / f"_{VALIDATION}_side"
        self.tokens_path = Path(work_dir) / f".{VALIDATION}.cache"
        self.spill_dir.mkdir(parents=True, exist_ok=True)
        upstream = read_manifest(Path(split_dir), verify=False)
        data = upstream.files("data")
        jobs = [(str(upstream.path_of(f)), Path(f.path).stem, str(tokenizer_path), sha256_file(tokenizer_path), str(self.spill_dir))
                for f in data]
        self.shards = sorted(map_shards(encode_heldout_shard, jobs, workers, f"tokenising: {VALIDATION}", [f.rows or 0 for f in data]),
                             key=lambda result: result["shard"])
        join_token_files(self.shards, self.tokens_path, workers, digest=False, sync=False)  # a cache the shards stage cuts, not published
        firsts = np.cumsum([0, *(shard["tokens"] for shard in self.shards)]).tolist()
        plan_jobs = [(shard["piece"], shard["piece_sha256"], int(first), str(self.spill_dir / f"{shard['shard']}.plan.parquet"))
                     for shard, first in zip(self.shards, firsts)]
        self.plan_parts = [Path(p) for p in sorted(map_shards(write_heldout_plan_part, plan_jobs, workers, f"plan: {VALIDATION}",
                                                              [shard["documents"] for shard in self.shards]))]
        self.documents = sum(shard["documents"] for shard in self.shards)
        self.tokens = int(firsts[-1])
        self.by_source = summed_by_source(self.shards)

    def pieces(self) -> Iterator[pa.Table]:
        for shard in self.shards:
            yield read_piece(shard["piece"], shard["piece_sha256"])

    def write_documents(self, path: Path) -> dict[str, Any]:
        """`validation_documents.parquet`: every held-out document's source, language and tokens, in shard order."""
        rows = atomic_write_parquet_stream(path, VALIDATION_DOCUMENTS_SCHEMA, self.pieces())
        return {"path": path.name, "sha256": sha256_file(path), "rows": rows}

    def close(self) -> None:
        shutil.rmtree(self.spill_dir, ignore_errors=True)
        self.tokens_path.unlink(missing_ok=True)
