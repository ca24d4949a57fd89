"""Shards: pack the mixture into flat token files, write their indexes and the corpus manifest.

Seed 001 (packing; shards and loaders): documents joined with EOS into one
stream (windows may later cross an EOS, as in Lab 2), stored as flat arrays of
token ids, uint16 when every id fits in 65,536, else uint32 (little-endian
here, whatever the machine). Each unique document is tokenised once
(tasks.encoding: batches on every core); its mixture repeats are copies, placed in
epoch-major seeded order so a repeat never sits beside its original. A shard
holds at most `tokens_per_shard` tokens; a document crossing a boundary gets
one index row in each shard. Index rows (doc_id, offset, length, doc_start,
repeat) let `trace_token` name the document of any training token.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from prefect import task

from manifests.atomic import atomic_write_bytes, atomic_write_parquet
from manifests.corpus import (CORPUS_FILE, filters_by_source, ingested_by_source, locate_corpus_manifest, read_corpus_manifest, source_of_id,
                              source_provenance, write_corpus_manifest)
from manifests.digest import sha256_file
from manifests.run_dir import STAGE_DIR_RE
from manifests.stage_manifest import StageManifest, read_manifest
from tasks.encoding import encoded_batches, ids_with_eos
from tasks.mixture import PLAN_FILE, TABLE_FILE
from tasks.split import HELD_OUT_RULE, VALIDATION, iter_split_docs, seeded_rank
from tasks.stage_runner import run_artifact_stage
from tasks.tokenizer import EOS_TOKEN, TOKENIZER_FILE, load_tokenizer, vocab_size_of

STAGE = "shards"
VERSION = "1"
UINT16_LIMIT = 1 << 16
INDEX_SCHEMA = pa.schema([
    ("doc_id", pa.string()),
    ("offset", pa.int64()),  # first token of this piece inside the shard
    ("length", pa.int64()),  # tokens of this piece, the closing EOS included when it ends the document
    ("doc_start", pa.int64()),  # position of the piece's first token inside the document's token sequence
    ("repeat", pa.int32()),  # 0 for a document's first occurrence, k for its k-th mixture repeat
])


@dataclass(frozen=True)
class ShardsConfig:
    tokens_per_shard: int = 1 << 24  # bounded files: 32 MiB at uint16 (seed 000 uses 50 M-token shards)
    seed: int = 0  # order of document occurrences in the stream


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 while every id (added tokens included) is below 65,536 (seed 001), else uint32; little-endian."""
    return np.dtype("<u2") if vocab_size <= UINT16_LIMIT else np.dtype("<u4")


class TokenCache:
    """Every needed document's tokens, once, in a flat file: repeats and shuffles read from it by memmap."""

    def __init__(self, path: Path, dtype: np.dtype):
        self.path, self.dtype = path, dtype
        self.spans: dict[str, tuple[int, int]] = {}
        self.size = 0
        self.handle = open(path, "wb")

    def add_batch(self, doc_ids: list[str], flat: np.ndarray, lengths: np.ndarray) -> None:
        """Documents laid end to end in `flat`, `lengths` tokens each."""
        self.handle.write(flat.tobytes())
        starts = (self.size + np.cumsum(lengths) - lengths).tolist()
        self.spans.update(zip(doc_ids, zip(starts, lengths.tolist())))
        self.size += len(flat)

    def freeze(self) -> np.ndarray:
        self.handle.close()
        return np.memmap(self.path, dtype=self.dtype, mode="r", shape=(self.size,)) if self.size else np.zeros(0, self.dtype)


def fill_cache(tables: Iterable[pa.Table], wanted: set[str] | None, tokenizer, eos_id: int, cache: TokenCache) -> None:
    if wanted is not None:
        wanted_ids = pa.array(sorted(wanted), type=pa.string())
        tables = (table.filter(pc.is_in(table.column("id"), value_set=wanted_ids)) for table in tables)
    for batch, ids in encoded_batches(tokenizer, tables):
        cache.add_batch(batch.column("id").to_pylist(), *ids_with_eos(ids, eos_id, cache.dtype))


def occurrence_order(repeats: dict[str, int], seed: int) -> list[tuple[str, int]]:
    """(doc id, repeat k) in epoch-major seeded order: all first occurrences shuffled, then all second ones, ..."""
    occurrences = [(k, seeded_rank(seed, f"{doc_id}\x00{k}"), doc_id) for doc_id, n in repeats.items() for k in range(n)]
    occurrences.sort()
    return [(doc_id, k) for k, _, doc_id in occurrences]


def write_stream(occurrences: list[tuple[str, int]], cache: TokenCache, tokens: np.ndarray, tokens_per_shard: int, out_dir: Path, prefix: str) -> list[dict[str, Any]]:
    """Cut the occurrence stream into bounded shards; one .bin and one .idx.parquet per shard."""
    shards: list[dict[str, Any]] = []
    buffer = np.empty(tokens_per_shard, dtype=cache.dtype)
    fill, index_rows = 0, []

    def flush() -> None:
        nonlocal fill, index_rows
        name = f"{prefix}-{len(shards):05d}"
        atomic_write_bytes(out_dir / f"{name}.bin", buffer[:fill].tobytes())
        atomic_write_parquet(out_dir / f"{name}.idx.parquet", pa.Table.from_pylist(index_rows, schema=INDEX_SCHEMA))
        shards.append({"name": name, "tokens": fill, "documents": len(index_rows)})
        fill, index_rows = 0, []

    for doc_id, repeat in occurrences:
        start, length = cache.spans[doc_id]
        done = 0
        while done < length:
            piece = min(length - done, tokens_per_shard - fill)
            buffer[fill:fill + piece] = tokens[start + done:start + done + piece]
            index_rows.append({"doc_id": doc_id, "offset": fill, "length": piece, "doc_start": done, "repeat": repeat})
            fill += piece
            done += piece
            if fill == tokens_per_shard:
                flush()
    if fill:
        flush()
    return shards


def pack_side(tables: Iterable[pa.Table], repeats: dict[str, int] | None, tokenizer, eos_id: int, dtype: np.dtype,
              config: ShardsConfig, work_dir: Path, side: str) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Tokenise one side of the split once, lay out its occurrences, write its shards.

    `repeats` = the mixture plan (train); None = every document once (validation).
    Returns the shard listing for the corpus manifest and the tokens of each document.
    """
    cache = TokenCache(work_dir / f".{side}.cache", dtype)
    fill_cache(tables, None if repeats is None else set(repeats), tokenizer, eos_id, cache)
    tokens = cache.freeze()
    order = occurrence_order(repeats if repeats is not None else {i: 1 for i in cache.spans}, config.seed)
    written = write_stream(order, cache, tokens, config.tokens_per_shard, work_dir / "tokens", side)
    del tokens
    cache.path.unlink()
    listing = []
    for shard in written:
        bin_rel, idx_rel = f"tokens/{shard['name']}.bin", f"tokens/{shard['name']}.idx.parquet"
        listing.append({"path": bin_rel, "sha256": sha256_file(work_dir / bin_rel), "tokens": shard["tokens"], "documents": shard["documents"],
                        "index_path": idx_rel, "index_sha256": sha256_file(work_dir / idx_rel)})
    return listing, {doc_id: n for doc_id, (_, n) in cache.spans.items()}


def build_shards(split_dir: Path, tokenizer_dir: Path, mixture_dir: Path, config: ShardsConfig, work_dir: Path) -> tuple[list[tuple[str, int | None]], dict[str, Any]]:
    tokenizer_manifest, mixture_manifest = read_manifest(tokenizer_dir), read_manifest(mixture_dir)
    shutil.copyfile(tokenizer_manifest.directory / TOKENIZER_FILE, work_dir / TOKENIZER_FILE)  # the corpus dir is self-contained
    tokenizer = load_tokenizer(work_dir / TOKENIZER_FILE)
    vocab_size = vocab_size_of(tokenizer)
    dtype = token_dtype(vocab_size)
    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    plan = pq.read_table(mixture_manifest.directory / PLAN_FILE)
    repeats = {i: r for i, r in zip(plan.column("id").to_pylist(), plan.column("repeats").to_pylist()) if r > 0}
    (work_dir / "tokens").mkdir()

    train, _ = pack_side(iter_split_docs(split_dir, "train", ["id", "text"]), repeats, tokenizer, eos_id, dtype, config, work_dir, "train")
    validation, validation_tokens = pack_side(iter_split_docs(split_dir, VALIDATION, ["id", "text"]), None, tokenizer, eos_id, dtype, config, work_dir, VALIDATION)
    validation_by_source = _by_source(validation_tokens)

    mixture_table = json.loads((mixture_manifest.directory / TABLE_FILE).read_text(encoding="utf-8"))
    tokenizer_stats = tokenizer_manifest.extra
    payload = {
        "dtype": dtype.name,
        "byte_order": "little",
        "eos_id": eos_id,
        "tokenizer": {**tokenizer_stats.get("tokenizer", {}), "path": TOKENIZER_FILE, "sha256": sha256_file(work_dir / TOKENIZER_FILE), "vocab_size": vocab_size},
        "sources": corpus_sources(Path(split_dir), plan, mixture_table, tokenizer_stats, validation_by_source),
        "mixture": mixture_table,
        "shards": {"train": train, VALIDATION: validation},
        "train_tokens": sum(s["tokens"] for s in train),
        "validation": {"rule": HELD_OUT_RULE, "stage": Path(split_dir).name, "documents": len(validation_tokens),
                       "tokens": sum(validation_tokens.values()), "by_source": validation_by_source},
        "seed": config.seed,
    }
    corpus = write_corpus_manifest(work_dir / CORPUS_FILE, payload)
    artifacts: list[tuple[str, int | None]] = [(TOKENIZER_FILE, vocab_size), (CORPUS_FILE, None)]
    for shard in train + validation:
        artifacts += [(shard["path"], shard["tokens"]), (shard["index_path"], shard["documents"])]
    return artifacts, {"corpus_digest": corpus["digest"], "dtype": dtype.name, "train_tokens": payload["train_tokens"],
                       "validation_tokens": payload["validation"]["tokens"]}


def _by_source(tokens_by_id: dict[str, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for doc_id, n in tokens_by_id.items():
        row = out.setdefault(source_of_id(doc_id), {"documents": 0, "tokens": 0})
        row["documents"] += 1
        row["tokens"] += n
    return dict(sorted(out.items()))


def corpus_sources(split_dir: Path, plan: pa.Table, mixture_table: dict[str, Any], tokenizer_stats: dict[str, Any], validation: dict[str, dict[str, int]]) -> list[dict[str, Any]]:
    """Per source: provenance, filters with counts, kept documents/tokens, weight, epochs, compression."""
    run = split_dir.parent
    numbered = STAGE_DIR_RE.match(split_dir.name)
    provenance, ingested = source_provenance(run), ingested_by_source(run)
    filters = filters_by_source(run, int(numbered.group(1)) if numbered else None)
    kept_docs: dict[str, int] = {}
    for source in plan.column("source").to_pylist():
        kept_docs[source] = kept_docs.get(source, 0) + 1
    compression = tokenizer_stats.get("sample_by_source", {})
    rows = []
    for mix in mixture_table["sources"]:
        name = mix["name"]
        rows.append({
            "source": name,
            **provenance.get(name, {"origin": None, "snapshot": None, "license": None}),
            "documents_ingested": ingested.get(name),
            "filters": filters.get(name, {}),
            "train_documents": kept_docs.get(name, 0),
            "train_unique_tokens": mix["unique_tokens"],
            "validation_documents": validation.get(name, {}).get("documents", 0),
            "validation_tokens": validation.get(name, {}).get("tokens", 0),
            "weight": mix["weight"],
            "epochs": mix["epochs"],
            "tokens_contributed": mix["tokens_contributed"],
            "shortfall_tokens": mix["shortfall_tokens"],
            "chars_per_token": compression.get(name, {}).get("chars_per_token"),
            "tokens_per_word": compression.get(name, {}).get("tokens_per_word"),
        })
    return rows


def trace_token(corpus_path: Path, shard: int, offset: int, split: str = "train", window: int = 16) -> dict[str, Any]:
    """The document a token belongs to: id, position inside it, repeat, and the decoded window around it."""
    manifest_path = locate_corpus_manifest(Path(corpus_path))
    corpus = read_corpus_manifest(manifest_path)
    root = manifest_path.parent
    shards = corpus["shards"].get(split, [])
    if not 0 <= shard < len(shards):
        raise IndexError(f"{manifest_path}: {split} has {len(shards)} shards; no shard {shard}")
    entry = shards[shard]
    if not 0 <= offset < entry["tokens"]:
        raise IndexError(f"{root / entry['path']}: {entry['tokens']} tokens; offset {offset} is outside")
    tokens = np.memmap(root / entry["path"], dtype=np.dtype(corpus["dtype"]).newbyteorder("<"), mode="r")
    index = pq.read_table(root / entry["index_path"])
    offsets = index.column("offset").to_numpy()
    row = int(np.searchsorted(offsets, offset, side="right") - 1)
    piece = {name: index.column(name)[row].as_py() for name in INDEX_SCHEMA.names}
    tokenizer = load_tokenizer(root / corpus["tokenizer"]["path"])
    position = piece["doc_start"] + (offset - piece["offset"])
    token_id = int(tokens[offset])
    lo, hi = max(0, offset - window), min(entry["tokens"], offset + window + 1)
    return {
        "split": split, "shard": shard, "shard_path": entry["path"], "offset": offset,
        "token_id": token_id, "token": tokenizer.id_to_token(token_id), "is_eos": token_id == corpus["eos_id"],
        "doc_id": piece["doc_id"], "repeat": piece["repeat"], "position_in_document": position,
        "window_before": tokenizer.decode([int(t) for t in tokens[lo:offset]], skip_special_tokens=False),
        "window_token": tokenizer.decode([token_id], skip_special_tokens=False),
        "window_after": tokenizer.decode([int(t) for t in tokens[offset + 1:hi]], skip_special_tokens=False),
    }


def run_shards(config: ShardsConfig, split_dir: Path, tokenizer_dir: Path, mixture_dir: Path, out_dir: Path) -> StageManifest:
    inputs = [Path(split_dir), Path(tokenizer_dir), Path(mixture_dir)]
    return run_artifact_stage(STAGE, VERSION, asdict(config), inputs, Path(out_dir),
                              lambda work_dir: build_shards(*inputs, config, work_dir))


@task(name="shards", task_run_name="shards")
def shards_task(config: ShardsConfig, split_dir: Path, tokenizer_dir: Path, mixture_dir: Path, out_dir: Path) -> StageManifest:
    return run_shards(config, split_dir, tokenizer_dir, mixture_dir, out_dir)
