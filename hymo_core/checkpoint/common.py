"""What both checkpoint formats share: the error type, the compatibility checks a resume must pass, RNG
payloads, the runtime signature, weight digests, and checkpoint names in a directory."""
from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn as nn

from hymo_core.train.data import TokenLoader, ValidationLoader
from hymo_core.models.model import ModelConfig, Transformer
from hymo_core.train.config import TrainConfig
from hymo_core.train.trainer import TrainState, _window_at, capture_rng


FORMAT_VERSION = 1


PAYLOAD_KEYS = ("model", "optimizer", "state", "train_config", "model_config", "vocab_size", "optimizer_type", "optimizer_layout",
                "qk_clip", "manifest_digest", "loaders", "rng", "runtime")


CHECKPOINT_RE = re.compile(r"^step-(\d{8})(\.pt)?$")  # a single file (one process) or a DCP directory (torchrun)


INDEX_FILE = "checkpoints.json"


# TrainConfig fields a continuation may change: they steer this session, not the recipe.
SESSION_FIELDS = frozenset({"alerts", "max_steps", "log_interval", "eval_interval", "checkpoint_interval", "eval_batches", "keep_checkpoints",
                            "activation_checkpointing", "compile", "compile_scope", "bitwise_resume", "replicate", "shard", "expert"})


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: unreadable, or incompatible with this run (the message says which)."""


# Where the optimizers lived before the layout move (hymo_core/optim.py): their checkpoints still resume.
MOVED_OPTIMIZERS = {"hymo_core.optim.MuonAdamW": "hymo_core.train.optim.MuonAdamW",
                    "hymo_core.optim.NorMuonAdamW": "hymo_core.train.optim.NorMuonAdamW"}


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


def rng_payload() -> dict[str, Any]:
    """RNG states in types weights_only loading accepts (numpy's key array becomes a tensor)."""
    rng = capture_rng()
    name, keys, pos, has_gauss, cached = rng["numpy"]
    rng["numpy"] = [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)]
    rng["python"] = [rng["python"][0], list(rng["python"][1]), rng["python"][2]]
    return rng


def rng_from_payload(payload: dict[str, Any]) -> dict[str, Any]:
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


def fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_compatible(
    payload: dict[str, Any],
    path: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    config: TrainConfig,
    train_loader: TokenLoader,
    warn: Callable[[str], None] | None = None,
    strict: bool = False,
) -> TrainState:
    """Every condition a resume needs, checked without mutating anything; returns the saved state.

    Another torch version or device warns (the continuation is then not bitwise); `strict`
    (--strict-resume) refuses it. Another dtype or determinism setting always refuses.

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
    if MOVED_OPTIMIZERS.get(payload["optimizer_type"], payload["optimizer_type"]) != optimizer_type(optimizer):
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
    if any(saved_runtime.get(key) != runtime[key] for key in ("dtype", "deterministic")):
        raise refuse(f"runtime {saved_runtime} != {runtime} (dtype or determinism)")
    notes = [f"{key} {saved_runtime.get(key)} != {runtime[key]}" for key in ("torch", "device") if saved_runtime.get(key) != runtime[key]]
    if notes and strict:
        raise refuse(f"{'; '.join(notes)} and --strict-resume is on")
    if saved_runtime.get("threads") != runtime["threads"]:
        if config.bitwise_resume:
            raise refuse(f"thread count {saved_runtime.get('threads')} != {runtime['threads']} and bitwise_resume is on")
        notes.append(f"thread count {saved_runtime.get('threads')} != {runtime['threads']}")
    if cursor.get("world_size", 1) != ours["world_size"]:
        notes.append(f"resharding from {cursor.get('world_size', 1)} to {ours['world_size']} ranks")
    if notes and warn:
        warn(f"{path}: {'; '.join(notes)}: the continuation equals the uninterrupted run within float tolerance, not bitwise")
    state.monitor = checked_monitor(payload, path, warn)
    return state


def monitor_entry(state: TrainState) -> dict[str, Any]:
    """The checkpoint's "monitor" entry: what the run has reported (alert history, per-source token totals), JSON types."""
    return state.monitor if state.monitor is not None else {"alerts": None, "sources": None}


def checked_monitor(payload: dict[str, Any], path: Path, warn: Callable[[str], None] | None) -> dict[str, Any] | None:
    """The payload's "monitor" entry, validated; a checkpoint written before the entry existed resumes with it empty."""
    from hymo_core.train.alerts import AlertBook
    from hymo_core.train.monitor import parse_source_state

    if "monitor" not in payload:
        if warn:
            warn(f"{path}: written before checkpoints kept the monitor entry: alert history and per-source token totals "
                 "restart from empty")
        return None
    entry = payload["monitor"]
    where = str(path)
    if not isinstance(entry, dict) or set(entry) != {"alerts", "sources"}:
        raise CheckpointError(f"{path}: the monitor entry must be {{'alerts': ..., 'sources': ...}}, got "
                              f"{sorted(entry) if isinstance(entry, dict) else type(entry).__name__}; refusing to resume")
    try:
        if entry["alerts"] is not None:
            AlertBook(()).load_state_dict(entry["alerts"], where)
        if entry["sources"] is not None:
            parse_source_state(entry["sources"], where)
    except ValueError as exc:
        raise CheckpointError(f"{exc}; refusing to resume") from None
    return entry


def model_from_config(values: dict[str, Any]) -> Transformer:
    """The model a checkpoint's model_config describes, freshly initialised."""
    return Transformer(ModelConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}))


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

