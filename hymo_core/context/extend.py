"""`hymo extend CKPT --seq-len N`: continue a checkpoint at a longer window, then re-test it at both lengths.

Seed 001 extends context with a data plan and a position plan together, tests retrieval across the
whole window, and re-tests short context ("结合数据和位置方案扩展上下文"). In order:

1. position: the checkpoint's weights in a model at window N with the RoPE change of
   `--position` (hymo_core/context/position.py); GDN layers need none;
2. measure before: needle retrieval at N for the checkpoint as it is (RoPE extrapolated past its
   window) and for the position change alone, and the short-context held-out loss at the
   checkpoint's own window (hymo_core/eval/heldout.py);
3. data: train `steps` updates on windows of N tokens inside documents at least that long
   (hymo_core/context/long_documents.py), with a fresh optimizer and a short warmup;
4. measure after, the same way on the same trials; write checkpoints/step-*.pt (loadable by every
   command: the window and RoPE change live in its model config), extend.json and metrics.jsonl.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from hymo_core.checkpoint.load import load_model
from hymo_core.checkpoint.single import save_checkpoint
from hymo_core.context.long_documents import LongDocumentLoader, long_document_windows
from hymo_core.context.needle import needle_retrieval
from hymo_core.context.position import extended_config
from hymo_core.eval.heldout import HeldOutSet
from hymo_core.models.model import Transformer
from hymo_core.train.config import METRICS_FILE, TrainConfig
from hymo_core.train.data import CorpusError, CorpusReader
from hymo_core.train.optim import build_optimizer
from hymo_core.train.trainer import TrainHooks, TrainState, train

EXTEND_FILE = "extend.json"


def _filler(reader: CorpusReader, seq_len: int, limit: int = 64) -> np.ndarray:
    """Up to `limit` validation windows of seq_len tokens, each inside one long document."""
    shards, windows, _ = long_document_windows(reader, "validation", seq_len)
    if len(windows) == 0:
        raise CorpusError(f"{reader.path}: no validation document holds {seq_len + 1} tokens; the needle test needs one")
    return np.stack([np.asarray(shards[s][o:o + seq_len], dtype=np.int64) for s, o in windows[:limit]])


@torch.no_grad()
def long_loss(model: torch.nn.Module, filler_WT: np.ndarray, device: torch.device, buckets: int = 4) -> dict[str, Any]:
    """Mean next-token loss on long-document windows, overall and per quarter of the window."""
    model.eval()
    x = torch.from_numpy(filler_WT).to(device)
    logits, _ = model(x[:, :-1])
    ce_WT = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), x[:, 1:], reduction="none")
    parts = [float(part.mean()) for part in ce_WT.chunk(buckets, dim=1)]
    return {"loss": float(ce_WT.mean()), "by_quarter": parts}


def _measure(model: torch.nn.Module, held: HeldOutSet, filler_WT: np.ndarray, vocab: int, device: torch.device,
             trials: int) -> dict[str, Any]:
    return {"needle": needle_retrieval(model, filler_WT, vocab, device, trials=trials),
            "long_loss": long_loss(model, filler_WT, device),
            "short_loss": held.evaluate(model, device).loss if held is not None else None}


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    temporary.replace(path)


def run_extend(checkpoint: str | Path, corpus: str | Path, out: str | Path, seq_len: int, *, position: str = "base",
               steps: int = 100, peak_lr: float | None = None, batch_size: int | None = None, warmup_steps: int = 10,
               seed: int = 0, trials: int = 32, device: torch.device | str = "cpu",
               log: Callable[[str], None] = print) -> dict[str, Any]:
    """Extend `checkpoint` to window `seq_len` on `corpus`'s long documents; returns extend.json's content."""
    out, device = Path(out), torch.device(device)
    from manifests.staleness import refuse_stale_corpus  # here, not at import: the core imports no pipeline code
    refuse_stale_corpus(corpus, "context extension")
    if (out / EXTEND_FILE).exists():
        raise FileExistsError(f"{out} already holds an extension ({EXTEND_FILE}); choose another --out")
    base, payload = load_model(checkpoint, device)
    reader = CorpusReader(corpus)
    if reader.vocab_size != base.config.vocab_size:
        raise CorpusError(f"{reader.path}: vocab_size {reader.vocab_size}, but {checkpoint} has {base.config.vocab_size}")
    base_train = TrainConfig.from_dict(payload["train_config"])
    old_window = base.config.max_seq_len
    config = extended_config(base.config, seq_len, position)
    # Batch: the base's tokens per update by default (fewer, longer windows), at least one window.
    B = batch_size or max(1, base_train.batch_size * base_train.seq_len // seq_len)
    train_config = replace(base_train, seq_len=seq_len, batch_size=B, max_steps=steps, horizon_steps=0, decay_steps=0,
                           warmup_steps=min(warmup_steps, steps // 2), peak_lr=peak_lr or base_train.peak_lr / 3,
                           muon_peak_lr=0.0, eval_interval=steps, checkpoint_interval=steps, log_interval=max(1, steps // 10),
                           gradient_accumulation_steps=1, schedule="cosine", seed=seed)
    loader = LongDocumentLoader(reader, "train", seq_len, B, seed)
    log(f"data: {loader.counts['long_documents']} of {loader.counts['documents']} train documents hold {seq_len + 1} tokens: "
        f"{loader.counts['windows']} windows")
    filler = _filler(reader, seq_len)
    short = HeldOutSet.from_corpus(reader, min(old_window, base_train.seq_len), base_train.batch_size,
                                   max_batches=base_train.eval_batches)
    state_dict = base.state_dict()
    extrapolated = Transformer(replace(base.config, max_seq_len=seq_len)).to(device)
    extrapolated.load_state_dict(state_dict)
    model = Transformer(config).to(device)
    model.load_state_dict(state_dict)
    # Short context is scored at the base's own window, where the extrapolated tables equal the base's.
    measured = {"before": _measure(extrapolated, short, filler, reader.vocab_size, device, trials)}
    measured["position_only"] = _measure(model, short, filler, reader.vocab_size, device, trials)
    del extrapolated

    out.mkdir(parents=True, exist_ok=True)
    metrics = out / METRICS_FILE
    metrics.write_text("", encoding="utf-8")

    def record(row: dict[str, Any]) -> None:
        with open(metrics, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")

    saved: list[Path] = []
    torch.manual_seed(seed)
    optimizer = build_optimizer(model, train_config.optimizer_config(device))

    def on_checkpoint(state: TrainState) -> None:
        saved.append(save_checkpoint(out / "checkpoints" / f"step-{state.step:08d}.pt", model, optimizer, state, train_config, loader))

    hooks = TrainHooks(on_log=lambda row: record({"kind": "train", **row}), on_checkpoint=on_checkpoint,
                       on_event=lambda event: record({"kind": "event", **event}))
    started = time.perf_counter()
    state = train(model, optimizer, loader, None, train_config, TrainState(), device, hooks)
    seconds = time.perf_counter() - started
    measured["after"] = _measure(model, short, filler, reader.vocab_size, device, trials)
    result = {
        "base_checkpoint": str(checkpoint), "base_step": payload["state"]["step"], "old_window": old_window, "new_window": seq_len,
        "position": position, "rope_base": config.rope_base, "rope_position_scale": config.rope_position_scale,
        "data": {**loader.counts, "split": "train", "tokens_trained": state.tokens_seen},
        "train_config": train_config.to_dict(), "model_config": asdict(config), "steps": state.step, "seconds": seconds,
        "checkpoint": str(saved[-1]) if saved else None, "measurements": measured,
        "short_loss_change": measured["after"]["short_loss"] - measured["before"]["short_loss"],
    }
    if not all(math.isfinite(v) for v in (measured["after"]["short_loss"], measured["after"]["long_loss"]["loss"])):
        raise FloatingPointError(f"{out}: the extended model's loss is not finite")
    _write_json(out / EXTEND_FILE, result)
    return result
