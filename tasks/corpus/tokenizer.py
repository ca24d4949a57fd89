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
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from manifests.atomic import atomic_write_text
from manifests.digest import sha256_file
from tasks.corpus.encoding import encode_texts
from manifests.stage_manifest import StageManifest
from tasks.corpus.split import iter_split_docs, seeded_rank
from tasks.runner.stage_runner import report_progress, run_artifact_stage

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


def round_trip_failures(tokenizer, ids: list[str], texts: list[str]) -> list[str]:
    decoded = tokenizer.decode_batch(encode_texts(tokenizer, texts), skip_special_tokens=False)
    return [doc_id for doc_id, text, back in zip(ids, texts, decoded) if text != back]


def compression(tokenizer, texts: list[str]) -> dict[str, float]:
    """Lab 2's diagnostics: characters per token and tokens per whitespace word."""
    tokens = sum(map(len, encode_texts(tokenizer, texts)))
    chars = sum(len(t) for t in texts)
    words = sum(len(t.split()) for t in texts)
    return {"documents": len(texts), "chars": chars, "tokens": tokens,
            "chars_per_token": round(chars / tokens, 4) if tokens else 0.0,
            "tokens_per_word": round(tokens / words, 4) if words else 0.0}


def sample_mixture(split_dir: Path, weights: dict[str, float], config: TokenizerConfig) -> dict[str, tuple[list[str], list[str]]]:
    """Per source, training documents in seeded order up to its weighted share of `sample_chars`.

    Two passes over the training side, a shard at a time: ranks and lengths
    first (no text kept), then only the chosen documents' texts, so memory
    follows the sample budget, not the corpus.
    """
    ranked: dict[str, list[tuple[str, str, int]]] = {}
    for table in iter_split_docs(split_dir, "train", ["id", "source", "text"]):
        lengths = pc.utf8_length(table.column("text")).to_pylist()  # code points, as len(str)
        for doc_id, source, length in zip(table.column("id").to_pylist(), table.column("source").to_pylist(), lengths):
            ranked.setdefault(source, []).append((seeded_rank(config.seed, doc_id), doc_id, length))
    chars = {s: sum(length for _, _, length in rows) for s, rows in ranked.items()}
    total = sum(chars.values())
    if weights:
        given = sum(weights.get(s, 0.0) for s in ranked)
        shares = {s: weights.get(s, 0.0) / given if given else 0.0 for s in ranked}
    else:
        shares = {s: chars[s] / total if total else 0.0 for s in ranked}
    budget = min(config.sample_chars, total)
    chosen: dict[str, list[str]] = {}
    for source, rows in sorted(ranked.items()):
        rows.sort()
        ids, taken = [], 0
        for _, doc_id, length in rows:
            if taken >= shares[source] * budget:
                break
            ids.append(doc_id)
            taken += length
        chosen[source] = ids
    del ranked
    wanted = pa.array(sorted(doc_id for ids in chosen.values() for doc_id in ids), pa.string())
    text_of: dict[str, str] = {}
    for table in iter_split_docs(split_dir, "train", ["id", "text"]):
        picked = table.filter(pc.is_in(table.column("id"), value_set=wanted))
        text_of.update(zip(picked.column("id").to_pylist(), picked.column("text").to_pylist()))
    return {source: (ids, [text_of[doc_id] for doc_id in ids]) for source, ids in chosen.items()}


def train_tokenizer_files(split_dir: Path, weights: dict[str, float], config: TokenizerConfig, work_dir: Path) -> tuple[list[tuple[str, int | None]], dict[str, Any]]:
    report_progress("sampling documents")
    sample = sample_mixture(split_dir, weights, config)
    texts = [t for _, source_texts in sample.values() for t in source_texts]
    if not texts:
        raise ValueError(f"{split_dir}: no training documents to train a tokenizer on")
    report_progress("training BPE")
    tokenizer = build_tokenizer(texts, config)
    report_progress("round-trip check")
    failed = round_trip_failures(tokenizer, [i for ids, _ in sample.values() for i in ids], texts)
    if failed:
        raise ValueError(f"tokenizer round trip changed {len(failed)} sampled documents, e.g. {failed[:3]}")
    tokenizer_path = work_dir / TOKENIZER_FILE
    tokenizer.save(str(tokenizer_path))
    report_progress("compression")
    per_source = {source: compression(tokenizer, source_texts) for source, (_, source_texts) in sample.items()}
    identity = {
        "path": TOKENIZER_FILE,
        "sha256": sha256_file(tokenizer_path),
        "vocab_size": vocab_size_of(tokenizer),
        "eos_token": EOS_TOKEN,
        "eos_id": tokenizer.token_to_id(EOS_TOKEN),
        "special_tokens": list(config.special_tokens),
        "byte_fallback_layout": config.byte_fallback_layout,
        # not stored in tokenizer.json: load with tasks.corpus.tokenizer.load_tokenizer or set it yourself
        "documents_encoded_with": {"encode_special_tokens": True, "add_special_tokens": False},
        "round_trip_documents": len(texts),
    }
    stats = {"tokenizer": identity, "sample_by_source": per_source, "overall": compression(tokenizer, texts)}
    atomic_write_text(work_dir / STATS_FILE, json.dumps(stats, indent=2, ensure_ascii=False) + "\n")
    return [(TOKENIZER_FILE, identity["vocab_size"]), (STATS_FILE, len(per_source))], stats


def run_tokenizer(config: TokenizerConfig, split_dir: Path, out_dir: Path, weights: dict[str, float] | None = None) -> StageManifest:
    """`weights` are the mixture's source weights: part of the cache key, since they shape the sample."""
    weights = dict(weights or {})
    keyed = {"tokenizer": asdict(config), "mixture_weights": weights}
    return run_artifact_stage(STAGE, VERSION, keyed, [Path(split_dir)], Path(out_dir),
                              lambda work_dir: train_tokenizer_files(Path(split_dir), weights, config, work_dir))
