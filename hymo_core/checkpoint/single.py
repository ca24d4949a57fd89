"""Checkpoints that hold a complete update boundary, and a loader that validates before it touches anything.

Seed 002's contract. `save_checkpoint` refuses live gradients (a checkpoint
is never half an accumulation), writes a temporary file, fsyncs it and
renames it into place, so a crash leaves either the old or the new file.
The payload is everything a bitwise continuation needs: weights, the one
optimizer's state and per-parameter layout, the counters, both loader
cursors with the corpus-manifest digest, every RNG, and a runtime signature.

`load_checkpoint` reads with `weights_only=True` (no pickled code), checks
*every* compatibility condition first, and only then restores weights,
optimizer, cursors and, last of all, RNG: a refused checkpoint leaves the
caller's objects exactly as they were.
"""
from __future__ import annotations

import json
import os
import pickle
import shutil
import zipfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn

from hymo_core.checkpoint.common import (FORMAT_VERSION, INDEX_FILE, PAYLOAD_KEYS, CheckpointError, check_compatible, checkpoint_path,
                                       fsync_dir, interned_strings, list_checkpoints, monitor_entry, optimizer_layout, optimizer_type,
                                       previous_checkpoint, rng_from_payload, rng_payload, runtime_signature, validation_cursor)
from hymo_core.checkpoint.tokenizer_identity import TOKENIZER_KEY, corpus_tokenizer_sha256
from hymo_core.train.data import TokenLoader, ValidationLoader
from hymo_core.train.config import TrainConfig
from hymo_core.train.ema import WeightEMA
from hymo_core.train.trainer import TrainState, restore_rng


def save_checkpoint(
    path: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    state: TrainState,
    config: TrainConfig,
    train_loader: TokenLoader,
    val_loader: ValidationLoader | None = None,
    ema: WeightEMA | None = None,
) -> Path:
    """Write a checkpoint atomically (temp file, fsync, rename). Gradients must be cleared first.
    `ema`: the weights' moving average (TrainConfig.ema_decay) goes in too, so a resume continues it."""
    live = [name for name, p in model.named_parameters() if p.grad is not None]
    if live:
        raise ValueError(f"checkpoint must be saved after optimizer.zero_grad(set_to_none=True); live gradients on {live[:3]}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    digest = train_loader.corpus.digest
    payload = {
        "format_version": FORMAT_VERSION,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "state": state.to_dict(),
        "train_config": config.to_dict(),
        "model_config": asdict(model.config),
        "vocab_size": model.config.vocab_size,
        "optimizer_type": optimizer_type(optimizer),
        "optimizer_layout": optimizer_layout(optimizer),
        "qk_clip": {"enabled": config.qk_clip, "threshold": config.qk_clip_threshold},
        "manifest_digest": digest,
        TOKENIZER_KEY: corpus_tokenizer_sha256(train_loader.corpus),  # eval, generate, export... refuse another tokenizer
        "loaders": {"train": train_loader.state_dict(), "validation": validation_cursor(val_loader, digest)},
        "rng": rng_payload(),
        "runtime": runtime_signature(model),
        "monitor": monitor_entry(state),  # alert history and per-source totals: a resume reports what an uninterrupted run does
    }
    if ema is not None:
        payload["ema"] = ema.state_dict()
    return write_payload(path, payload)


def write_payload(path: Path, payload: dict[str, Any]) -> Path:
    """A checkpoint payload to `path` atomically: temp file, fsync, rename, fsync of the directory."""
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as handle:
        torch.save(interned_strings(payload), handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    fsync_dir(path.parent)
    return path


def load_failure(exc: BaseException) -> str:
    """Why torch.load failed, in our words. torch's own message for a file holding pickled objects advises
    `weights_only=False`, which runs whatever code the file carries: never repeated to a user."""
    text = str(exc)
    if "allowed global" in text or "Unsupported global" in text:  # torch's words for a refused pickled object
        return ("not a HyMo checkpoint: it holds pickled objects other than tensors and plain values, which a weights-only "
                "load refuses (a HyMo checkpoint never does)")
    if isinstance(exc, pickle.UnpicklingError) or "weights_only" in text:  # junk or a cut pickle: torch's text advises weights_only=False
        return f"truncated or corrupt checkpoint ({type(exc).__name__}: the file does not unpickle as a checkpoint)"
    return f"truncated or corrupt checkpoint ({type(exc).__name__}: {text[:200]})"


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """The payload, loaded with weights_only=True; an unreadable file raises CheckpointError naming a fallback."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: checkpoint missing (no such file)")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except (EOFError, RuntimeError, OSError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError) as exc:
        previous = previous_checkpoint(path)
        offer = f"; the previous checkpoint is {previous}" if previous else "; no earlier checkpoint in that directory"
        raise CheckpointError(f"{path}: {load_failure(exc)}{offer}") from exc
    if not isinstance(payload, dict) or "format_version" not in payload:
        raise CheckpointError(f"{path}: not a HyMo checkpoint (no format_version)")
    if payload["format_version"] != FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format {payload['format_version']}, this code reads format {FORMAT_VERSION}")
    missing = [key for key in PAYLOAD_KEYS if key not in payload]
    if missing:
        raise CheckpointError(f"{path}: checkpoint lacks {', '.join(missing)}")
    return payload


def load_checkpoint(
    path: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    config: TrainConfig,
    train_loader: TokenLoader,
    warn: Callable[[str], None] | None = None,
    strict: bool = False,
    ema: WeightEMA | None = None,
) -> TrainState:
    """Validate everything, then restore weights, optimizer, EMA, train cursor and finally RNG; returns the counters."""
    path = Path(path)
    payload = read_checkpoint(path)
    state = check_compatible(payload, path, model, optimizer, config, train_loader, warn, strict)
    if ema is not None and "ema" not in payload:
        raise CheckpointError(f"{path}: holds no EMA of the weights, but the recipe keeps one (ema_decay {ema.decay}); refusing to resume")
    model.load_state_dict(payload["model"])
    optimizer.load_state_dict(payload["optimizer"])
    optimizer.zero_grad(set_to_none=True)
    if ema is not None:
        ema.load_state_dict(payload["ema"], str(path))
    train_loader.load_state_dict(payload["loaders"]["train"])
    restore_rng(rng_from_payload(payload["rng"]))  # last: constructors above must not shift the resumed sequence
    return state


class CheckpointDirectory:
    """Keeps the last `keep_last` checkpoints and the best one by validation loss; an index says which is which."""

    def __init__(self, directory: str | Path, keep_last: int = 2, writer: bool = True):
        self.directory = Path(directory)
        self.keep_last = keep_last
        self.writer = writer  # under torchrun every rank saves its shards, rank 0 alone keeps the index
        index = self.directory / INDEX_FILE
        self.index: dict[str, Any] = json.loads(index.read_text(encoding="utf-8")) if index.is_file() else {"best": None}

    def latest(self) -> Path | None:
        found = list_checkpoints(self.directory)
        return found[-1] if found else None

    def save(self, step: int, val_loss: float | None, save: Callable[..., Path] | None = None, **objects: Any) -> Path:
        """`save(path, **objects)` writes one checkpoint (default: the single-file save_checkpoint)."""
        path = save(checkpoint_path(self.directory, step, sharded=True), **objects) if save else \
            save_checkpoint(checkpoint_path(self.directory, step), **objects)
        return self.record(step, val_loss, path)

    def record(self, step: int, val_loss: float | None, path: Path) -> Path:
        """Enter a published checkpoint in the index (best, latest) and prune the old ones (rank 0 only)."""
        if not self.writer:
            return path
        best = self.index.get("best")
        if val_loss is not None and (best is None or val_loss < best["val_loss"] or not (self.directory / best["path"]).exists()):
            self.index["best"] = {"path": path.name, "step": step, "val_loss": val_loss}
        self._prune()
        self._write_index()
        return path

    def _prune(self) -> None:
        keep = {p.name for p in list_checkpoints(self.directory)[-self.keep_last:]}
        if self.index.get("best"):
            keep.add(self.index["best"]["path"])
        for path in list_checkpoints(self.directory):
            if path.name not in keep:
                shutil.rmtree(path) if path.is_dir() else path.unlink()

    def _write_index(self) -> None:
        self.index["checkpoints"] = [p.name for p in list_checkpoints(self.directory)]
        self.index["latest"] = self.index["checkpoints"][-1] if self.index["checkpoints"] else None
        temporary = self.directory / (INDEX_FILE + ".tmp")
        temporary.write_text(json.dumps(self.index, indent=2) + "\n", encoding="utf-8")
        os.replace(temporary, self.directory / INDEX_FILE)

