"""Where a training step's GPU time goes: the profile rows of bench/gpu_check.py (`--only profile`) and their JSON.

Each row profiles two steps of the trainer's own step (hymo_core.train.trainer.train: autocast, the logit
probe, QK-Clip, the trainer's clip, its wrapping, gradient accumulation) with torch.profiler, and reduces
the trace to one summary. `gpu_profile.json` (in $OUT beside gpu_check.json) holds every row's summary:

    {
      "schema": "hymo.gpu_profile/1",        # PROFILE_SCHEMA; a reader refuses another
      "device": "NVIDIA H100 80GB HBM3",     # torch.cuda.get_device_name(), "cpu (dry run)" when planned only
      "torch": "2.13.0", "commit": "64964ce", "started": "2026-12-07T04:40:00Z",
      "rows": [
        {
          "row": "profile dense-125m eager flash",   # the gpu_check row name
          "model": "dense-125m",                      # a hymo_core.models.presets name
          "variant": {"fsdp": false,                  # FSDP2 on one rank (true) or the plain model (the trainer's
                                                      #   choice at world size 1)
                      "compile": false,               # blocks compiled (the trainer's `compile`)
                      "sdpa": "flash",                # flash | cudnn | efficient: the only SDPA backend allowed
                      "batch": 8, "seq_len": 2048,    # micro-batch
                      "accumulation": 8},             # micro-batches per update (realistic, not 1)
          "status": "ok",                             # ok | error | planned | skipped: budget
          "steps": 2,                                 # profiled updates (after warm-up)
          "step_ms": 612.4,                           # wall ms per update, mean over the profiled steps
          "kernels_per_step": 5210.0,                 # GPU kernels (and memcpy / memset) per update
          "gpu_busy_ms_per_step": 540.2,              # union of the kernels' intervals, per update
          "gpu_idle_share": 0.118,                    # 1 - busy / step: the GPU waiting on the host
          "phases_ms": {"data": 0.4, "forward": 210.0, "backward": 330.0, "clip": 1.1, "optimizer": 60.2,
                        "after_step": 0.3, "log": 0.0, "other": 10.4},  # per update; `other` = step - the named
                                                             #   phases, so the phases sum to step_ms exactly
          "top_kernels": [                            # at most TOP_KERNELS, by GPU time, descending
            {"name": "sm90_xmma_gemm_bf16...", "calls_per_step": 96.0, "gpu_ms_per_step": 120.5, "share": 0.223}
          ],
          "launch_budget": {"forward": 163, ...}      # the meta-device count of the same step (launch_budget.py)
        }
      ]
    }

Phases are the trainer's step ranges (hymo_core/train/step_ranges.py), recorded as `record_function` ranges
`hymo.step.<phase>`: data, forward, backward (each summed over the micro-batches), clip, optimizer,
after_step (QK-Clip, MoE bookkeeping, zero_grad), log (a logging step's weight snapshot, update ratios and
its record; 0 on other steps). While a profile is taken the
trainer synchronises the device at the end of each range, so a phase's time is its host time and the GPU
work it queued; the unprofiled MFU rows time steps without those syncs. `share` is a kernel's GPU time over
all kernels' GPU time. `summarise` is pure (event records in, summary out) so the CPU tests hold the sums.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass

PROFILE_SCHEMA = "hymo.gpu_profile/1"
TOP_KERNELS = 25
PHASES = ("data", "forward", "backward", "clip", "optimizer", "after_step", "log")  # the trainer's ranges (step_ranges.py)
RANGE_PREFIX = "hymo.step."  # record_function names: hymo.step.forward, ...; hymo.step is the whole update
SDPA_BACKENDS = ("flash", "cudnn", "efficient")
ROW_KEYS = ("row", "model", "variant", "status")
MEASURED_KEYS = ("steps", "step_ms", "kernels_per_step", "gpu_busy_ms_per_step", "gpu_idle_share", "phases_ms", "top_kernels")


@dataclass(frozen=True)
class ProfileVariant:
    """One profiled configuration of a preset's trainer step."""

    model: str
    fsdp: bool
    compile: bool
    sdpa: str
    batch: int
    seq_len: int
    accumulation: int

    @property
    def row(self) -> str:
        parts = ["profile", self.model, "compiled" if self.compile else "eager", self.sdpa]
        return " ".join(parts + (["fsdp2"] if self.fsdp else []) + ([f"accumulation {self.accumulation}"]
                                                                      if self.accumulation != REALISTIC_ACCUMULATION else []))

    def to_json(self) -> dict:
        values = asdict(self)
        values.pop("model")
        return values


# dense-125m: 8 x 2048 tokens a micro-batch, 8 micro-batches an update (131k tokens: GPT-2 small's runs use
# 0.5M on 8 GPUs, 64k-131k per GPU), so Newton-Schulz is charged to an update, not to one micro-batch.
REALISTIC_ACCUMULATION = 8
PROFILE_VARIANTS: tuple[ProfileVariant, ...] = (
    ProfileVariant("dense-125m", fsdp=False, compile=False, sdpa="flash", batch=8, seq_len=2048, accumulation=8),
    ProfileVariant("dense-125m", fsdp=False, compile=True, sdpa="flash", batch=8, seq_len=2048, accumulation=8),
    ProfileVariant("dense-125m", fsdp=True, compile=False, sdpa="flash", batch=8, seq_len=2048, accumulation=8),
    ProfileVariant("dense-125m", fsdp=False, compile=False, sdpa="cudnn", batch=8, seq_len=2048, accumulation=8),
    ProfileVariant("dense-125m", fsdp=False, compile=False, sdpa="efficient", batch=8, seq_len=2048, accumulation=8),
    ProfileVariant("dense-125m", fsdp=False, compile=False, sdpa="flash", batch=8, seq_len=2048, accumulation=1),
    # hymo-750m at its training batch of 2 x 4096 (the GDN state pass's programs at B = 2: gpu_check's "gdn ours B=2")
    ProfileVariant("hymo-750m", fsdp=False, compile=False, sdpa="flash", batch=2, seq_len=4096, accumulation=8),
    ProfileVariant("hymo-750m", fsdp=False, compile=True, sdpa="flash", batch=2, seq_len=4096, accumulation=8),
)


@dataclass(frozen=True)
class Event:
    """One trace record, as summarise needs it: a GPU kernel (kind "kernel") or a host range (kind "range")."""

    name: str
    kind: str  # kernel | range
    start_us: float
    duration_us: float

    @property
    def end_us(self) -> float:
        return self.start_us + self.duration_us


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def summarise(events: list[Event], steps: int) -> dict:
    """The measured half of a row from `steps` profiled updates: the whole updates are the `hymo.step` ranges."""
    updates = [e for e in events if e.kind == "range" and e.name == RANGE_PREFIX.rstrip(".")]
    if len(updates) != steps:
        raise ValueError(f"the trace holds {len(updates)} '{RANGE_PREFIX.rstrip('.')}' ranges, expected {steps}")
    window = [(u.start_us, u.end_us) for u in updates]
    inside = lambda e: any(start <= e.start_us < end for start, end in window)  # noqa: E731
    kernels = [e for e in events if e.kind == "kernel" and inside(e)]
    step_us = sum(u.duration_us for u in updates)
    phases_us = {phase: sum(e.duration_us for e in events if e.kind == "range" and e.name == RANGE_PREFIX + phase and inside(e))
                 for phase in PHASES}
    named = sum(phases_us.values())
    if named > step_us * (1 + 1e-9):
        raise ValueError(f"the named phases take {named:.0f} us of a {step_us:.0f} us step: ranges overlap")
    phases_ms = {phase: us / 1e3 / steps for phase, us in phases_us.items()}
    phases_ms["other"] = step_us / 1e3 / steps - sum(phases_ms.values())
    by_name: dict[str, list[float]] = defaultdict(list)
    for kernel in kernels:
        by_name[kernel.name].append(kernel.duration_us)
    gpu_total = sum(sum(d) for d in by_name.values()) or 1.0
    top = sorted(by_name.items(), key=lambda item: -sum(item[1]))[:TOP_KERNELS]
    busy_us = _union_us([(k.start_us, k.end_us) for k in kernels])
    return {"steps": steps, "step_ms": step_us / 1e3 / steps, "kernels_per_step": len(kernels) / steps,
            "gpu_busy_ms_per_step": busy_us / 1e3 / steps, "gpu_idle_share": max(0.0, 1.0 - busy_us / step_us),
            "phases_ms": phases_ms,
            "top_kernels": [{"name": name, "calls_per_step": len(d) / steps, "gpu_ms_per_step": sum(d) / 1e3 / steps,
                             "share": sum(d) / gpu_total} for name, d in top]}


def validate(summary: dict) -> None:
    """Raise ValueError naming the first way `summary` (a gpu_profile.json object) breaks PROFILE_SCHEMA."""
    if summary.get("schema") != PROFILE_SCHEMA:
        raise ValueError(f"gpu_profile.json: schema {summary.get('schema')!r}, expected {PROFILE_SCHEMA!r}")
    for key in ("device", "torch", "commit", "started", "rows"):
        if key not in summary:
            raise ValueError(f"gpu_profile.json: no {key!r}")
    for row in summary["rows"]:
        where = f"gpu_profile.json: row {row.get('row')!r}"
        missing = [k for k in ROW_KEYS if k not in row]
        if missing:
            raise ValueError(f"{where}: missing {missing}")
        if row["variant"].get("sdpa") not in SDPA_BACKENDS:
            raise ValueError(f"{where}: sdpa {row['variant'].get('sdpa')!r} is not one of {SDPA_BACKENDS}")
        if row["status"] != "ok":
            continue
        missing = [k for k in MEASURED_KEYS if k not in row]
        if missing:
            raise ValueError(f"{where}: measured, but missing {missing}")
        if list(row["phases_ms"]) != list(PHASES) + ["other"]:
            raise ValueError(f"{where}: phases {list(row['phases_ms'])}, expected {list(PHASES) + ['other']}")
        if abs(sum(row["phases_ms"].values()) - row["step_ms"]) > 1e-6 * max(1.0, row["step_ms"]):
            raise ValueError(f"{where}: phases sum to {sum(row['phases_ms'].values())} ms, the step is {row['step_ms']} ms")
        if not 0.0 <= row["gpu_idle_share"] <= 1.0:
            raise ValueError(f"{where}: gpu_idle_share {row['gpu_idle_share']} outside [0, 1]")
        times = [k["gpu_ms_per_step"] for k in row["top_kernels"]]
        if len(times) > TOP_KERNELS or times != sorted(times, reverse=True):
            raise ValueError(f"{where}: top_kernels must be at most {TOP_KERNELS}, by GPU time descending")


# ---------------------------------------------------------------- the rows: plan on the CPU, measure on the GPU

WARM_UPDATES = 2  # before the profile: compiles, autotuning, the optimizer's state
PROFILED_UPDATES = 2
SDPA_BACKEND_NAMES = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}
_LAUNCHES: dict[str, dict] = {}


def plan(variant: ProfileVariant) -> dict:
    """The row's variant and the meta-device launch count of its step (once per model: no CUDA)."""
    from hymo_core.models.presets import PRESETS
    from hymo_core.train.launch_budget import MODEL_PHASES, count_step

    if variant.model not in _LAUNCHES:
        _LAUNCHES[variant.model] = count_step(variant.model, PRESETS[variant.model], variant.batch, variant.seq_len,
                                              MODEL_PHASES.get(variant.model, PHASES[1:3] + ("clip", "optimizer"))).launches
    return {"model": variant.model, "variant": variant.to_json(), "schema": PROFILE_SCHEMA,
            "launch_budget": dict(_LAUNCHES[variant.model])}


def _synced_range(name: str, synchronize):
    """A trainer step range as a record_function range that ends once the device has finished its work."""
    import contextlib

    import torch

    @contextlib.contextmanager
    def scope():
        with torch.profiler.record_function(RANGE_PREFIX.rstrip(".") if name == "step" else RANGE_PREFIX + name):
            yield
            synchronize()
    return scope()


def trace_events(profiler, device_type: str = "cuda") -> list[Event]:
    """Kernels (with memcpy / memset) and host ranges of a finished torch.profiler run, as summarise reads them.
    On the CPU (the tests' smoke run) the top-level aten ops stand for kernels."""
    from torch.autograd import DeviceType

    events = []
    for e in profiler.events():
        if e.name.startswith(RANGE_PREFIX.rstrip(".")):
            events.append(Event(e.name, "range", e.time_range.start, e.time_range.elapsed_us()))
        elif (e.device_type == DeviceType.CUDA if device_type == "cuda" else
              e.name.startswith("aten::") and not (e.cpu_parent is not None and e.cpu_parent.name.startswith("aten::"))):
            events.append(Event(e.name, "kernel", e.time_range.start, e.time_range.elapsed_us()))
    return events


def measure(variant: ProfileVariant, distributed, device_type: str = "cuda", model_config=None) -> dict:
    """Two profiled updates of the trainer's own step (after WARM_UPDATES), summarised. `distributed`: starts
    the one-rank process group FSDP2 needs. `device_type` "cpu" and a small `model_config`: the tests' smoke run
    of the same code (fp32, host ops for kernels)."""
    import contextlib

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.profiler import ProfilerActivity, profile

    from bench.trainer_step import build, preset_train_config, run_steps
    from hymo_core.models.presets import PRESETS
    from hymo_core.train.step_ranges import observing

    cuda = device_type == "cuda"
    device = torch.device(device_type)
    synchronize = torch.cuda.synchronize if cuda else (lambda: None)
    model_config = model_config or PRESETS[variant.model]
    config = preset_train_config(variant.model, variant.batch, variant.seq_len, variant.accumulation,
                                 max_steps=WARM_UPDATES + PROFILED_UPDATES + 1, compile=variant.compile,
                                 precision="bf16" if cuda else "fp32")
    if variant.fsdp:
        distributed()
    model, optimizer = build(model_config, config, device, fsdp=variant.fsdp)
    active = [False]
    profiler = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []))

    def on_update(step: int) -> None:
        if step == WARM_UPDATES:  # inside this update's (unrecorded) range: the next two are recorded whole
            synchronize()
            profiler.start()
            active[0] = True
        elif step == WARM_UPDATES + PROFILED_UPDATES:
            active[0] = False  # this update's ranges were opened while active: they still close
        elif step == WARM_UPDATES + PROFILED_UPDATES + 1:
            synchronize()
            profiler.stop()

    observer = lambda name: _synced_range(name, synchronize) if active[0] else contextlib.nullcontext()  # noqa: E731
    try:
        with sdpa_kernel(getattr(SDPBackend, SDPA_BACKEND_NAMES[variant.sdpa])), observing(observer):
            run_steps(model, optimizer, config, device, model_config.vocab_size, on_update)
        measured = summarise(trace_events(profiler, device_type), PROFILED_UPDATES)
        if cuda:
            measured["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
        return measured
    finally:
        model = optimizer = None
        if cuda:
            torch.cuda.empty_cache()


def write_summary(entries: list[dict], device: str, torch_version: str, commit: str, started: str) -> dict:
    """The gpu_profile.json object from gpu_check's profile-group entries (validated). An entry whose plan
    failed still names its model and variant (from its row name)."""
    by_row = {variant.row: variant for variant in PROFILE_VARIANTS}
    keys = ROW_KEYS + MEASURED_KEYS + ("launch_budget", "peak_memory_gib", "error", "seconds")
    rows = []
    for entry in entries:
        variant = by_row[entry["row"]]
        rows.append({"model": variant.model, "variant": variant.to_json(), **{k: entry[k] for k in keys if k in entry}})
    summary = {"schema": PROFILE_SCHEMA, "device": device, "torch": torch_version, "commit": commit, "started": started,
               "rows": rows}
    validate(summary)
    return summary
