"""Shards: pack the mixture into flat token files, write their indexes and the corpus manifest.

Seed 001 (packing; shards and loaders): documents joined with EOS into one
stream (windows may later cross an EOS, as in Lab 2), stored as flat arrays of
token ids, uint16 when every id fits in 65,536, else uint32 (little-endian
here, whatever the machine). Each unique document is tokenised once: the
training side by the mixture stage, which had to count its tokens anyway
(its train_tokens.bin, mapped here and sliced piece by piece), the validation side here,
by the same per-shard runner tasks (tasks/corpus/heldout_side.py). Mixture repeats are copies, placed in
epoch-major seeded order so a repeat never sits beside its original. A shard
holds at most `tokens_per_shard` tokens; a document crossing a boundary gets
one index row in each shard. Index rows (doc_id, offset, length, doc_start,
repeat) let `trace_token` name the document of any training token.

How it runs: the occurrence order and the cut are an external sort by runner
tasks (tasks/corpus/occurrence_stream.py), each output shard a task that reads
its pieces from the token file and writes its .bin and .idx.parquet (the same
bytes for any number of workers); the flow host holds block counts, not documents.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from manifests.corpus import (CORPUS_FILE, filters_by_source, ingested_by_source, locate_corpus_manifest, read_corpus_manifest,
                              source_counts, source_provenance, write_corpus_manifest)
from manifests.digest import sha256_file
from manifests.run_dir import STAGE_DIR_RE
from manifests.stage_manifest import StageManifest, read_manifest
from tasks.corpus.encoding import token_dtype
from tasks.corpus.heldout_side import HeldOutSide
from tasks.corpus.mixture import TABLE_FILE, TOKENS_FILE, plan_parts
from tasks.corpus.occurrence_stream import INDEX_SCHEMA, lay_out_stream
from tasks.corpus.split import HELD_OUT_RULE, VALIDATION
from tasks.runner.stage_runner import default_workers, map_shards, run_artifact_stage
from tasks.corpus.tokenizer import EOS_TOKEN, TOKENIZER_FILE, load_tokenizer, vocab_size_of

STAGE = "shards"
VERSION = "2"  # 2: validation_documents.parquet (each held-out document's source and language)
@dataclass(frozen=True)
class ShardsConfig:
    tokens_per_shard: int = 1 << 24  # bounded files: 32 MiB at uint16 (seed 000 uses 50 M-token shards)
    seed: int = 0  # order of document occurrences in the stream


VALIDATION_DOCUMENTS = "validation_documents.parquet"
def pack_side(plan_parts: list[Path], tokens_path: Path, dtype: np.dtype, config: ShardsConfig, work_dir: Path, prefix: str,
              workers: int = 1) -> list[dict[str, Any]]:
    """Lay out one side's occurrences and write its shards; the shard listing for the corpus manifest."""
    written = lay_out_stream(plan_parts, tokens_path, dtype, config.tokens_per_shard, config.seed, work_dir / "tokens", prefix,
                             work_dir / f"_{prefix}_stream", workers)
    return [{"path": f"tokens/{shard['name']}.bin", "sha256": shard["sha256"], "tokens": shard["tokens"], "documents": shard["documents"],
             "index_path": f"tokens/{shard['name']}.idx.parquet", "index_sha256": shard["index_sha256"]} for shard in written]


def documents_by_source(plan_parts: list[Path], workers: int = 1) -> dict[str, int]:
    """Training documents per source: one runner task per plan part counts its source column; the host sums them."""
    counts: dict[str, int] = {}
    for rows in map_shards(source_counts, [(str(part),) for part in plan_parts], workers, "shards: documents per source", [1] * len(plan_parts)):
        for row in rows:
            counts[row["values"]] = counts.get(row["values"], 0) + row["counts"]
    return dict(sorted(counts.items()))


def build_shards(split_dir: Path, tokenizer_dir: Path, mixture_dir: Path, config: ShardsConfig, work_dir: Path,
                 workers: int | None = None) -> tuple[list[tuple[str, int | None]], dict[str, Any]]:
    workers = workers or default_workers()
    tokenizer_manifest, mixture_manifest = read_manifest(tokenizer_dir), read_manifest(mixture_dir)
    shutil.copyfile(tokenizer_manifest.directory / TOKENIZER_FILE, work_dir / TOKENIZER_FILE)  # the corpus dir is self-contained
    tokenizer = load_tokenizer(work_dir / TOKENIZER_FILE)
    vocab_size = vocab_size_of(tokenizer)
    dtype = token_dtype(vocab_size)
    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    plan = plan_parts(mixture_manifest)
    (work_dir / "tokens").mkdir()

    train = pack_side(plan, mixture_manifest.directory / TOKENS_FILE, dtype, config, work_dir, "train", workers)
    heldout = HeldOutSide(Path(split_dir), work_dir / TOKENIZER_FILE, work_dir, workers)  # runner tasks, per split shard
    try:
        validation = pack_side(heldout.plan_parts, heldout.tokens_path, dtype, config, work_dir, VALIDATION, workers)
        documents_table = heldout.write_documents(work_dir / VALIDATION_DOCUMENTS)
    finally:
        heldout.close()
    validation_by_source = heldout.by_source

    mixture_table = json.loads((mixture_manifest.directory / TABLE_FILE).read_text(encoding="utf-8"))
    tokenizer_stats = tokenizer_manifest.extra
    payload = {
        "dtype": dtype.name,
        "byte_order": "little",
        "eos_id": eos_id,
        "tokenizer": {**tokenizer_stats.get("tokenizer", {}), "path": TOKENIZER_FILE, "sha256": sha256_file(work_dir / TOKENIZER_FILE), "vocab_size": vocab_size},
        "sources": corpus_sources(Path(split_dir), documents_by_source(plan, workers), mixture_table, tokenizer_stats, validation_by_source, workers),
        "mixture": mixture_table,
        "shards": {"train": train, VALIDATION: validation},
        "train_tokens": sum(s["tokens"] for s in train),
        "validation": {"rule": HELD_OUT_RULE, "stage": Path(split_dir).name, "documents": heldout.documents,
                       "tokens": heldout.tokens, "by_source": validation_by_source,
                       "documents_table": documents_table},
        "seed": config.seed,
    }
    corpus = write_corpus_manifest(work_dir / CORPUS_FILE, payload)
    artifacts: list[tuple] = [(TOKENIZER_FILE, vocab_size), (CORPUS_FILE, None), (VALIDATION_DOCUMENTS, documents_table["rows"])]
    for shard in train + validation:  # hashed by the tasks that wrote them: not read again on the flow host
        artifacts += [(shard["path"], shard["tokens"], shard["sha256"]), (shard["index_path"], shard["documents"], shard["index_sha256"])]
    return artifacts, {"corpus_digest": corpus["digest"], "dtype": dtype.name, "train_tokens": payload["train_tokens"],
                       "validation_tokens": payload["validation"]["tokens"]}


def corpus_sources(split_dir: Path, kept_docs: dict[str, int], mixture_table: dict[str, Any], tokenizer_stats: dict[str, Any],
                   validation: dict[str, dict[str, int]], workers: int = 1) -> list[dict[str, Any]]:
    """Per source: provenance, filters with counts, kept documents/tokens, weight, epochs, compression.

    Every ingested source has a row, in the mixture's order and then ingestion's: one whose every
    document was removed keeps its licence and removal counts, with zero documents and tokens.
    The ingest and audit files are counted by runner tasks, one a file: the flow host sums per-source
    counts and reads no id (read here, they were a serial pass over every audit log of the run)."""
    run = split_dir.parent
    numbered = STAGE_DIR_RE.match(split_dir.name)

    def on_workers(fn, jobs):
        return map_shards(fn, jobs, workers, "shards: counts per source", [1] * len(jobs))

    provenance, ingested = source_provenance(run), ingested_by_source(run, on_workers)
    filters = filters_by_source(run, int(numbered.group(1)) if numbered else None, on_workers)
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
    listed = {row["source"] for row in rows}
    for name in provenance:  # every document of it removed: still on the record, with its licence and removals
        if name not in listed:
            rows.append({"source": name, **provenance[name], "documents_ingested": ingested.get(name, 0), "filters": filters.get(name, {}),
                         "train_documents": 0, "train_unique_tokens": 0, "validation_documents": 0, "validation_tokens": 0,
                         "weight": 0.0, "epochs": 0.0, "tokens_contributed": 0, "shortfall_tokens": 0,
                         "chars_per_token": None, "tokens_per_word": None})
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
