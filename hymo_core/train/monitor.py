"""What a run is doing, measured on logging steps: the seed's training and run signals.

Seed 001 ("监测数值并为告警确定行动") lists what to record. Beside the loss, the LR,
the pre-clip gradient norm and the max attention logit the loop already logs,
this module adds, at `log_interval`:

- per optimizer group, update RMS / weight RMS of the logged update;
- the clip fraction (updates whose pre-clip norm exceeded `max_grad_norm`);
- log-Z, the output normaliser z-loss penalises (mean logsumexp of the logits);
- activation RMS per block (forward hooks that exist on logging steps only);
- peak memory (CUDA allocator, else the process's peak RSS);
- time waiting for data against the rest of the step;
- tokens per source and documents per batch (from the loader's cursor and the
  shard indexes, read at the logging step for all the windows consumed since);
- MFU: the planner's training FLOPs per token against the device's stated peak.

Cost discipline: between logging steps nothing here reads the device. The
clip count accumulates on the device; hooks and weight snapshots exist only
on logging steps; the host clock around the loader is not a device sync.
"""
from __future__ import annotations

import os
import resource
import sys
import time
from collections import Counter
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from hymo_core.planner import planner

PEAK_FLOPS = {  # dense tensor-core peaks per dtype, as the vendors state them (no sparsity)
    "H100": {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12},
    "H200": {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12},
    "A100": {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12},
}
PEAK_FLOPS_ENV = "HYMO_PEAK_FLOPS"  # a stated peak (FLOP/s) for a device the table does not know, e.g. a CPU


def stated_peak_flops(device: torch.device, precision: str) -> tuple[float | None, str]:
    """The FLOP/s MFU divides by, and where the number comes from; None when nothing states one."""
    if os.environ.get(PEAK_FLOPS_ENV):
        return float(os.environ[PEAK_FLOPS_ENV]), f"${PEAK_FLOPS_ENV}"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, peaks in PEAK_FLOPS.items():
            if key in name:
                return peaks[precision], f"{key} {precision} stated peak"
        return None, f"no stated peak for {name} (set ${PEAK_FLOPS_ENV})"
    return None, f"no stated peak for {device.type} (set ${PEAK_FLOPS_ENV})"


def reference_flops(device: torch.device, precision: str, size: int = 384, repeats: int = 6) -> tuple[float, str]:
    """For benchmarks that compare machines without a stated peak: the stated peak when there is one, else a timed matmul.

    Training's MFU never uses the timed matmul (on a loaded machine it says more about the load than the run).
    """
    peak, label = stated_peak_flops(device, precision)
    if peak is not None:
        return peak, label
    dtype = torch.float32 if precision == "fp32" or device.type == "cpu" else {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    generator = torch.Generator(device=device).manual_seed(0)  # private: the global RNG stream is not touched
    a = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    a @ b  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    return 2.0 * size**3 * repeats / max(seconds, 1e-9), f"measured {size}x{size} {str(dtype).removeprefix('torch.')} matmul"


def model_flops_per_token(model: nn.Module, seq_len: int) -> float:
    """Training FLOPs per token under the planner's one convention (planner.FLOP_CONVENTION):
    6 x matmul parameters + 6 L d T for causal attention; the GPU check's MFU uses the same call."""
    return float(planner.training_flops_per_token(planner.model_shape(model.config), seq_len))


def peak_memory_bytes(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated"
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024), "process_peak_rss"


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (sums over shards are then summed over ranks), plain tensors unchanged."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def parse_source_state(state: dict[str, Any], where: str = "checkpoint") -> tuple[Counter, tuple[int, int]]:
    """SourceCounter.state_dict() read back and checked: (totals, (epoch, position)); ValueError names `where`."""
    try:
        total = Counter({str(k): int(v) for k, v in state["total"].items()})
        epoch, position = (int(x) for x in state["mark"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"{where}: monitor.sources is malformed ({type(exc).__name__}: {exc})") from None
    if any(v < 0 for v in total.values()) or epoch < 0 or position < 0:
        raise ValueError(f"{where}: monitor.sources holds negative counts or cursor {state['mark']}")
    return total, (epoch, position)


class SourceCounter:
    """Tokens per source and document pieces per window, for windows named by the loader's cursor.

    The training windows a span of updates consumed are `order[previous:position]`
    of the loader's seeded permutation, so nothing is counted per step: at a
    logging step the windows since the last one are looked up in the shard
    indexes (piece offsets -> doc id -> source).
    """

    def __init__(self, loader: Any):
        self.loader = loader
        self.enabled = all(e.get("index_path") for e in loader.corpus.shard_entries(loader.split))
        self.labels: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.sources: list[str] = []
        self.mark = (loader.epoch, loader.position)
        self.total: Counter = Counter()

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the running totals and the cursor they were counted up to (plain JSON types)."""
        return {"total": {k: int(v) for k, v in sorted(self.total.items())}, "mark": [int(self.mark[0]), int(self.mark[1])]}

    def load_state_dict(self, state: dict[str, Any], where: str = "checkpoint") -> None:
        """A resumed run's totals continue the checkpoint's; windows between the last logging step and the checkpoint are
        counted at the next one, as the uninterrupted run counts them. Validated before anything changes."""
        self.total, self.mark = parse_source_state(state, where)

    def _shard(self, shard: int) -> tuple[np.ndarray, np.ndarray]:
        if shard not in self.labels:
            import pyarrow.parquet as pq

            entry = self.loader.corpus.shard_entries(self.loader.split)[shard]
            index = pq.read_table(self.loader.corpus.root / entry["index_path"], columns=["doc_id", "offset"])
            codes = []
            for doc_id in index.column("doc_id").to_pylist():
                source = doc_id.rsplit("-", 1)[0]
                if source not in self.sources:
                    self.sources.append(source)
                codes.append(self.sources.index(source))
            self.labels[shard] = (index.column("offset").to_numpy().astype(np.int64), np.asarray(codes, np.int64))
        return self.labels[shard]

    def _consumed(self) -> np.ndarray:
        """Window numbers consumed since the mark (an epoch change contributes the old epoch's tail)."""
        epoch, position = self.loader.epoch, self.loader.position
        mark_epoch, mark_position = self.mark
        spans = []
        if epoch != mark_epoch:  # (more than one epoch between two logging steps: the ones in between are not counted)
            usable = self.loader.batches_per_epoch * self.loader.step_windows
            spans.append(self.loader._permutation(mark_epoch)[mark_position:usable])
            mark_position = 0
        spans.append(self.loader._order[mark_position:position])  # the current epoch's order
        self.mark = (epoch, position)
        return np.concatenate(spans) if spans else np.zeros(0, np.int64)

    def read(self) -> dict[str, Any] | None:
        """{"tokens_per_source": {...} since the last read, "documents_per_window": mean pieces a window touches}."""
        if not self.enabled:
            return None
        consumed = self._consumed()
        if len(consumed) == 0:
            return None
        windows = self.loader.windows[consumed]
        T = self.loader.seq_len
        tokens: Counter = Counter()
        pieces = 0
        for shard in np.unique(windows[:, 0]):
            starts, codes = self._shard(int(shard))
            ends = np.append(starts[1:], np.iinfo(np.int64).max)
            first_BT = windows[windows[:, 0] == shard, 1] + 1  # targets: positions offset+1 .. offset+T
            last_BT = first_BT + T
            r0 = np.searchsorted(starts, first_BT, side="right") - 1
            r1 = np.searchsorted(starts, last_BT - 1, side="right") - 1
            counts = r1 - r0 + 1
            pieces += int(counts.sum())
            rows = np.repeat(r0, counts) + (np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts))
            lo = np.maximum(np.repeat(first_BT, counts), starts[rows])
            hi = np.minimum(np.repeat(last_BT, counts), ends[rows])
            per_code = np.bincount(codes[rows], weights=(hi - lo).astype(np.float64), minlength=len(self.sources))
            for code, n in enumerate(per_code):
                if n:
                    tokens[self.sources[code]] += int(n)
        self.total.update(tokens)
        return {"tokens_per_source": dict(sorted(tokens.items())), "tokens_per_source_total": dict(sorted(self.total.items())),
                "documents_per_window": pieces / len(windows)}


class RunMonitor:
    """The loop calls it at four points; on logging steps `record_fields()` returns what it measured.

    start_update(logging)      -> hooks on for a logging step (activation RMS per block, log-Z)
    waited_for_data(seconds)   -> host clock around the loader
    before_step() / after_step(grad_norm) -> weight snapshot and update RMS (logging steps), clip count (always, on device)
    record_fields(seconds)     -> the logging step's fields; windows reset
    """

    def __init__(self, model: nn.Module, optimizer: Any, max_grad_norm: float, device: torch.device, precision: str,
                 flops_per_token: float, train_loader: Any = None, world_size: int = 1):
        self.model, self.optimizer, self.max_grad_norm, self.device = model, optimizer, max_grad_norm, device
        self.flops_per_token, self.world_size = flops_per_token, world_size
        self.peak_flops, self.peak_label = stated_peak_flops(device, precision)
        # A TokenLoader's cursor names its windows; other loaders (CPT's replay mix) are not counted per source.
        countable = all(hasattr(train_loader, name) for name in ("windows", "split", "epoch", "position", "_order", "corpus"))
        self.sources = SourceCounter(train_loader) if countable else None
        self.clipped = torch.zeros((), dtype=torch.int64, device=device)
        self.updates = 0
        self.data_wait_s = 0.0
        self.max_data_wait_s = 0.0
        self.handles: list[Any] = []
        self.block_sq: dict[int, list[torch.Tensor]] = {}
        self.log_z: list[torch.Tensor] = []
        self.snapshot: list[list[torch.Tensor]] | None = None
        self.update_ratio: dict[str, float] = {}

    # ---- per update

    def start_update(self, logging: bool) -> None:
        self._remove_hooks()
        if not logging:
            return
        self.block_sq, self.log_z = {}, []
        for index, block in enumerate(getattr(self.model, "layers", [])):
            self.handles.append(block.register_forward_hook(self._block_hook(index)))
        if hasattr(self.model, "last_lse"):  # the head is fused into the loss: the model keeps its log-partitions
            self.handles.append(self.model.register_forward_hook(self._forward_done))

    def _block_hook(self, index: int):
        def hook(module: nn.Module, inputs: Any, output: Any) -> None:
            hidden = output[0] if isinstance(output, tuple) else output
            self.block_sq.setdefault(index, []).append(hidden.detach().float().pow(2).mean())
        return hook

    def _forward_done(self, module: nn.Module, inputs: Any, output: Any) -> None:
        lse = getattr(module, "last_lse", None)  # the trunk's head (multi-token prediction's heads are not log-Z)
        if lse is not None:
            self.log_z.append(lse.float().mean())

    def _remove_hooks(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def waited_for_data(self, seconds: float) -> None:
        self.data_wait_s += seconds
        self.max_data_wait_s = max(self.max_data_wait_s, seconds)

    def before_step(self, logging: bool) -> None:
        self._remove_hooks()  # backward and the optimizer run without them
        self.snapshot = None
        if logging:  # one foreach copy per group, not a clone per parameter
            self.snapshot = []
            for group in self.optimizer.param_groups:
                weights = [_local(p.detach()) for p in group["params"]]
                copies = [torch.empty_like(w) for w in weights]
                if copies:
                    torch._foreach_copy_(copies, weights)
                self.snapshot.append(copies)

    def after_step(self, grad_norm: torch.Tensor | float, applied: bool) -> None:
        """`applied`: the update happened (not an fp16 overflow or a skipped batch)."""
        if not applied:
            self.snapshot = None
            return
        self.updates += 1
        if self.max_grad_norm:
            self.clipped += torch.as_tensor(grad_norm, device=self.device) > self.max_grad_norm
        if self.snapshot is None:
            return
        from hymo_core.distributed.process_group import all_reduce_sum_

        sums = []
        for group, before in zip(self.optimizer.param_groups, self.snapshot):
            if not before:
                sums += [torch.zeros((), dtype=torch.float64, device=self.device)] * 2
                continue
            # foreach over the group (a few launches, not a few per parameter); the norms accumulate in fp64
            new = [_local(param.detach()) for param in group["params"]]
            update_sq = torch.stack(torch._foreach_norm(torch._foreach_sub(new, before), 2, dtype=torch.float64)).square().sum()
            weight_sq = torch.stack(torch._foreach_norm(new, 2, dtype=torch.float64)).square().sum()
            sums += [update_sq, weight_sq]
        totals = all_reduce_sum_(torch.stack(sums)).tolist() if sums else []
        self.update_ratio = {}
        for i, group in enumerate(self.optimizer.param_groups):
            update_sq, weight_sq = totals[2 * i], totals[2 * i + 1]
            self.update_ratio[group.get("group", str(i))] = (update_sq / weight_sq) ** 0.5 if weight_sq > 0 else None
        self.snapshot = None

    # ---- per logging step

    def record_fields(self, seconds: float, tokens: int) -> dict[str, Any]:
        """This logging step's signals; `seconds`/`tokens`: the window since the previous logging step."""
        tokens_per_s = tokens / max(seconds, 1e-9)
        achieved = tokens_per_s * self.flops_per_token
        memory, memory_kind = peak_memory_bytes(self.device)
        fields: dict[str, Any] = {
            "update_rms_ratio": self.update_ratio,
            "clip_fraction": int(self.clipped) / self.updates if self.updates and self.max_grad_norm else 0.0,
            "log_z": float(torch.stack(self.log_z).mean()) if self.log_z else None,
            "activation_rms": {f"block_{i}": float(torch.stack(v).mean().sqrt()) for i, v in sorted(self.block_sq.items())},
            "peak_memory_bytes": memory, "peak_memory_kind": memory_kind,
            "data_wait_s": self.data_wait_s, "data_wait_fraction": self.data_wait_s / max(seconds, 1e-9),
            "max_data_wait_s": self.max_data_wait_s, "compute_s": max(seconds - self.data_wait_s, 0.0),
            "model_flops_per_s": achieved, "mfu": achieved / self.peak_flops if self.peak_flops else None, "mfu_reference": self.peak_label,
        }
        if self.sources is not None:
            counts = self.sources.read()
            if counts:
                fields.update(counts)
        self.clipped.zero_()
        self.updates, self.data_wait_s, self.max_data_wait_s = 0, 0.0, 0.0
        self.block_sq, self.log_z, self.update_ratio = {}, [], {}
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        return fields

    def close(self) -> None:
        self._remove_hooks()


def _si(value: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.1f}{unit}"
    return f"{value:.0f}"


def status_line(record: dict[str, Any], max_steps: int) -> str:
    """One compact console line per logging step (or alert): what a person glances at."""
    if record.get("kind") == "alert":
        return f"ALERT step {record['step']}: {record['alert']} ({record['metric']} = {record['value']}) -> {record['action']}"
    if record.get("kind") == "note":
        return f"note step {record['step']}: {record['alert']} ({record['metric']} = {record['value']}): {record.get('note', '')}"
    lr = record.get("lr")
    lr = max(lr.values()) if isinstance(lr, dict) and lr else (lr or 0.0)
    parts = [f"step {record['step']}/{max_steps}", f"loss {record['loss']:.4f}", f"lr {lr:.2e}",
             f"gnorm {record['grad_norm_pre_clip']:.3g}", f"clip {100 * record.get('clip_fraction', 0.0):.0f}%",
             f"{_si(record['tokens_per_s'])} tokens/s"]
    if record.get("mfu") is not None:
        parts.append(f"mfu {100 * record['mfu']:.1f}%")
    if record.get("peak_memory_bytes"):
        parts.append(f"mem {_si(record['peak_memory_bytes'])}B")
    if record.get("data_wait_fraction") is not None:
        parts.append(f"wait {100 * record['data_wait_fraction']:.0f}%")
    if record.get("max_attention_logit") is not None:
        parts.append(f"max-logit {record['max_attention_logit']:.1f}")
    return " | ".join(parts)
