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
import re
import shutil
import sys
import zipfile
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn as nn

from hymo_core.data import TokenLoader, ValidationLoader
from hymo_core.model import ModelConfig, Transformer
from hymo_core.trainer import TrainConfig, TrainState, _window_at, capture_rng, restore_rng

FORMAT_VERSION = 1
PAYLOAD_KEYS = ("model", "optimizer", "state", "train_config", "model_config", "vocab_size", "optimizer_type", "optimizer_layout",
                "qk_clip", "manifest_digest", "loaders", "rng", "runtime")
CHECKPOINT_RE = re.compile(r"^step-(\d{8})(\.pt)?$")  # a single file (one process) or a DCP directory (torchrun)
INDEX_FILE = "checkpoints.json"
# TrainConfig fields a continuation may change: they steer this session, not the recipe.
SESSION_FIELDS = frozenset({"max_steps", "log_interval", "eval_interval", "checkpoint_interval", "eval_batches", "keep_checkpoints",
                            "activation_checkpointing", "compile", "bitwise_resume"})


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: unreadable, or incompatible with this run (the message says which)."""


def optimizer_type(optimizer: torch.optim.Optimizer) -> str:
    return f"{type(optimizer).__module__}.{type(optimizer).__qualname__}"


def optimizer_layout(optimizer: torch.optim.Optimizer) -> list[list[Any]]:
    return [[group, name, list(shape)] for group, name, shape in optimizer.layout()]


def runtime_signature(model: nn.Module) -> dict[str, Any]:
    """What bitwise continuation depends on besides the payload (seed 002: version, device, dtype, threads, determinism)."""
    param = next(model.parameters())
    return {
        "torch": str(torch.__version__),
        "device": param.device.type,
        "dtype": str(param.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
    }


def _rng_payload() -> dict[str, Any]:
    """RNG states in types weights_only loading accepts (numpy's key array becomes a tensor)."""
    rng = capture_rng()
    name, keys, pos, has_gauss, cached = rng["numpy"]
    rng["numpy"] = [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)]
    rng["python"] = [rng["python"][0], list(rng["python"][1]), rng["python"][2]]
    return rng


def _rng_from_payload(payload: dict[str, Any]) -> dict[str, Any]:
    name, keys, pos, has_gauss, cached = payload["numpy"]
    version, internal, gauss = payload["python"]
    return {**payload, "numpy": (name, keys.numpy().astype(np.uint32), pos, has_gauss, cached), "python": (version, tuple(internal), gauss)}


def validation_cursor(loader: ValidationLoader | None, digest: str) -> dict[str, Any] | None:
    # Validation always restarts at offset 0, so its cursor is its identity plus position 0.
    if loader is None:
        return None
    return {"manifest_digest": digest, "seq_len": loader.seq_len, "batch_size": loader.batch_size,
            "max_batches": loader.max_batches, "position": 0}


def interned_strings(value: Any) -> Any:
    """`value` with every string (keys and values) interned, containers rebuilt, tensors untouched.

    Pickle writes a string once per object and refers back to it after that,
    so the bytes depend on which equal strings happen to be one object: a run
    resumed from a checkpoint holds unpickled (not interned) copies where a
    fresh run holds literals. Interning makes equal content give equal bytes.
    """
    if isinstance(value, str):
        return sys.intern(value)
    if isinstance(value, dict):
        return {interned_strings(k): interned_strings(v) for k, v in value.items()}
    if isinstance(value, list):
        return [interned_strings(v) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(interned_strings(v) for v in value)
    return value


def save_checkpoint(
    path: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    state: TrainState,
    config: TrainConfig,
    train_loader: TokenLoader,
    val_loader: ValidationLoader | None = None,
) -> Path:
    """Write a checkpoint atomically (temp file, fsync, rename). Gradients must be cleared first."""
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
        "loaders": {"train": train_loader.state_dict(), "validation": validation_cursor(val_loader, digest)},
        "rng": _rng_payload(),
        "runtime": runtime_signature(model),
    }
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as handle:
        torch.save(interned_strings(payload), handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    _fsync_dir(path.parent)
    return path


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """The payload, loaded with weights_only=True; an unreadable file raises CheckpointError naming a fallback."""
    path = Path(path)
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except (EOFError, RuntimeError, OSError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError) as exc:
        previous = previous_checkpoint(path)
        offer = f"; the previous checkpoint is {previous}" if previous else "; no earlier checkpoint in that directory"
        raise CheckpointError(f"{path}: truncated or corrupt checkpoint ({type(exc).__name__}: {str(exc)[:200]}){offer}") from exc
    if not isinstance(payload, dict) or "format_version" not in payload:
        raise CheckpointError(f"{path}: not a HyMo checkpoint (no format_version)")
    if payload["format_version"] != FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format {payload['format_version']}, this code reads format {FORMAT_VERSION}")
    missing = [key for key in PAYLOAD_KEYS if key not in payload]
    if missing:
        raise CheckpointError(f"{path}: checkpoint lacks {', '.join(missing)}")
    return payload


def check_compatible(
    payload: dict[str, Any],
    path: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    config: TrainConfig,
    train_loader: TokenLoader,
    warn: Callable[[str], None] | None = None,
) -> TrainState:
    """Every condition a resume needs, checked without mutating anything; returns the saved state.

    `payload` is a single-file checkpoint or a DCP checkpoint's metadata (same
    keys). Another world size is a reshard: allowed, with a warning that the
    continuation is equal within float tolerance, not bitwise.
    """
    def refuse(reason: str) -> CheckpointError:
        return CheckpointError(f"{path}: {reason}; refusing to resume")

    try:
        state = TrainState.from_dict(payload["state"])
        saved_config = TrainConfig.from_dict(payload["train_config"])
    except (TypeError, ValueError, KeyError) as exc:
        raise refuse(f"invalid counters or train config ({exc})") from exc
    if payload["vocab_size"] != model.config.vocab_size:
        raise refuse(f"vocab_size {payload['vocab_size']} != model's {model.config.vocab_size}")
    # A key the checkpoint lacks predates that field, so it was built with the field's default.
    # Compared in JSON form: a DCP checkpoint's metadata.json holds tuples (e.g. mtp_loss_weights) as lists.
    saved_model = json.loads(json.dumps({**{f.name: f.default for f in fields(ModelConfig)}, **payload["model_config"]}))
    current_model = json.loads(json.dumps(asdict(model.config)))
    if saved_model != current_model:
        changed = sorted(k for k in set(saved_model) | set(current_model) if saved_model.get(k) != current_model.get(k))
        raise refuse(f"model config differs in {', '.join(changed)}")
    if payload["optimizer_type"] != optimizer_type(optimizer):
        raise refuse(f"optimizer {payload['optimizer_type']} != {optimizer_type(optimizer)}")
    if payload["optimizer_layout"] != optimizer_layout(optimizer):
        raise refuse("optimizer parameter layout (group, name, shape) differs")
    if payload["qk_clip"] != {"enabled": config.qk_clip, "threshold": config.qk_clip_threshold}:
        raise refuse(f"QK-Clip policy {payload['qk_clip']} != enabled={config.qk_clip} threshold={config.qk_clip_threshold}")
    recipe_saved = {k: v for k, v in saved_config.to_dict().items() if k not in SESSION_FIELDS | {"horizon_steps"}}
    recipe_now = {k: v for k, v in config.to_dict().items() if k not in SESSION_FIELDS | {"horizon_steps"}}
    if recipe_saved != recipe_now:
        changed = sorted(k for k in recipe_now if recipe_saved.get(k) != recipe_now[k])
        raise refuse(f"training recipe differs in {', '.join(changed)}")
    if saved_config.schedule_config() != config.schedule_config():
        raise refuse(f"LR schedule differs ({saved_config.schedule_config()} vs {config.schedule_config()}); "
                     "set horizon_steps explicitly to extend max_steps without moving the decay")
    if config.max_steps < state.step:
        raise refuse(f"max_steps {config.max_steps} is smaller than the checkpoint's step {state.step}")
    digest = train_loader.corpus.digest
    if payload["manifest_digest"] != digest:
        raise refuse(f"corpus manifest digest {str(payload['manifest_digest'])[:12]}… != this corpus's {digest[:12]}…")
    cursor = payload["loaders"]["train"]
    ours = train_loader.state_dict()
    # The cursor counts windows of the global batch, so it means the same at any world size.
    for key in ("manifest_digest", "split", "seq_len", "seed"):
        if cursor.get(key) != ours[key]:
            raise refuse(f"train loader {key} {cursor.get(key)!r} != {ours[key]!r}")
    if {"shard": cursor["shard"], "offset": cursor["offset"]} != _window_at(train_loader, cursor["epoch"], cursor["position"]):
        raise refuse("train loader cursor does not point at the window it recorded")
    saved_runtime, runtime = payload["runtime"], runtime_signature(model)
    strict = ("torch", "device", "dtype", "deterministic")
    if any(saved_runtime.get(key) != runtime[key] for key in strict):
        raise refuse(f"runtime {saved_runtime} != {runtime} (version, device, dtype or determinism)")
    notes = []
    if saved_runtime.get("threads") != runtime["threads"]:
        if config.bitwise_resume:
            raise refuse(f"thread count {saved_runtime.get('threads')} != {runtime['threads']} and bitwise_resume is on")
        notes.append(f"thread count {saved_runtime.get('threads')} != {runtime['threads']}")
    if cursor.get("world_size", 1) != ours["world_size"]:
        notes.append(f"resharding from {cursor.get('world_size', 1)} to {ours['world_size']} ranks")
    if notes and warn:
        warn(f"{path}: {'; '.join(notes)}: the continuation equals the uninterrupted run within float tolerance, not bitwise")
    return state


def load_checkpoint(
    path: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    config: TrainConfig,
    train_loader: TokenLoader,
    warn: Callable[[str], None] | None = None,
) -> TrainState:
    """Validate everything, then restore weights, optimizer, train cursor and finally RNG; returns the counters."""
    path = Path(path)
    payload = read_checkpoint(path)
    state = check_compatible(payload, path, model, optimizer, config, train_loader, warn)
    model.load_state_dict(payload["model"])
    optimizer.load_state_dict(payload["optimizer"])
    optimizer.zero_grad(set_to_none=True)
    train_loader.load_state_dict(payload["loaders"]["train"])
    restore_rng(_rng_from_payload(payload["rng"]))  # last: constructors above must not shift the resumed sequence
    return state


def model_from_config(values: dict[str, Any]) -> Transformer:
    """The model a checkpoint's model_config describes, freshly initialised."""
    return Transformer(ModelConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}))


def load_model(path: str | Path, device: torch.device | str = "cpu") -> tuple[Transformer, dict[str, Any]]:
    """A model for evaluation or sampling, with the checkpoint's metadata (no optimizer, no runtime check).

    A DCP directory (written by any number of ranks) loads into one process too.
    """
    if Path(path).is_dir():
        from hymo_core.sharded_checkpoint import load_sharded_model

        model, payload = load_sharded_model(path)
    else:
        payload = read_checkpoint(path)
        model = model_from_config(payload["model_config"])
        model.load_state_dict(payload["model"])
    model.to(device).eval()
    return model, payload


def weights_sha256(model: nn.Module) -> str:
    """sha256 over the state dict's names and raw bytes, in order: equal iff the weights are bitwise equal."""
    return state_dict_sha256(model.state_dict())


def state_dict_sha256(state_dict: dict[str, torch.Tensor]) -> str:
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in state_dict.items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


# ---------------------------------------------------------------- a directory of checkpoints


def checkpoint_path(directory: Path, step: int, sharded: bool = False) -> Path:
    return Path(directory) / (f"step-{step:08d}" if sharded else f"step-{step:08d}.pt")


def list_checkpoints(directory: str | Path) -> list[Path]:
    """Published checkpoints (temporary files and directories excluded), oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if CHECKPOINT_RE.match(p.name) and p.is_dir() != p.name.endswith(".pt"))


def previous_checkpoint(path: Path) -> Path | None:
    earlier = [p for p in list_checkpoints(path.parent) if p.name < path.name]
    return earlier[-1] if earlier else None


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

