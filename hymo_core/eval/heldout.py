"""Held-out loss per source and per language, from the split stage's held-out families only.

Seed 001 ("区分来源与分布"): track held-out loss by source and by language, not
only the mixture's mean, because a large source dominates the mean and hides a
small domain's regression. The windows come from the corpus's validation side,
which the split stage chose by whole duplicate families, so no group leaks into
training.

Every validation token belongs to a document (the shard's `.idx.parquet`
rows); its groups are `source:<name>` (the id's prefix, `<source>-<hex>`) and
`lang:<code>` (the shards stage's `validation_documents.parquet`). A window
that crosses an EOS credits each token to its own document's groups, so a
small source counts wherever its tokens sit. Windows are chosen round-robin
over the groups that lead them (the document of a window's first target), so
the budget of `eval_batches` batches reaches the small groups too. Bits per
byte divide by the tokens' own byte counts (byte-level BPE: each vocabulary
entry's length; special tokens 0), so it compares across tokenizers.

The interface is written down in /work/notes/heldout-api.md for the other
streams (ablations, CPT) that read it.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from hymo_core.train.data import CorpusReader, _gather, _window_table

ALL = "all"
# `hymo eval`'s default held-out set: the corpus's own, not a checkpoint's eval_batches, so two checkpoints of one
# corpus (and one window length) are scored on the same windows. Up to this many target tokens, chosen balanced.
CORPUS_HELDOUT_TOKENS = 262_144
UNKNOWN_LANG = "unknown"
VALIDATION = "validation"
LN2 = math.log(2.0)


def byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's printable stand-in for each byte (GPT-2's table): char -> byte value."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def token_byte_lengths(tokenizer_path: Path, vocab_size: int) -> np.ndarray | None:
    """UTF-8 bytes each token id stands for; None when the tokenizer is not byte-level BPE."""
    try:
        payload = json.loads(Path(tokenizer_path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    vocab = (payload.get("model") or {}).get("vocab")
    if not isinstance(vocab, dict):
        return None
    alphabet = byte_level_alphabet()
    lengths = np.zeros(vocab_size, dtype=np.int64)
    for token, index in vocab.items():
        if index < vocab_size:
            if any(ch not in alphabet for ch in token):
                return None  # not byte-level: no exact byte count per token
            lengths[index] = len(token)
    for added in payload.get("added_tokens", []):
        if added.get("special") and added["id"] < vocab_size:
            lengths[added["id"]] = 0  # EOS and friends stand for no text
    return lengths


def source_of(doc_id: str) -> str:
    """Ingestion ids are `<source>-<16 hex>` (manifests.corpus.source_of_id): the source survives without a join."""
    return doc_id.rsplit("-", 1)[0]


@dataclass
class ShardLabels:
    """Per validation shard: where each document piece starts and its source / language group numbers."""

    starts: np.ndarray  # piece offsets, ascending
    source_code: np.ndarray  # index into HeldOutSet.groups
    lang_code: np.ndarray

    def codes_at(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        row = np.searchsorted(self.starts, positions, side="right") - 1
        return self.source_code[row], self.lang_code[row]


def _document_langs(reader: CorpusReader) -> dict[str, str]:
    entry = (reader.manifest.get("validation") or {}).get("documents_table")
    if not entry:
        return {}
    import pyarrow.parquet as pq

    table = pq.read_table(reader.root / entry["path"], columns=["doc_id", "lang"])
    return dict(zip(table.column("doc_id").to_pylist(), table.column("lang").to_pylist()))


def _shard_labels(reader: CorpusReader, split: str, groups: dict[str, int]) -> list[ShardLabels] | None:
    """Group numbers of every validation document piece; None when the shards carry no index."""
    entries = reader.shard_entries(split)
    if not entries or any(not e.get("index_path") for e in entries):
        return None
    import pyarrow.parquet as pq

    langs = _document_langs(reader)
    labels = []
    for entry in entries:
        index = pq.read_table(reader.root / entry["index_path"], columns=["doc_id", "offset"])
        doc_ids = index.column("doc_id").to_pylist()
        source = np.array([groups.setdefault(f"source:{source_of(d)}", len(groups)) for d in doc_ids], dtype=np.int64)
        lang = np.array([groups.setdefault(f"lang:{langs.get(d) or UNKNOWN_LANG}", len(groups)) for d in doc_ids], dtype=np.int64)
        labels.append(ShardLabels(index.column("offset").to_numpy().astype(np.int64), source, lang))
    return labels


def _round_robin(leaders: dict[int, np.ndarray], budget: int) -> np.ndarray:
    """Up to `budget` window numbers: each group's next unpicked window in turn (groups ordered by number)."""
    picked: list[int] = []
    taken: set[int] = set()
    cursors = {group: 0 for group in leaders}
    while len(picked) < budget and cursors:
        for group in sorted(cursors):
            windows = leaders[group]
            while cursors[group] < len(windows) and int(windows[cursors[group]]) in taken:
                cursors[group] += 1
            if cursors[group] >= len(windows):
                del cursors[group]
                continue
            window = int(windows[cursors[group]])
            taken.add(window)
            picked.append(window)
            if len(picked) == budget:
                break
    return np.sort(np.asarray(picked, dtype=np.int64))


@dataclass
class HeldOutSet:
    """Chosen validation windows and, per target token, the group numbers it counts for."""

    seq_len: int
    batch_size: int
    groups: list[str]  # "all" first, then sorted names; position = group number
    windows: np.ndarray  # (W, 2) shard, offset
    shards: list[Any]
    source_codes_WT: np.ndarray | None  # group number of each target token's source (None: only "all")
    lang_codes_WT: np.ndarray | None
    token_bytes_V: np.ndarray | None
    selection: str = "prefix"
    max_batches: int | None = field(default=None)

    @classmethod
    def from_corpus(cls, reader: CorpusReader, seq_len: int, batch_size: int, max_batches: int | None = None,
                    balanced: bool = True, split: str = VALIDATION, windows: int | None = None) -> "HeldOutSet":
        """`max_batches` batches of validation windows (all of them when None); `balanced`: round-robin over the groups.
        `windows`: exactly this many windows (at most all), whatever the batch size: a set that batching does not change."""
        shards, table = _window_table(reader, split, seq_len)
        numbers: dict[str, int] = {ALL: 0}
        labels = _shard_labels(reader, split, numbers)
        if windows is not None:
            budget = min(len(table), windows)
        else:
            budget = len(table) if max_batches is None else min(len(table), max_batches * batch_size)
            budget -= budget % batch_size if budget >= batch_size else 0
        if labels is not None and balanced and budget < len(table):
            first_targets = table[:, 1] + 1
            lead_source = np.empty(len(table), np.int64)
            lead_lang = np.empty(len(table), np.int64)
            for shard, label in enumerate(labels):
                mask = table[:, 0] == shard
                lead_source[mask], lead_lang[mask] = label.codes_at(first_targets[mask])
            leaders = {g: np.flatnonzero((lead_source == g) | (lead_lang == g)) for g in range(1, len(numbers))}
            chosen = _round_robin({g: w for g, w in leaders.items() if len(w)}, budget)
            selection = "balanced"
        else:
            chosen, selection = np.arange(budget, dtype=np.int64), "prefix"
        windows = table[chosen]
        # Renumber groups so that names sort ("all" first) and codes follow.
        names = [ALL] + sorted(n for n in numbers if n != ALL)
        remap = np.zeros(len(numbers), np.int64)
        for name, old in numbers.items():
            remap[old] = names.index(name)
        source_codes = lang_codes = None
        if labels is not None:
            offsets_T = np.arange(1, seq_len + 1)
            source_codes = np.empty((len(windows), seq_len), np.int64)
            lang_codes = np.empty((len(windows), seq_len), np.int64)
            for row, (shard, offset) in enumerate(windows):
                s, lang = labels[int(shard)].codes_at(int(offset) + offsets_T)
                source_codes[row], lang_codes[row] = remap[s], remap[lang]
        tokenizer = (reader.manifest.get("tokenizer") or {}).get("path")
        token_bytes = token_byte_lengths(reader.root / tokenizer, reader.vocab_size) if tokenizer else None
        return cls(seq_len, batch_size, names, windows, shards, source_codes, lang_codes, token_bytes, selection,
                   max_batches=max_batches)

    @classmethod
    def corpus_default(cls, reader: CorpusReader, seq_len: int, batch_size: int) -> "HeldOutSet":
        """The corpus's fixed held-out set for windows of `seq_len`: every validation window up to CORPUS_HELDOUT_TOKENS
        target tokens, chosen balanced. Count and positions depend on the corpus and the window length only."""
        held = cls.from_corpus(reader, seq_len, batch_size, windows=max(1, CORPUS_HELDOUT_TOKENS // seq_len))
        held.selection = f"the corpus's fixed set, {held.selection}"
        return held

    def __len__(self) -> int:
        return len(self.windows)

    def evaluate(self, model: nn.Module, device: torch.device, precision: str = "fp32", runtime: Any = None) -> "HeldOutResult":
        """What the trainer calls at each eval interval (it knows this set only by this method)."""
        return evaluate_heldout(model, self, device, precision, runtime)

    def batch_count(self) -> int:
        return -(-len(self.windows) // self.batch_size)

    def batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor, slice]:
        """(x_BT, y_BT, rows) of batch `index` in selection order; the last may hold fewer than batch_size windows."""
        rows = slice(index * self.batch_size, (index + 1) * self.batch_size)
        x_BT, y_BT = _gather(self.shards, self.windows[rows], self.seq_len)
        return x_BT, y_BT, rows

    def batches(self):
        for index in range(self.batch_count()):
            yield self.batch(index)


@dataclass
class HeldOutResult:
    groups: dict[str, dict[str, Any]]  # name -> {"loss", "bpb", "tokens", "bytes"}
    window_losses: list[float]  # mean CE per selected window, in selection order
    token_losses_WT: torch.Tensor | None = None  # fp32 CE of every target token (CPU), when asked for


    @property
    def loss(self) -> float:
        return self.groups[ALL]["loss"]

    def to_record(self) -> dict[str, Any]:
        return {"val_loss": self.loss, "val_bpb": self.groups[ALL]["bpb"],
                "groups": {name: {k: row[k] for k in ("loss", "bpb", "tokens")} for name, row in self.groups.items() if name != ALL}}


@torch.no_grad()
def evaluate_heldout(model: nn.Module, held: HeldOutSet, device: torch.device, precision: str = "fp32",
                     runtime: Any = None, token_losses: bool = False) -> HeldOutResult:
    """Loss and bits per byte of every group; sums stay on the device until one read at the end.

    Like `trainer.evaluate`: the model's mode, its attention probe and every RNG
    are restored afterwards, even when a forward fails. Over W ranks (`runtime`),
    rank r scores batches r, r + W, ... and the sums are all-reduced; every rank
    runs as many forwards (FSDP's are collective), a short rank repeating one
    that it counts zero times. `token_losses`: also every target token's fp32 loss
    (CPT sums them per document, the unit its gate pairs on).
    """
    from hymo_core.distributed.process_group import Runtime, all_gather_objects, all_reduce_sum_
    from hymo_core.train.trainer import autocast, capture_rng, restore_rng

    runtime = runtime or Runtime(device=device)

    if len(held) == 0:
        raise ValueError("the held-out set has no window; lower batch_size / seq_len or add validation data")
    G = len(held.groups)
    was_training = model.training
    probe = any(getattr(getattr(b, "attn", None), "probe", False) for b in getattr(model, "layers", []))
    rng = capture_rng()
    model.eval()
    if probe:
        model.set_attention_probe(False)
    loss_G = torch.zeros(G, dtype=torch.float64, device=device)
    tokens_G = torch.zeros(G, dtype=torch.float64, device=device)
    bytes_G = torch.zeros(G, dtype=torch.float64, device=device)
    token_bytes = None if held.token_bytes_V is None else torch.from_numpy(held.token_bytes_V).to(device, torch.float64)
    window_losses: dict[int, torch.Tensor] = {}
    tokens_kept: dict[int, torch.Tensor] = {}
    mine = list(range(runtime.rank, held.batch_count(), runtime.world_size))
    try:
        for turn in range(-(-held.batch_count() // runtime.world_size)):
            counted = turn < len(mine)
            index = mine[turn] if counted else (mine[-1] if mine else 0)
            x_BT, y_BT, rows = held.batch(index)
            x_BT, y_BT = x_BT.to(device), y_BT.to(device)
            with autocast(device, precision):
                logits_BTV, _ = model(x_BT)
            if not counted:
                continue
            ce32_BT = F.cross_entropy(logits_BTV.float().flatten(0, 1), y_BT.flatten(), reduction="none").view_as(y_BT)
            if token_losses:
                tokens_kept[index] = ce32_BT.cpu()
            ce_BT = ce32_BT.double()
            window_losses[index] = ce_BT.mean(dim=1)
            bytes_BT = token_bytes[y_BT] if token_bytes is not None else torch.zeros_like(ce_BT)
            columns = [torch.zeros_like(y_BT)]  # group 0: every token
            if held.source_codes_WT is not None:
                columns += [torch.from_numpy(held.source_codes_WT[rows]).to(device), torch.from_numpy(held.lang_codes_WT[rows]).to(device)]
            for codes_BT in columns:
                codes = codes_BT.flatten()
                loss_G += torch.bincount(codes, weights=ce_BT.flatten(), minlength=G)
                tokens_G += torch.bincount(codes, minlength=G).double()
                bytes_G += torch.bincount(codes, weights=bytes_BT.flatten(), minlength=G)
    finally:
        model.train(was_training)
        if probe:
            model.set_attention_probe(True)
        restore_rng(rng)
    sums = all_reduce_sum_(torch.stack([loss_G, tokens_G, bytes_G])).cpu().tolist()  # the one host read of an evaluation
    groups = {}
    for g, name in enumerate(held.groups):
        loss, tokens, n_bytes = sums[0][g], int(sums[1][g]), int(sums[2][g])
        if tokens == 0:
            continue
        bpb = loss / (LN2 * n_bytes) if token_bytes is not None and n_bytes > 0 else None
        groups[name] = {"loss": loss / tokens, "bpb": bpb, "tokens": tokens, "bytes": n_bytes if token_bytes is not None else None}
    mine_losses = {index: losses.cpu().tolist() for index, losses in window_losses.items()}
    merged = {k: v for part in all_gather_objects(mine_losses) for k, v in part.items()}
    per_token = None
    if token_losses:
        kept = {k: v for part in all_gather_objects(tokens_kept) for k, v in part.items()}
        per_token = torch.cat([kept[index] for index in sorted(kept)])
    return HeldOutResult(groups, [loss for index in sorted(merged) for loss in merged[index]], per_token)
