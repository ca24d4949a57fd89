"""Bits each held-out document costs a model, per document, in any tokenizer: the unit a data ablation pairs on.

A data ablation changes the corpus, so each variant trains its own tokenizer and chooses its own
validation windows: per-window losses of two variants are not over the same text. Whole documents
are. Each document is encoded with the model's own tokenizer, preceded by EOS (as packing puts it
after the previous document), and scored in consecutive windows of the model's context; its bits
(nats / ln 2 over every text token) divided by its UTF-8 bytes are bits per byte, which compare
across tokenizers (heldout.py's measure, per document). Documents rather than windows are the
pairing unit for the reason the CPT gate gives: consecutive windows of one document are correlated.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from hymo_core.eval.evaluation import encode

LN2 = math.log(2.0)


@dataclass(frozen=True)
class HeldOutDocument:
    id: str
    text: str
    source: str
    lang: str


@torch.no_grad()
def document_bits(model: nn.Module, tokenizer, eos_id: int, documents: list[HeldOutDocument], seq_len: int,
                  device: torch.device | str = "cpu", batch_size: int = 16) -> list[dict]:
    """Per document: id, source, lang, tokens, bytes, bits (of its text tokens given EOS and what precedes them)."""
    from hymo_core.train.trainer import capture_rng, restore_rng

    was_training, rng = model.training, capture_rng()
    model.eval()
    windows: list[tuple[int, list[int]]] = []  # (document index, EOS + up to seq_len tokens)
    counts = []
    for index, document in enumerate(documents):
        ids = [eos_id] + encode(tokenizer, document.text)
        counts.append(len(ids) - 1)
        for start in range(0, len(ids) - 1, seq_len):
            windows.append((index, ids[start:start + seq_len + 1]))
    bits = [0.0] * len(documents)
    try:
        by_length: dict[int, list[tuple[int, list[int]]]] = {}
        for window in windows:
            by_length.setdefault(len(window[1]), []).append(window)
        for length, group in sorted(by_length.items()):
            for start in range(0, len(group), batch_size):
                batch = group[start:start + batch_size]
                ids_BT = torch.tensor([w for _, w in batch], dtype=torch.long, device=device)
                logits_BTV, _ = model(ids_BT[:, :-1])
                nats_BT = F.cross_entropy(logits_BTV.float().flatten(0, 1), ids_BT[:, 1:].flatten(), reduction="none")
                for (index, _), nats in zip(batch, nats_BT.view(len(batch), -1).sum(dim=1).tolist()):
                    bits[index] += nats / LN2
    finally:
        model.train(was_training)
        restore_rng(rng)
    return [{"id": d.id, "source": d.source, "lang": d.lang, "tokens": counts[i], "bytes": len(d.text.encode("utf-8")),
             "bits": bits[i]} for i, d in enumerate(documents)]


def group_summary(rows: list[dict]) -> dict[str, dict]:
    """Loss (nats/token) and bits per byte over all documents and per `source:` / `lang:` group."""
    sums: dict[str, list[float]] = {}
    for row in rows:
        for group in ("all", f"source:{row['source']}", f"lang:{row['lang']}"):
            total = sums.setdefault(group, [0.0, 0, 0, 0])
            total[0] += row["bits"]
            total[1] += row["tokens"]
            total[2] += row["bytes"]
            total[3] += 1
    return {group: {"loss": bits * LN2 / max(tokens, 1), "bpb": bits / max(n_bytes, 1), "tokens": tokens, "bytes": n_bytes,
                    "documents": docs}
            for group, (bits, tokens, n_bytes, docs) in sorted(sums.items(), key=lambda kv: (kv[0] != "all", kv[0]))}
