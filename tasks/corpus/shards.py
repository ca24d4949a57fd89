"""Shards: pack the mixture into flat token files, write their indexes and the corpus manifest.

Seed 001 (packing; shards and loaders): documents joined with EOS into one
stream (windows may later cross an EOS, as in Lab 2), stored as flat arrays of
token ids, uint16 when every id fits in 65,536, else uint32 (little-endian
here, whatever the machine). Each unique document is tokenised once: the
training side by the mixture stage, which had to count its tokens anyway
(its train_tokens.bin, read here piece by piece), the validation side here,
by the same per-shard runner tasks (tasks.corpus.mixture.encode_split_side). Mixture repeats are copies, placed in
epoch-major seeded order so a repeat never sits beside its original. A shard
holds at most `tokens_per_shard` tokens; a document crossing a boundary gets
one index row in each shard. Index rows (doc_id, offset, length, doc_start,
repeat) let `trace_token` name the document of any training token.

How it runs: the flow host orders the occurrences and cuts the stream where
one sequential pass would; each output shard is a runner task that reads its
pieces from the token file and writes its .bin and .idx.parquet (the same
bytes for any number of workers).
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from manifests.atomic import atomic_write_bytes, atomic_write_parquet
from manifests.corpus import (CORPUS_FILE, filters_by_source, ingested_by_source, locate_corpus_manifest, read_corpus_manifest, source_of_id,
                              source_provenance, write_corpus_manifest)
from manifests.digest import sha256_file
from manifests.run_dir import STAGE_DIR_RE
from manifests.stage_manifest import StageManifest, read_manifest
from tasks.corpus.encoding import token_dtype
from tasks.corpus.mixture import PLAN_FILE, TABLE_FILE, TOKENS_FILE, encode_split_side
from tasks.corpus.split import HELD_OUT_RULE, VALIDATION, iter_split_docs, seeded_rank
from tasks.runner.stage_runner import default_workers, map_shards, run_artifact_stage
from tasks.corpus.tokenizer import EOS_TOKEN, TOKENIZER_FILE, load_tokenizer, vocab_size_of

STAGE = "shards"
VERSION = "2"  # 2: validation_documents.parquet (each held-out document's source and language)
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


@dataclass
class SideTokens:
    """One side's documents, each tokenised once: ids, where each starts in the token file and how long it is (EOS included).

    The token file is read with pread, piece by piece, not memory-mapped: at a
    million documents a mapping's touched pages (hundreds of MB) would count as
    this process's resident memory.
    """
    ids: list[str]
    starts: np.ndarray
    lengths: np.ndarray
    path: Path
    dtype: np.dtype


VALIDATION_DOCUMENTS = "validation_documents.parquet"
VALIDATION_DOCUMENTS_SCHEMA = pa.schema([("doc_id", pa.string()), ("source", pa.string()), ("lang", pa.string()), ("tokens", pa.int64())])


def write_validation_documents(split_dir: Path, side: SideTokens, path: Path) -> dict[str, Any]:
    """Each held-out document's source, language and tokens: what per-group held-out loss reads (hymo_core.eval.heldout).

    The language labels are read from the split stage's held-out side (two columns; the held-out side is small)."""
    langs = {row_id: lang for table in iter_split_docs(split_dir, VALIDATION, ["id", "lang"])
             for row_id, lang in zip(table.column("id").to_pylist(), table.column("lang").to_pylist())}
    table = pa.table({"doc_id": side.ids, "source": [source_of_id(d) for d in side.ids],
                      "lang": [langs.get(d) or "" for d in side.ids], "tokens": side.lengths.astype(np.int64)},
                     schema=VALIDATION_DOCUMENTS_SCHEMA)
    atomic_write_parquet(path, table)
    return {"path": path.name, "sha256": sha256_file(path), "rows": table.num_rows}


def planned_side(plan: pa.Table, tokens_path: Path, dtype: np.dtype) -> tuple[SideTokens, np.ndarray]:
    """The training side as the mixture stage tokenised it, and each document's repeats."""
    side = SideTokens(plan.column("id").to_pylist(), plan.column("offset").to_numpy(), plan.column("tokens").to_numpy(), tokens_path, dtype)
    return side, plan.column("repeats").to_numpy()


def occurrence_order(ids: list[str], repeats: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(document index, repeat k) of every occurrence in epoch-major seeded order: all first occurrences shuffled, then all second ones, ..."""
    doc = np.repeat(np.arange(len(ids)), repeats)
    k = np.arange(len(doc)) - np.repeat(np.cumsum(repeats) - repeats, repeats)
    rank = np.fromiter((int(seeded_rank(seed, f"{ids[d]}\x00{r}"), 16) for d, r in zip(doc.tolist(), k.tolist())), dtype=np.uint64, count=len(doc))
    order = np.lexsort((rank, k))
    return doc[order], k[order]


@dataclass(frozen=True)
class ShardLayout:
    """One output shard's share of the occurrence stream: its occurrences (document id, where the document starts
    in the token file, its length, which repeat) and how many tokens of the first one the shard before holds.
    What a shard task gets: a slice of the stream, never the whole plan."""

    name: str
    ids: list[str]
    starts: np.ndarray
    lengths: np.ndarray
    repeats: np.ndarray
    first_done: int
    tokens: int


def plan_layout(side: SideTokens, doc: np.ndarray, repeat: np.ndarray, tokens_per_shard: int, prefix: str) -> list[ShardLayout]:
    """Cut the occurrence stream into shards of `tokens_per_shard` tokens (the last one shorter), as one sequential pass would."""
    lengths = side.lengths[doc].astype(np.int64)
    ends = np.cumsum(lengths)
    begins = ends - lengths
    total = int(ends[-1]) if len(ends) else 0
    layouts = []
    for index, low in enumerate(range(0, total, tokens_per_shard)):
        high = min(low + tokens_per_shard, total)
        first, last = int(np.searchsorted(ends, low, side="right")), int(np.searchsorted(begins, high, side="left"))
        mine = doc[first:last]
        layouts.append(ShardLayout(f"{prefix}-{index:05d}", [side.ids[d] for d in mine.tolist()], side.starts[mine], side.lengths[mine],
                                   repeat[first:last], low - int(begins[first]), high - low))
    return layouts


def write_shard(layout: ShardLayout, tokens_path: str, dtype_name: str, out_dir: str) -> dict[str, Any]:
    """Task: one shard's .bin (its tokens, read piece by piece with pread) and .idx.parquet (one row per piece)."""
    dtype = np.dtype(dtype_name)
    buffer = np.empty(layout.tokens, dtype=dtype)
    index: dict[str, list] = {name: [] for name in INDEX_SCHEMA.names}
    fill = 0
    handle = os.open(tokens_path, os.O_RDONLY)
    try:
        for position, (doc_id, start, length, k) in enumerate(zip(layout.ids, layout.starts.tolist(), layout.lengths.tolist(), layout.repeats.tolist())):
            done = layout.first_done if position == 0 else 0
            piece = min(int(length) - done, layout.tokens - fill)
            buffer[fill:fill + piece] = np.frombuffer(os.pread(handle, piece * dtype.itemsize, (int(start) + done) * dtype.itemsize), dtype=dtype)
            for column, value in zip(INDEX_SCHEMA.names, (doc_id, fill, piece, done, k)):
                index[column].append(value)
            fill += piece
    finally:
        os.close(handle)
    if fill != layout.tokens:
        raise ValueError(f"{tokens_path}: shard {layout.name} got {fill} tokens where {layout.tokens} were planned; nothing was published")
    bin_path, idx_path = Path(out_dir) / f"{layout.name}.bin", Path(out_dir) / f"{layout.name}.idx.parquet"
    atomic_write_bytes(bin_path, buffer.tobytes())
    atomic_write_parquet(idx_path, pa.table(index, schema=INDEX_SCHEMA))
    return {"name": layout.name, "tokens": fill, "documents": len(index["doc_id"]), "sha256": sha256_file(bin_path),
            "index_sha256": sha256_file(idx_path)}


def write_stream(side: SideTokens, doc: np.ndarray, repeat: np.ndarray, tokens_per_shard: int, out_dir: Path, prefix: str,
                 workers: int = 1) -> list[dict[str, Any]]:
    """Cut the occurrence stream into bounded shards, one runner task per shard; one .bin and one .idx.parquet each, in order."""
    layouts = plan_layout(side, doc, repeat, tokens_per_shard, prefix)
    jobs = [(layout, str(side.path), side.dtype.str, str(out_dir)) for layout in layouts]
    return sorted(map_shards(write_shard, jobs, workers, f"shards: {prefix}", [layout.tokens for layout in layouts]), key=lambda s: s["name"])


def pack_side(side: SideTokens, repeats: np.ndarray, config: ShardsConfig, work_dir: Path, prefix: str, workers: int = 1) -> list[dict[str, Any]]:
    """Lay out one side's occurrences and write its shards; the shard listing for the corpus manifest."""
    written = write_stream(side, *occurrence_order(side.ids, repeats, config.seed), config.tokens_per_shard, work_dir / "tokens", prefix, workers)
    return [{"path": f"tokens/{shard['name']}.bin", "sha256": shard["sha256"], "tokens": shard["tokens"], "documents": shard["documents"],
             "index_path": f"tokens/{shard['name']}.idx.parquet", "index_sha256": shard["index_sha256"]} for shard in written]


def build_shards(split_dir: Path, tokenizer_dir: Path, mixture_dir: Path, config: ShardsConfig, work_dir: Path,
                 workers: int | None = None) -> tuple[list[tuple[str, int | None]], dict[str, Any]]:
    workers = workers or default_workers()
    tokenizer_manifest, mixture_manifest = read_manifest(tokenizer_dir), read_manifest(mixture_dir)
    shutil.copyfile(tokenizer_manifest.directory / TOKENIZER_FILE, work_dir / TOKENIZER_FILE)  # the corpus dir is self-contained
    tokenizer = load_tokenizer(work_dir / TOKENIZER_FILE)
    vocab_size = vocab_size_of(tokenizer)
    dtype = token_dtype(vocab_size)
    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    plan = pq.read_table(mixture_manifest.directory / PLAN_FILE)
    (work_dir / "tokens").mkdir()

    train_side, repeats = planned_side(plan, mixture_manifest.directory / TOKENS_FILE, dtype)
    train = pack_side(train_side, repeats, config, work_dir, "train", workers)
    cache = work_dir / f".{VALIDATION}.cache"
    validation_counts = encode_split_side(Path(split_dir), VALIDATION, work_dir / TOKENIZER_FILE, cache, workers)  # runner tasks, per shard
    lengths = validation_counts.column("tokens").to_numpy()
    validation_side = SideTokens(validation_counts.column("id").to_pylist(), np.cumsum(lengths) - lengths, lengths, cache, dtype)
    validation = pack_side(validation_side, np.ones(len(validation_side.ids), np.int64), config, work_dir, VALIDATION, workers)
    validation_tokens = dict(zip(validation_side.ids, validation_side.lengths.tolist()))
    documents_table = write_validation_documents(Path(split_dir), validation_side, work_dir / VALIDATION_DOCUMENTS)
    del validation_side
    cache.unlink()
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
                       "tokens": sum(validation_tokens.values()), "by_source": validation_by_source,
                       "documents_table": documents_table},
        "seed": config.seed,
    }
    corpus = write_corpus_manifest(work_dir / CORPUS_FILE, payload)
    artifacts: list[tuple[str, int | None]] = [(TOKENIZER_FILE, vocab_size), (CORPUS_FILE, None), (VALIDATION_DOCUMENTS, documents_table["rows"])]
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


def run_shards(config: ShardsConfig, split_dir: Path, tokenizer_dir: Path, mixture_dir: Path, out_dir: Path,
               workers: int | None = None) -> StageManifest:
    inputs = [Path(split_dir), Path(tokenizer_dir), Path(mixture_dir)]
    return run_artifact_stage(STAGE, VERSION, asdict(config), inputs, Path(out_dir),
                              lambda work_dir: build_shards(*inputs, config, work_dir, workers))
