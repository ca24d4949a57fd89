"""Tokenizer: byte-level BPE (HF tokenizers) trained on a sample of the final mixture's training side.

Seed 001 (tokenizer section): train on a sample of the *final mixture*, since
budgets, weights and context are all counted in its tokens; reserve special
tokens for chat templates early; pad V to a multiple of 64. Seed 000 (HyMo
tokenizer): the optional layout BPE-64k + 256 byte tokens = 64,256 ids. With a
byte-level BPE every byte already has a symbol, so those 256 `<0xXX>` ids are
reserved for id-layout compatibility and never produced by `encode`.

The sample draws each source's share of characters in proportion to its
mixture weight (natural proportions when no weights are given), from training
documents only: validation text never shapes the merges. Every sampled
document must survive encode -> decode unchanged, or the stage fails naming it.
Sampling is two passes of runner tasks over the split shards (a by-hash
sample: each document's seeded rank decides, wherever it sits), so the flow
host holds the sample, not the corpus; BPE training itself runs on the host,
over the sample only.

With `from_file` the stage adopts a tokenizer trained elsewhere (a base
model's, an earlier run's) instead of training one: the file is published as
it is, its sha256 joins the cache key, and the round trip and compression are
measured on a smaller by-hash sample (`check_chars`): whether a tokenizer
round-trips is a property of its normalizer and pre-tokenizer, which a few
million characters show; the merges need the large sample, and are not made.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc

from manifests.atomic import atomic_write_text
from manifests.digest import sha256_file
from tasks.corpus.encoding import encode_texts
from manifests.stage_manifest import StageManifest
from manifests.stage_manifest import read_manifest
from tasks.corpus.split import seeded_rank, split_side_of_shard
from tasks.runner.stage_runner import default_workers, map_shards, report_progress, run_artifact_stage

STAGE = "tokenizer"
VERSION = "1"
TOKENIZER_FILE = "tokenizer.json"
STATS_FILE = "tokenizer_stats.json"
EOS_TOKEN = "<|endoftext|>"
BYTE_TOKENS = tuple(f"<0x{b:02X}>" for b in range(256))


@dataclass(frozen=True)
class TokenizerConfig:
    vocab_size: int = 8192  # BPE part incl. specials; sample default (seed 001: 32k English, 100k+ multilingual)
    # EOS first (id 0), then ids a later chat template needs (seed 001 -> module 09).
    special_tokens: tuple[str, ...] = (EOS_TOKEN, "<|pad|>", "<|im_start|>", "<|im_end|>", "<|system|>", "<|user|>", "<|assistant|>")
    pad_to_multiple: int = 64  # seed 001: V a multiple of 64 or 128 for kernel efficiency
    byte_fallback_layout: bool = False  # seed 000: append 256 <0xXX> ids after the BPE part
    min_frequency: int = 2
    sample_chars: int = 20_000_000  # characters of training text the BPE trainer sees
    seed: int = 0
    # A trained tokenizer.json to adopt instead of training one (a base model's, an earlier run's NN_tokenizer/):
    # it must hold EOS_TOKEN; vocab_size, special_tokens, padding and byte_fallback_layout then describe nothing.
    from_file: str = ""
    check_chars: int = 2_000_000  # with from_file: characters of the by-hash sample checked for round trip and compression


def build_tokenizer(texts: list[str], config: TokenizerConfig):
    """Train the byte-level BPE and lay out its ids: specials, merges, [byte ids], padding."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        min_frequency=config.min_frequency,
        special_tokens=list(config.special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    if config.byte_fallback_layout:
        tokenizer.add_special_tokens(list(BYTE_TOKENS))
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    padding = (-size) % config.pad_to_multiple
    tokenizer.add_special_tokens([f"<|reserved_{i}|>" for i in range(padding)])
    # A document that literally contains "<|endoftext|>" must stay text, not become an EOS.
    tokenizer.encode_special_tokens = True
    return tokenizer


def load_tokenizer(path: Path):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.encode_special_tokens = True
    return tokenizer


@lru_cache(maxsize=2)
def checked_tokenizer(path: str, expected_sha256: str):
    """The tokenizer a worker was sent as a file and its sha256: checked, then loaded once per process and content."""
    actual = sha256_file(Path(path))
    if actual != expected_sha256:
        raise ValueError(f"{path}: tokenizer sha256 {actual[:12]}… but the stage planned with {expected_sha256[:12]}…; "
                         "the file changed or the shared mount serves another copy")
    return load_tokenizer(Path(path))


def vocab_size_of(tokenizer) -> int:
    """Ids in use, added tokens included: the number a model's embedding and the shard dtype must cover."""
    return max(tokenizer.get_vocab(with_added_tokens=True).values()) + 1


def round_trip_failures(tokenizer, ids: list[str], texts: list[str], encoded: list[list[int]] | None = None) -> list[str]:
    """Ids of the texts that decode(encode(text)) changes; `encoded`: their ids, when the caller has them already."""
    decoded = tokenizer.decode_batch(encode_texts(tokenizer, texts) if encoded is None else encoded, skip_special_tokens=False)
    return [doc_id for doc_id, text, back in zip(ids, texts, decoded) if text != back]


def compression(texts: list[str], tokens_per_text: list[int]) -> dict[str, float]:
    """Lab 2's diagnostics: characters per token and tokens per whitespace word."""
    tokens = sum(tokens_per_text)
    chars = sum(len(t) for t in texts)
    words = sum(len(t.split()) for t in texts)
    return {"documents": len(texts), "chars": chars, "tokens": tokens,
            "chars_per_token": round(chars / tokens, 4) if tokens else 0.0,
            "tokens_per_word": round(tokens / words, 4) if words else 0.0}


RANK_BUCKETS = 1 << 16  # the sample's first pass counts characters per source by the top 16 bits of each document's rank


def rank_buckets(doc_ids: list[str], seed: int) -> tuple[list[str], np.ndarray]:
    """Each id's seeded rank (fixed-width hex) and its bucket (the rank's top 16 bits)."""
    ranks = [seeded_rank(seed, doc_id) for doc_id in doc_ids]
    return ranks, np.fromiter((int(rank[:4], 16) for rank in ranks), dtype=np.int64, count=len(ranks))


def shard_rank_histogram(shard_path: str, shard: str, seed: int) -> dict[str, Any]:
    """Task, first pass: per source of one split shard's training side, documents and characters per rank bucket (sparse)."""
    table = split_side_of_shard(shard_path, "train", ["id", "source", "text"])
    _, buckets = rank_buckets(table.column("id").to_pylist(), seed)
    lengths = pc.utf8_length(table.column("text")).to_numpy(zero_copy_only=False).astype(np.int64)  # code points, as len(str)
    sources = np.asarray(table.column("source").to_pylist(), dtype=object)
    histograms = {}
    for source in sorted(set(sources.tolist())):
        mine = sources == source
        chars = np.bincount(buckets[mine], weights=lengths[mine], minlength=RANK_BUCKETS).astype(np.int64)
        used = np.flatnonzero(chars)
        histograms[source] = (int(mine.sum()), used, chars[used])
    return {"shard": shard, "histograms": histograms}


def shard_sample_rows(shard_path: str, shard: str, seed: int, cutoffs: dict[str, int]) -> dict[str, Any]:
    """Task, second pass: the training documents of one split shard whose rank bucket is at or below their source's cutoff:
    (source, rank, id, length, text), texts only of documents that may be in the sample."""
    table = split_side_of_shard(shard_path, "train", ["id", "source", "text"])
    ids, sources, texts = table.column("id").to_pylist(), table.column("source").to_pylist(), table.column("text").to_pylist()
    ranks, buckets = rank_buckets(ids, seed)
    rows = [(source, rank, doc_id, len(text), int(bucket), text) for source, rank, doc_id, text, bucket in zip(sources, ranks, ids, texts, buckets.tolist())
            if bucket <= cutoffs.get(source, -1)]
    return {"shard": shard, "rows": rows}


def sample_mixture(split_dir: Path, weights: dict[str, float], config: TokenizerConfig, workers: int = 1) -> dict[str, tuple[list[str], list[str]]]:
    """Per source, training documents in seeded order up to its weighted share of `sample_chars`.

    Two passes of runner tasks, one per split shard, and no tuple per document
    anywhere: the first returns characters per source and rank bucket; the flow
    host finds, per source, the bucket where its share is reached; the second
    returns only the documents of the buckets up to it, texts included, so the
    host's memory follows the sample budget (plus one bucket, 1/65,536 of a
    source, ordered exactly), not the corpus. The same documents as sorting
    every (rank, id) of a source and taking them while under its share.
    """
    upstream = read_manifest(split_dir, verify=False)
    data_files = upstream.files("data")
    jobs = [(str(upstream.path_of(f)), Path(f.path).stem, config.seed) for f in data_files]
    sizes = [f.rows or 0 for f in data_files]
    chars_by_bucket: dict[str, np.ndarray] = {}
    for result in map_shards(shard_rank_histogram, jobs, workers, "sampling: lengths", sizes):
        for source, (_, used, chars) in result["histograms"].items():
            chars_by_bucket.setdefault(source, np.zeros(RANK_BUCKETS, dtype=np.int64))[used] += chars
    chars = {s: int(h.sum()) for s, h in chars_by_bucket.items()}
    total = sum(chars.values())
    if weights:
        given = sum(weights.get(s, 0.0) for s in chars)
        shares = {s: weights.get(s, 0.0) / given if given else 0.0 for s in chars}
    else:
        shares = {s: chars[s] / total if total else 0.0 for s in chars}
    budget = min(config.sample_chars, total)
    targets = {s: shares[s] * budget for s in chars}
    # The share is reached inside the first bucket whose running total reaches it: every document of an earlier bucket is taken.
    running = {s: np.cumsum(h) for s, h in chars_by_bucket.items()}
    cutoffs = {s: int(np.searchsorted(running[s], targets[s], side="left")) for s in chars}
    rows_by_source: dict[str, list[tuple]] = {s: [] for s in chars}
    for result in map_shards(shard_sample_rows, [(*job, cutoffs) for job in jobs], workers, "sampling: texts", sizes):
        for row in result["rows"]:
            rows_by_source[row[0]].append(row)
    sample: dict[str, tuple[list[str], list[str]]] = {}
    for source in sorted(rows_by_source):
        rows = sorted(rows_by_source.pop(source), key=lambda row: (row[1], row[2]))
        cutoff = cutoffs[source]
        ids, texts = [], []
        taken = int(running[source][cutoff - 1]) if cutoff > 0 else 0  # the characters of the buckets before the cutoff
        for _, _, doc_id, length, bucket, text in rows:
            if bucket == cutoff:
                if taken >= targets[source]:
                    break
                taken += length
            ids.append(doc_id)
            texts.append(text)
        sample[source] = (ids, texts)
    return sample


def adopted_path(config: TokenizerConfig) -> Path:
    path = Path(config.from_file)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: tokenizer.from_file not found")
    return path


def adopted_tokenizer(config: TokenizerConfig):
    """The tokenizer in `config.from_file`, loaded as every stage loads one; it must hold the end-of-document token."""
    path = adopted_path(config)
    try:
        tokenizer = load_tokenizer(path)
    except Exception as exc:  # tokenizers raises its own exception type for a file that is not a tokenizer
        raise ValueError(f"{path}: tokenizer.from_file is not a tokenizers JSON file ({exc})") from exc
    if tokenizer.token_to_id(EOS_TOKEN) is None:
        raise ValueError(f"{path}: tokenizer.from_file has no {EOS_TOKEN} token, which ends every document in the shards")
    return tokenizer


def train_tokenizer_files(split_dir: Path, weights: dict[str, float], config: TokenizerConfig, work_dir: Path,
                          workers: int | None = None) -> tuple[list[tuple[str, int | None]], dict[str, Any]]:
    adopting = bool(config.from_file)
    if adopting:
        tokenizer = adopted_tokenizer(config)  # before sampling: a bad file fails the stage at once
        config = replace(config, sample_chars=min(config.sample_chars, config.check_chars))
    report_progress("sampling documents")
    sample = sample_mixture(split_dir, weights, config, workers or default_workers())
    texts = [t for _, source_texts in sample.values() for t in source_texts]
    if not texts:
        raise ValueError(f"{split_dir}: no training documents to {'check the tokenizer' if adopting else 'train a tokenizer'} on")
    if not adopting:
        report_progress("training BPE")
        tokenizer = build_tokenizer(texts, config)
    report_progress("round-trip check")
    # One encode of the sample serves both the round trip and the compression figures: an encode of the
    # sample costs as much as training the BPE on it.
    encoded = encode_texts(tokenizer, texts)
    tokens_per_text = [len(ids) for ids in encoded]
    failed = round_trip_failures(tokenizer, [i for ids, _ in sample.values() for i in ids], texts, encoded)
    del encoded
    if failed:
        raise ValueError(f"{config.from_file or 'tokenizer'}: round trip changed {len(failed)} sampled documents, e.g. {failed[:3]}")
    tokenizer_path = work_dir / TOKENIZER_FILE
    if adopting:
        shutil.copyfile(config.from_file, tokenizer_path)  # the file itself, so its sha256 is the one it was published with
    else:
        tokenizer.save(str(tokenizer_path))
    report_progress("compression")
    per_source, start = {}, 0
    for source, (_, source_texts) in sample.items():  # `texts` is the sources' texts in this order
        per_source[source] = compression(source_texts, tokens_per_text[start: start + len(source_texts)])
        start += len(source_texts)
    identity = {
        "path": TOKENIZER_FILE,
        "sha256": sha256_file(tokenizer_path),
        "vocab_size": vocab_size_of(tokenizer),
        "eos_token": EOS_TOKEN,
        "eos_id": tokenizer.token_to_id(EOS_TOKEN),
        "special_tokens": [t for t in config.special_tokens if tokenizer.token_to_id(t) is not None] if adopting else list(config.special_tokens),
        "byte_fallback_layout": config.byte_fallback_layout,
        # not stored in tokenizer.json: load with tasks.corpus.tokenizer.load_tokenizer or set it yourself
        "documents_encoded_with": {"encode_special_tokens": True, "add_special_tokens": False},
        "round_trip_documents": len(texts),
    }
    if adopting:
        identity["adopted_from"] = {"path": config.from_file, "sha256": identity["sha256"]}
    stats = {"tokenizer": identity, "sample_by_source": per_source, "overall": compression(texts, tokens_per_text)}
    atomic_write_text(work_dir / STATS_FILE, json.dumps(stats, indent=2, ensure_ascii=False) + "\n")
    return [(TOKENIZER_FILE, identity["vocab_size"]), (STATS_FILE, len(per_source))], stats


def run_tokenizer(config: TokenizerConfig, split_dir: Path, out_dir: Path, weights: dict[str, float] | None = None,
                  workers: int | None = None) -> StageManifest:
    """`weights` are the mixture's source weights: part of the cache key, since they shape the sample."""
    weights = dict(weights or {})
    settings = asdict(config)
    if config.from_file:  # the adopted file's content, not its path, decides the stage
        settings["from_file_sha256"] = sha256_file(adopted_path(config))
    else:  # a trained tokenizer's key is what it was before these options existed: published stages stay valid
        del settings["from_file"], settings["check_chars"]
    keyed = {"tokenizer": settings, "mixture_weights": weights}
    return run_artifact_stage(STAGE, VERSION, keyed, [Path(split_dir)], Path(out_dir),
                              lambda work_dir: train_tokenizer_files(Path(split_dir), weights, config, work_dir, workers))
