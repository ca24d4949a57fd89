"""DCP checkpoints: every rank writes its own shards, one directory holds the update boundary.

Layout of `checkpoints/step-NNNNNNNN/`:

    .metadata            DCP's index: which shard file holds which slice of which tensor
    __R_0.distcp         rank R's shards of the model ("model.*") and optimizer ("optimizer.*") state
    metadata.json        written last: counters, recipe, model config, optimizer layout, corpus digest,
                         every rank's loader cursor and RNG states, the runtime signature, and the
                         sha256 and size of every file above

Written in the background (`start_sharded_checkpoint`): `dcp.async_save` copies
the state to CPU and returns, the files are written while training goes on,
each hashed as its bytes go out (hashing_writer: no file is read back). Atomic
at the directory level (`finish_sharded_checkpoint`): ranks write into
`step-NNNNNNNN.tmp/`; once every rank is done, rank 0 writes metadata.json
into it, fsyncs, and renames the directory. A directory without metadata.json
never has the published name.

Loading validates before it mutates: metadata.json is read and checked with
the same rules as a single-file checkpoint (hymo_core.checkpoint.common.check_compatible),
then every shard file is re-hashed (spread over the ranks), and only then
are weights, optimizer state, the loader cursor and RNG restored. DCP
reshards on read: a checkpoint written by 2 ranks loads into 1 rank, into a
plain single process (`hymo eval`), or into 4 ranks.
"""
from __future__ import annotations

import base64
import io
import json
import os
import shutil
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn

from hymo_core.checkpoint.common import (CheckpointError, check_compatible, fsync_dir, model_from_config, monitor_entry,
                                        optimizer_layout, optimizer_type, previous_checkpoint, rng_from_payload, rng_payload,
                                        runtime_signature, validation_cursor)
from hymo_core.checkpoint.single import read_checkpoint
from hymo_core.checkpoint.hashing_writer import hashing_writer
from hymo_core.checkpoint.tokenizer_identity import TOKENIZER_KEY, corpus_tokenizer_sha256
from hymo_core.train.data import TokenLoader, ValidationLoader, _sha256_file
from hymo_core.distributed.process_group import Runtime, all_gather_objects, any_rank, barrier
from hymo_core.train.config import TrainConfig
from hymo_core.train.trainer import TrainState, restore_rng

SHARDED_FORMAT_VERSION = 1
METADATA_FILE = "metadata.json"
METADATA_KEYS = ("state", "train_config", "model_config", "vocab_size", "optimizer_type", "optimizer_layout", "qk_clip",
                 "manifest_digest", "loaders", "rng_per_rank", "runtime", "world_size", "files")


def _rng_json() -> dict[str, str]:
    """This rank's RNG states as JSON text: the weights_only-safe payload, serialised by torch.save, base64."""
    buffer = io.BytesIO()
    torch.save(rng_payload(), buffer)
    return {"torch_save_base64": base64.b64encode(buffer.getvalue()).decode("ascii")}


def _rng_from_json(entry: dict[str, str]) -> dict[str, Any]:
    payload = torch.load(io.BytesIO(base64.b64decode(entry["torch_save_base64"])), weights_only=True)
    return rng_from_payload(payload)


def _state_dicts(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optimizer_state}


@dataclass
class PendingSave:
    """A DCP save staged to CPU and being written in the background; published by `finish_sharded_checkpoint`."""

    path: Path
    temporary: Path
    step: int
    future: Any
    file_system: Any
    metadata: dict[str, Any] | None  # rank 0: everything but the files, captured at the update boundary
    started: float
    stage_seconds: float

    def done(self) -> bool:
        return self.future.done()


_SAVE_GROUPS: dict[tuple[int, ...], Any] = {}


def _save_group() -> Any:
    """A gloo group of all ranks for the background writer's own collectives (never the training group's)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    key = (dist.get_world_size(),)
    if key not in _SAVE_GROUPS:
        _SAVE_GROUPS[key] = dist.new_group(backend="gloo")
    return _SAVE_GROUPS[key]


def start_sharded_checkpoint(
    path: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    state: TrainState,
    config: TrainConfig,
    train_loader: TokenLoader,
    val_loader: ValidationLoader | None = None,
    runtime: Runtime = Runtime(),
) -> PendingSave:
    """Every rank, at one update boundary (gradients cleared): stage the state to CPU and start writing it.

    Returns once the tensors are copied, so training goes on while the files are written
    into `step-N.tmp/` (each file hashed as it is written); `finish_sharded_checkpoint`
    publishes the directory under its name.
    """
    import torch.distributed.checkpoint as dcp

    live = [name for name, p in model.named_parameters() if p.grad is not None]
    if live:
        raise ValueError(f"checkpoint must be saved after optimizer.zero_grad(set_to_none=True); live gradients on {live[:3]}")
    path = Path(path)
    temporary = path.with_name(path.name + ".tmp")
    if runtime.is_writer:
        shutil.rmtree(temporary, ignore_errors=True)  # a crashed earlier attempt at this step
        temporary.mkdir(parents=True)
    barrier()
    cursors = all_gather_objects(train_loader.state_dict())
    rngs = all_gather_objects(_rng_json())
    metadata = None
    if runtime.is_writer:
        digest = train_loader.corpus.digest
        metadata = {
            "format": "hymo-dcp",
            "format_version": SHARDED_FORMAT_VERSION,
            "state": state.to_dict(),
            "train_config": config.to_dict(),
            "model_config": asdict(model.config),
            "vocab_size": model.config.vocab_size,
            "optimizer_type": optimizer_type(optimizer),
            "optimizer_layout": optimizer_layout(optimizer),
            "qk_clip": {"enabled": config.qk_clip, "threshold": config.qk_clip_threshold},
            "manifest_digest": digest,
            TOKENIZER_KEY: corpus_tokenizer_sha256(train_loader.corpus),
            "loaders": {"train": cursors[0], "train_per_rank": cursors, "validation": validation_cursor(val_loader, digest)},
            "rng_per_rank": rngs,
            "runtime": runtime_signature(model),
            "world_size": runtime.world_size,
            "monitor": monitor_entry(state),  # alert history and per-source totals (rank 0's: it alone logs)
        }
    writer, file_system = hashing_writer(temporary)
    started = time.perf_counter()
    future = dcp.async_save(_state_dicts(model, optimizer), storage_writer=writer, checkpoint_id=temporary,
                            process_group=_save_group())
    return PendingSave(path, temporary, state.step, future, file_system, metadata, started, time.perf_counter() - started)


def finish_sharded_checkpoint(pending: PendingSave, runtime: Runtime = Runtime()) -> Path:
    """Every rank: wait for the write, then rank 0 writes metadata.json (last) and renames the directory."""
    pending.future.result()
    mine = {name: entry for name, entry in pending.file_system.digests.items() if name.endswith(".distcp")}
    files_per_rank = all_gather_objects(mine)
    if runtime.is_writer:
        files = {name: entry for rank_files in files_per_rank for name, entry in rank_files.items()}
        files[".metadata"] = pending.file_system.digests[".metadata"]  # the coordinator (rank 0) wrote it
        with open(pending.temporary / METADATA_FILE, "w", encoding="utf-8") as handle:
            handle.write(json.dumps({**pending.metadata, "files": files}, indent=1) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        fsync_dir(pending.temporary)
        if pending.path.exists():
            shutil.rmtree(pending.path)  # the same step saved again (a repeated final save)
        os.replace(pending.temporary, pending.path)
        fsync_dir(pending.path.parent)
    barrier()
    return pending.path


def save_sharded_checkpoint(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer, state: TrainState,
                            config: TrainConfig, train_loader: TokenLoader, val_loader: ValidationLoader | None = None,
                            runtime: Runtime = Runtime()) -> Path:
    """Start and finish at once: the synchronous save (returns the published directory)."""
    pending = start_sharded_checkpoint(path, model, optimizer, state, config, train_loader, val_loader, runtime)
    return finish_sharded_checkpoint(pending, runtime)


def read_metadata(path: str | Path) -> dict[str, Any]:
    """metadata.json of a DCP checkpoint directory; unreadable or incomplete raises CheckpointError."""
    path = Path(path)
    try:
        metadata = json.loads((path / METADATA_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        previous = previous_checkpoint(path)
        offer = f"; the previous checkpoint is {previous}" if previous else "; no earlier checkpoint in that directory"
        raise CheckpointError(f"{path}: truncated or corrupt checkpoint ({METADATA_FILE}: {type(exc).__name__}: {str(exc)[:200]}){offer}") from exc
    if not isinstance(metadata, dict) or metadata.get("format") != "hymo-dcp":
        raise CheckpointError(f"{path}: not a HyMo DCP checkpoint ({METADATA_FILE} has no format 'hymo-dcp')")
    if metadata.get("format_version") != SHARDED_FORMAT_VERSION:
        raise CheckpointError(f"{path}: DCP checkpoint format {metadata.get('format_version')}, this code reads {SHARDED_FORMAT_VERSION}")
    missing = [key for key in METADATA_KEYS if key not in metadata]
    if missing:
        raise CheckpointError(f"{path}: {METADATA_FILE} lacks {', '.join(missing)}")
    return metadata


def verify_files(path: Path, metadata: dict[str, Any], runtime: Runtime) -> None:
    """Re-hash every shard file (rank r takes every W-th), so a damaged file is found before anything is loaded."""
    problems = []
    names = sorted(metadata["files"])
    for name in names[runtime.rank::runtime.world_size]:
        entry, file = metadata["files"][name], path / name
        if not file.is_file():
            problems.append(f"{name} is missing")
        elif file.stat().st_size != entry["bytes"]:
            problems.append(f"{name} has {file.stat().st_size} bytes, {entry['bytes']} recorded")
        elif _sha256_file(file) != entry["sha256"]:
            problems.append(f"{name} sha256 differs from the recorded one")
    unexpected = sorted(p.name for p in path.glob("*.distcp") if p.name not in metadata["files"])
    if unexpected and runtime.is_writer:
        problems.append(f"unrecorded shard files {unexpected[:3]}")
    if any_rank(bool(problems), runtime.device):
        found = [p for rank_problems in all_gather_objects(problems) for p in rank_problems]
        previous = previous_checkpoint(path)
        offer = f"; the previous checkpoint is {previous}" if previous else "; no earlier checkpoint in that directory"
        raise CheckpointError(f"{path}: truncated or corrupt checkpoint ({'; '.join(found)}){offer}")


def load_sharded_checkpoint(
    path: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    config: TrainConfig,
    train_loader: TokenLoader,
    runtime: Runtime = Runtime(),
    warn: Callable[[str], None] | None = None,
    strict: bool = False,
) -> TrainState:
    """Validate the metadata and every file, then restore weights, optimizer, cursor and finally RNG."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    path = Path(path)
    metadata = read_metadata(path)
    state = check_compatible(metadata, path, model, optimizer, config, train_loader, warn=warn if runtime.is_writer else None,
                             strict=strict)
    verify_files(path, metadata, runtime)
    same_world = metadata["world_size"] == runtime.world_size
    cursor = metadata["loaders"]["train_per_rank"][runtime.rank] if same_world else metadata["loaders"]["train"]
    rng = _rng_from_json(metadata["rng_per_rank"][runtime.rank if same_world else 0])
    states = _state_dicts(model, optimizer)  # creates empty optimizer state to load into
    with warnings.catch_warnings():  # one plain process reading a sharded checkpoint is a reshard, not a mistake
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(states, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=states["model"], optim_state_dict=states["optimizer"])
    optimizer.zero_grad(set_to_none=True)
    train_loader.load_state_dict(cursor, reshard=not same_world)
    restore_rng(rng)  # last: constructors above must not shift the resumed sequence
    return state


def load_single_file_into_shards(
    path: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    config: TrainConfig,
    train_loader: TokenLoader,
    runtime: Runtime,
    warn: Callable[[str], None] | None = None,
    strict: bool = False,
) -> TrainState:
    """A one-process `step-N.pt` continued on W ranks (1 -> W reshard): same validation, then each rank keeps its rows."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    path = Path(path)
    payload = read_checkpoint(path)
    state = check_compatible(payload, path, model, optimizer, config, train_loader, warn=warn if runtime.is_writer else None,
                             strict=strict)
    states = _state_dicts(model, optimizer)
    _fill_from_full(states, {"model": payload["model"], "optimizer": _keyed_by_name(payload["optimizer"])}, "")
    set_state_dict(model, optimizer, model_state_dict=states["model"], optim_state_dict=states["optimizer"])
    optimizer.zero_grad(set_to_none=True)
    train_loader.load_state_dict(payload["loaders"]["train"], reshard=True)
    restore_rng(rng_from_payload(payload["rng"]))
    return state


def _keyed_by_name(optimizer_state: dict[str, Any]) -> dict[str, Any]:
    """torch.optim's index-keyed state as the parameter-name-keyed form the distributed state dict uses."""
    names = {index: name for group in optimizer_state["param_groups"] for index, name in zip(group["params"], group["param_names"])}
    return {"state": {names[index]: values for index, values in optimizer_state["state"].items()}}


def _fill_from_full(target: dict[str, Any], full: dict[str, Any], where: str) -> None:
    """Copy full tensors into `target` in place; a DTensor takes only this rank's slice."""
    for key, value in target.items():
        if key == "param_groups":
            continue  # ours: built from this optimizer; the learning rate is set every step
        if key not in full:
            raise CheckpointError(f"{where}{key}: missing from the single-file checkpoint")
        if isinstance(value, dict):
            _fill_from_full(value, full[key], f"{where}{key}.")
        elif hasattr(value, "to_local"):
            from torch.distributed.tensor import distribute_tensor

            mine = distribute_tensor(full[key].to(value.device, value.dtype), value.device_mesh, value.placements, src_data_rank=None)
            value.to_local().copy_(mine.to_local())
        elif isinstance(value, torch.Tensor):
            value.copy_(full[key])
        else:
            target[key] = full[key]


def load_sharded_model(path: str | Path) -> tuple[nn.Module, dict[str, Any]]:
    """Weights only, into one plain process whatever world size wrote them (eval, generate, export)."""
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    metadata = read_metadata(path)
    verify_files(path, metadata, Runtime())
    model = model_from_config(metadata["model_config"])
    weights = {"model": model.state_dict()}
    with warnings.catch_warnings():  # DCP notes that it reads in one process: that is the point here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(weights, checkpoint_id=path)
    model.load_state_dict(weights["model"])
    return model, metadata
