"""The one prepared GPU check: kernels, GDN against fla, host syncs, MFU under FSDP2. One command.

    python bench/gpu_check.py --budget 450          # on one H100/H200: the rows that fit in 450 s (all: ~7 min)
    python bench/gpu_check.py --only kernels,gdn    # some groups: kernels | gdn | sync | mfu | profile
    python bench/gpu_check.py --only profile --budget 450   # where the step's time goes: gpu_profile.json
    python bench/gpu_check.py --dry-run             # on CPU: every row's plan, no CUDA call (CI runs it)
    python bench/gpu_check.py --preflight [--triton-env PY]   # every CPU-side check of the first GPU lease
    python bench/gpu_check.py --write               # also replace the "GPU check" section of docs/benchmarks.md

A first lease is one machine for 15 minutes, one command of at most 10, so the check is built to
return something whatever happens on it:

- every row is independent: its exception is caught and recorded (type, message, traceback tail) and
  the next row runs; a row that would start with less budget left than its expected minutes is
  recorded as "skipped: budget" instead;
- each row is printed (flushed) as it finishes, and the JSON and markdown are rewritten atomically
  after every row (and before it, marked "running", so a row killed by the time limit is named), into
  $OUT when it is set, else --out.

Rows (each with its expected minutes on one H200, in rows(); docs/benchmarks.md "GPU check" lists them):
kernels - each Triton kernel's bf16 output and input gradients against its PyTorch reference in fp32,
          judged against the eager bf16 reference's own error (the logit probe: Triton against the
          PyTorch probe, forward only);
gdn     - our chunked GDN forward + backward at hymo-750m's shapes, then fla's chunk_gated_delta_rule
          with its Hopper guard bypassed in-process (fla-core 0.6.0 refuses its gated backward on sm_90
          under triton 3.4-3.7.0 because it computes wrong gradients there: that figure is timing only);
sync    - one training step of the sample-sized hybrid under torch.cuda.set_sync_debug_mode("error");
mfu     - one bf16 matmul's TFLOP/s beside the stated peak; then tokens/s x training FLOPs per token (planner.training_flops_per_token, the convention named
          in the output) / the bf16 dense peak, dense-125m and hymo-750m, compile off and on, through the
          trainer's own step (bench/trainer_step.py: `train` with the preset's [train] defaults, bf16
          autocast, the logit probe, QK-Clip, the trainer's clip and wrapping, ACCUMULATION micro-batches
          per update); ordinary updates and a logging one timed apart, the step amortised over
          LOG_INTERVAL; with the optimizer's Newton-Schulz FLOPs per update and its dtype;
profile - two profiled updates of the trainer's step per variant (bench/gpu_profile.py: one process
          without FSDP, FSDP2, compile on and off, SDPA flash / cuDNN / efficient, accumulation 8 and 1):
          top 25 kernels by GPU time, kernels per update, GPU idle share, phases that sum to the update,
          written to gpu_profile.json (schema hymo.gpu_profile/1, described in bench/gpu_profile.py). It
          replaces bench/gpu_step_breakdown.py, whose phases did not sum to its step.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench.report import markdown_table, write_section  # noqa: E402
from hymo_core.models.configs import ModelConfig  # noqa: E402
from hymo_core.models.presets import PRESETS  # noqa: E402
from hymo_core.planner.muon import muon_matrix_shapes, muon_update_cost  # noqa: E402
from hymo_core.planner.planner import (FLOP_CONVENTION, count_parameters, mixer_sequence_flops,  # noqa: E402
                                       model_shape, training_flops_per_token)
from hymo_core.train.monitor import PEAK_FLOPS  # noqa: E402
from hymo_core.train.optim_config import NorMuonConfig, resolve_ns_dtype  # noqa: E402

# A GPT-2-small-sized dense decoder (~124 M parameters with the tied 50,304-token table): the preset `hymo train` uses.
DENSE_125M = PRESETS["dense-125m"]
GDN_SHAPE = dict(B=4, T=4096, H=7, K=128, V=256)  # hymo-750m: 7 heads of 128, values 2x wide; 16k tokens a call
KERNEL_SLACK = 2.0  # a Triton kernel may be at most this much less accurate than the eager bf16 code it replaces
KERNEL_FLOOR = 1e-2  # ... or this max-relative error, whichever is larger
MFU_GOALS = {"dense": 0.40, "hybrid": 0.30}
GDN_GOAL = 0.8
GROUPS = ("kernels", "gdn", "sync", "mfu", "profile")
SYNC_MODEL = "hymo-tiny"  # the sample recipe's hybrid: GDN, MLA, MoE and MTP, all the code a step runs
SYNC_BATCH = 8
TEST_FILES = (  # the CPU-side checks of the first GPU lease (issue 42), run by --preflight
    "tests/hymo_core/kernels/test_gdn_autotune.py",
    "tests/hymo_core/kernels/test_gdn_ragged_decay.py",
    "tests/hymo_core/kernels/test_kernels_bf16_emulation.py",
    "tests/hymo_core/train/test_normuon_bf16.py",
    "tests/hymo_core/models/test_moe_flops.py",
    "tests/hymo_core/models/test_mla_flash_layout.py",
    "tests/hymo_core/train/test_host_sync_dispatch.py",
    "tests/hymo_core/train/test_launch_budget.py",  # issue 53: the step's launches at the preset shapes
    "tests/hymo_core/train/test_optimizer_launches.py",
)
_clock = time.monotonic  # the budget's clock (a test replaces it)


@dataclass
class Row:
    """One independent measurement: `plan` runs on the CPU (the dry run stops there), `measure` on the GPU."""

    name: str
    group: str
    minutes: float  # expected wall minutes on one H200, compiles and autotuning included
    compares: str
    plan: Callable[[], dict]
    measure: Callable[[dict, "Context"], dict] | None = None


@dataclass
class Context:
    """What rows share on the GPU: the results so far (the fla row reads ours), the peak, the step count."""

    peak: float = float("nan")
    steps: int = 3
    results: dict[str, dict] = field(default_factory=dict)


@dataclass
class Report:
    device: str
    dry_run: bool
    started: str
    budget_s: float
    flop_convention: str = FLOP_CONVENTION
    rows: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"device": self.device, "dry_run": self.dry_run, "started": self.started, "budget_s": self.budget_s,
                "flop_convention": self.flop_convention, "rows": self.rows, "notes": self.notes}


# ---------------------------------------------------------------- plans (CPU, cheap: CI runs them)


KERNEL_CASES = ("rms_norm", "swiglu", "rope", "cross_entropy+z")  # bench/gpu_kernels.py's cases, in its order


def kernel_plan(name: str) -> Callable[[], dict]:
    def plan() -> dict:
        return {"kernel": name, "bound": f"max({KERNEL_SLACK} x eager bf16 error, {KERNEL_FLOOR})"}
    return plan


def gdn_plan(batch: int | None = None) -> dict:
    """hymo-750m's GDN call: the planner's forward sequence FLOPs (already 2 per multiply-add) x 3 for fwd + bwd.
    `batch`: another B than GDN_SHAPE's (the preset trains at 2); the plan then names how many programs the
    sequential state pass gets at each value block it may autotune to (one per batch x head x V / BV)."""
    s = GDN_SHAPE if batch is None else {**GDN_SHAPE, "B": batch}
    shape = model_shape(PRESETS["hymo-750m"])
    preset = (shape.gdn_heads, shape.gdn_key_head_dim, shape.gdn_value_head_dim)
    if preset != (s["H"], s["K"], s["V"]):
        raise ValueError(f"GDN_SHAPE {s} is not hymo-750m's GDN (heads, K, V) = {preset}")
    tokens = s["B"] * s["T"]
    from hymo_core.kernels.gdn_triton_state import STATE_CONFIGS

    programs = {f"BV={bv}": s["B"] * s["H"] * s["V"] // bv for bv in sorted({c.kwargs["BV"] for c in STATE_CONFIGS})}
    return {"shape": dict(s), "tokens_per_call": tokens, "state_pass_programs": programs,
            "flops": 3 * mixer_sequence_flops(shape, "G", s["T"]) * tokens}


def fla_plan() -> dict:
    """Whether fla is on the path, found without importing it (its import costs seconds; the GPU row imports it)."""
    import importlib.util

    found = importlib.util.find_spec("fla") is not None
    return {**gdn_plan(), "fla": "found" if found else "fla not installed (no module named 'fla')",
            "fla_note": "timing only: fla's Hopper guard bypassed (its gated dqkwg is wrong on sm_90, triton < 3.7.1)"}


def sync_plan() -> dict:
    config = PRESETS[SYNC_MODEL]
    return {"model": SYNC_MODEL, "batch": SYNC_BATCH, "seq_len": config.max_seq_len,
            "parameters": count_parameters(model_shape(config)).total}


@dataclass
class MFUCase:
    name: str
    kind: str  # dense | hybrid
    config: ModelConfig
    batch: int  # micro-batch
    seq_len: int
    compile: bool
    accumulation: int = 8  # micro-batches per update: Newton-Schulz is charged to an update, as in a real run


LOG_INTERVAL = 10  # TrainConfig's default: one logging update (weights' snapshot, fp64 update ratios) in ten
WARM_UPDATES = 2
MFU_CASES = [MFUCase(name, kind, config, batch, seq, compiled)  # compile off first: if the budget runs out,
             for compiled in (False, True)                        # the slowest row (750m compiled) goes
             for name, kind, config, batch, seq in (("dense-125m", "dense", DENSE_125M, 8, 2048),
                                                    ("hymo-750m", "hybrid", PRESETS["hymo-750m"], 2, 4096))]


MATMUL = 8192


def matmul_plan() -> dict:
    return {"shape": [MATMUL, MATMUL, MATMUL], "flops": 2 * MATMUL**3}


def optimizer_plan(config: ModelConfig, optimizer: NorMuonConfig) -> dict:
    """NorMuon's Newton-Schulz FLOPs per step on one rank (planner.muon) and the dtype it runs in."""
    cost = muon_update_cost(muon_matrix_shapes(model_shape(config)), 1, "owned", steps=optimizer.ns_steps)
    return {"optimizer": "NorMuon + CautiousAdamW", "ns_flops_per_step": cost.ns_flops, "ns_matrices": cost.matrices,
            "ns_dtype": resolve_ns_dtype(optimizer.ns_dtype, "cuda")}  # the dtype the GPU run uses


def mfu_plan(case: MFUCase) -> Callable[[], dict]:
    def plan() -> dict:
        shape = model_shape(case.config)
        parameters = count_parameters(shape).total
        built = _meta_parameters(case.name, case.config)
        if built != parameters:
            raise ValueError(f"{case.name}: the planner counts {parameters:,} parameters, the model has {built:,}")
        flops = float(training_flops_per_token(shape, case.seq_len))
        row = {"model": case.name, "kind": case.kind, "compile": case.compile, "batch": case.batch,
               "seq_len": case.seq_len, "accumulation": case.accumulation, "log_interval": LOG_INTERVAL,
               "parameters": parameters, "flops_per_token": flops,
               "model_flops_per_step": flops * case.batch * case.seq_len,  # one micro-batch
               "model_flops_per_update": flops * case.batch * case.seq_len * case.accumulation,
               **optimizer_plan(case.config, NorMuonConfig(lr=1e-4, muon_lr=1e-4))}
        row["ns_share_of_model_flops"] = row["ns_flops_per_step"] / row["model_flops_per_update"]
        return row
    return plan


_META_PARAMETERS: dict[str, int] = {}


def _meta_parameters(name: str, config: ModelConfig) -> int:
    """Parameters of the model the row will build, built on meta (so a config error shows on the CPU); once per model."""
    if name not in _META_PARAMETERS:
        from hymo_core.models.init import build_on_meta

        _META_PARAMETERS[name] = sum(p.numel() for p in build_on_meta(config, seed=0).parameters())
    return _META_PARAMETERS[name]


def rows() -> list[Row]:
    """Every row in run order, with its expected minutes on one H200 (together about 7)."""
    out = [Row(f"kernel {name}", "kernels", 0.15, "Triton bf16 vs fp32 reference, next to eager bf16's error",
               kernel_plan(name), measure_kernel) for name in KERNEL_CASES]
    out += [Row("kernel gdn_chunk", "kernels", 0.5, "Triton chunked GDN bf16 vs reference in fp32, next to eager bf16",
                kernel_plan("gdn_chunk"), measure_gdn_kernel),
            Row("kernel logit_probe", "kernels", 0.1, "Triton probe on bf16 vs PyTorch probe in fp32, next to PyTorch on bf16",
                kernel_plan("logit_probe"), measure_probe),
            Row("gdn ours", "gdn", 0.6, "our GDN fwd+bwd at hymo-750m's shapes: ms and TFLOP/s", gdn_plan, measure_gdn_ours),
            Row("gdn ours B=2", "gdn", 0.4, "the same at the preset's batch of 2 (the state pass's programs per BV in the plan)",
                lambda: gdn_plan(batch=2), measure_gdn_ours),
            Row("gdn fla", "gdn", 1.0, "fla chunk_gated_delta_rule fwd+bwd, same inputs (timing only); fla / ours",
                fla_plan, measure_gdn_fla),
            Row("sync step", "sync", 0.4, "one training step under set_sync_debug_mode('error'): pass, or the op that synced",
                sync_plan, measure_sync)]
    out.append(Row("mfu matmul peak", "mfu", 0.1, "one 8192^3 bf16 matmul's TFLOP/s beside the stated peak MFU divides by",
                   matmul_plan, measure_matmul))
    out += [Row(f"mfu {c.name} compile {'on' if c.compile else 'off'}", "mfu",
                {("dense", False): 0.4, ("dense", True): 1.0, ("hybrid", False): 0.8, ("hybrid", True): 1.8}[(c.kind, c.compile)],
                "tokens/s x FLOPs/token / bf16 peak, the trainer's step (one process: no FSDP)", mfu_plan(c),
                lambda plan, ctx, c=c: measure_mfu(c, plan, ctx)) for c in MFU_CASES]
    return out + profile_rows()


def fla_available() -> str | None:
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule  # noqa: F401
    except Exception as error:  # noqa: BLE001 - absent or broken, both mean "not compared"
        return f"{type(error).__name__}: {error}"[:200]
    return None


# ---------------------------------------------------------------- GPU work (never reached by --dry-run)


def cuda_time(fn: Callable[[], Any], warmup: int = 2, repeats: int = 5) -> float:
    """Median milliseconds of fn() with CUDA events (synchronised)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def _judge(errors: dict) -> dict:
    bound = max(KERNEL_SLACK * errors["reference"], KERNEL_FLOOR)
    ok = bool(errors["triton"] <= bound)
    return {"triton_err": errors["triton"], "eager_bf16_err": errors["reference"], "bound": bound,
            "status": "ok" if ok else "failed", **{k: v for k, v in errors.items() if k.endswith("_error")}}


def measure_kernel(plan: dict, ctx: Context) -> dict:
    from bench.gpu_kernels import bf16_errors, cases

    for name, inputs, fn, reference in cases(small=True):
        if name == plan["kernel"]:
            return _judge(bf16_errors(inputs, fn, reference, catch=True)[0])
    raise KeyError(f"bench/gpu_kernels.py has no case {plan['kernel']!r}")


def measure_gdn_kernel(plan: dict, ctx: Context) -> dict:
    from bench.gpu_kernels import bf16_errors
    from hymo_core.kernels.gdn import gated_delta_rule

    gen = torch.Generator(device="cuda").manual_seed(0)
    B, T, H, K, V = 1, 1024, 2, 128, 256
    q = torch.nn.functional.normalize(torch.randn(B, T, H, K, device="cuda", generator=gen), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, device="cuda", generator=gen), dim=-1)
    v = torch.randn(B, T, H, V, device="cuda", generator=gen)
    g = -torch.rand(B, T, H, device="cuda", generator=gen) * 0.1
    beta = torch.rand(B, T, H, device="cuda", generator=gen)
    errors, _, _ = bf16_errors(
        [q, k, v, g, beta],
        lambda q, k, v, g, b, backend: gated_delta_rule(q, k, v, g.float(), b.float(), backend=backend)[0],
        lambda q, k, v, g, b: gated_delta_rule(q, k, v, g, b, backend="reference")[0], catch=True)
    return _judge(errors)


def measure_probe(plan: dict, ctx: Context) -> dict:
    return _judge(probe_errors("cuda", torch.bfloat16))


def probe_errors(device: str, dtype: torch.dtype) -> dict:
    """The probe has no gradient: its forward, the Triton kernel on `dtype` inputs against the PyTorch probe
    in fp32 ("triton"), next to the PyTorch probe on the same `dtype` inputs ("reference")."""
    from bench.gpu_kernels import max_relative_error
    from hymo_core.kernels.logit_probe import causal_max_logits

    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(2, 4, 512, 64, device=device, generator=gen) * 2
    k = torch.randn(2, 4, 512, 64, device=device, generator=gen) * 2
    truth = causal_max_logits(q, k, 8.0, backend="reference")
    errors: dict = {}
    for backend in ("triton", "reference"):
        try:
            errors[backend] = max_relative_error(causal_max_logits(q.to(dtype), k.to(dtype), 8.0, backend=backend), truth)
        except Exception as error:  # noqa: BLE001 - a kernel that cannot launch is this row's finding
            errors[backend] = float("nan")
            errors[f"{backend}_error"] = f"{type(error).__name__}: {error}"[:300]
    return errors


def _gdn_inputs(s: dict):
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape_k, shape_v, shape_h = (s["B"], s["T"], s["H"], s["K"]), (s["B"], s["T"], s["H"], s["V"]), (s["B"], s["T"], s["H"])
    q = torch.nn.functional.normalize(torch.randn(shape_k, device="cuda", generator=gen), dim=-1).bfloat16()
    k = torch.nn.functional.normalize(torch.randn(shape_k, device="cuda", generator=gen), dim=-1).bfloat16()
    v = torch.randn(shape_v, device="cuda", generator=gen).bfloat16()
    g = (-torch.rand(shape_h, device="cuda", generator=gen) * 0.1).float()
    beta = torch.rand(shape_h, device="cuda", generator=gen).float()
    do = torch.randn(shape_v, device="cuda", generator=gen).bfloat16()
    return (q, k, v, g, beta), do


def _gdn_step_ms(op, inputs, do) -> float:
    def step():
        leaves = [t.detach().requires_grad_() for t in inputs]
        op(*leaves).backward(do)
    return cuda_time(step)


def measure_gdn_ours(plan: dict, ctx: Context) -> dict:
    from hymo_core.kernels.gdn import gated_delta_rule

    inputs, do = _gdn_inputs(plan["shape"])
    ms = _gdn_step_ms(lambda *xs: gated_delta_rule(*xs, backend="triton")[0], inputs, do)
    return {"ours_ms": ms, "ours_tflops": plan["flops"] / ms / 1e9}


@contextlib.contextmanager
def fla_hopper_guard_bypassed():
    """fla-core 0.6.0 raises in chunk_bwd_dqkwg on Hopper with 3.4.0 <= triton < 3.7.1 (fla issue #640:
    wrong gradients). For timing only, make its module believe triton >= 3.7.1, then put it back."""
    import fla.ops.common.chunk_o as chunk_o

    if not hasattr(chunk_o, "TRITON_ABOVE_3_7_1"):
        yield "no Hopper guard found in fla.ops.common.chunk_o: fla run as installed"
        return
    saved = chunk_o.TRITON_ABOVE_3_7_1
    chunk_o.TRITON_ABOVE_3_7_1 = True
    try:
        yield "fla.ops.common.chunk_o.TRITON_ABOVE_3_7_1 forced True for this row"
    finally:
        chunk_o.TRITON_ABOVE_3_7_1 = saved


def measure_gdn_fla(plan: dict, ctx: Context) -> dict:
    missing = fla_available()
    if missing:
        return {"status": "skipped: fla not installed", "fla": f"fla not installed ({missing})"}
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    s = plan["shape"]
    inputs, do = _gdn_inputs(s)
    with fla_hopper_guard_bypassed() as how:
        ms = _gdn_step_ms(lambda q_, k_, v_, g_, b_: chunk_gated_delta_rule(q_, k_, v_, g_, b_.to(v_.dtype),
                                                                           scale=s["K"] ** -0.5)[0], inputs, do)
    row = {"fla_ms": ms, "fla_tflops": plan["flops"] / ms / 1e9, "timing_only": True, "guard": how}
    ours = ctx.results.get("gdn ours", {}).get("ours_ms")
    if ours:
        row.update(ours_ms=ours, fla_over_ours=ms / ours, goal_met=ms / ours >= GDN_GOAL)
    return row


def measure_matmul(plan: dict, ctx: Context) -> dict:
    """What this device's bf16 matmul reaches (MFU still divides by the stated peak: PaLM's definition)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    a, b = (torch.randn(MATMUL, MATMUL, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(2))
    ms = cuda_time(lambda: a @ b, warmup=3, repeats=10)
    return {"matmul_tflops": plan["flops"] / ms / 1e9, "stated_peak_tflops": ctx.peak / 1e12}


def _distributed() -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29533", rank=0, world_size=1)


def _fsdp_model(config: ModelConfig, compile_blocks: bool):
    """The trainer's layout on one rank: built on meta, FSDP2 per block (bf16 params, fp32 reductions), then materialised."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from hymo_core.models.init import build_on_meta
    from hymo_core.models.materialise import materialise_

    _distributed()
    model = build_on_meta(config, seed=0)
    mesh = init_device_mesh("cuda", (1,))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks():
        if compile_blocks:
            block.compile()
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    materialise_(model, "cuda")
    model.train()
    return model


def ns_dtypes(optimizer) -> dict[str, str]:
    """The Newton-Schulz dtype each orthogonalised parameter group runs in, as the built optimizer holds it."""
    return {str(group.get("group", group.get("name", index))):
            resolve_ns_dtype(str(group["ns_dtype"]).removeprefix("torch."), group["params"][0].device)
            for index, group in enumerate(getattr(optimizer, "param_groups", [])) if "ns_dtype" in group and group["params"]}


def _train_step(model, optimizer, x, y):
    def step():
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        model.after_optimizer_step(read=False)
        optimizer.zero_grad(set_to_none=True)
    return step


def measure_sync(plan: dict, ctx: Context) -> dict:
    """A warm-up step (lazy optimizer state, autotune may read the device), then one under sync debug 'error'."""
    from hymo_core.train.optim import build_optimizer

    config = PRESETS[SYNC_MODEL]
    model = _fsdp_model(config, compile_blocks=False)
    optimizer = build_optimizer(model, NorMuonConfig(lr=1e-4, muon_lr=1e-4))
    gen = torch.Generator(device="cuda").manual_seed(0)
    tokens = torch.randint(0, config.vocab_size, (plan["batch"], plan["seq_len"] + 1), device="cuda", generator=gen)
    step = _train_step(model, optimizer, tokens[:, :-1], tokens[:, 1:])
    step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    except RuntimeError as error:
        stack = traceback.extract_tb(error.__traceback__)
        ours = [f for f in stack if str(REPO_ROOT) in f.filename]  # our line that called it, then torch's frame
        where = f"{Path(ours[-1].filename).relative_to(REPO_ROOT)}:{ours[-1].lineno} {ours[-1].line}" if ours else "?"
        return {"status": "failed", "synced_at": where, "innermost": f"{stack[-1].filename}:{stack[-1].lineno} {stack[-1].name}",
                "error": f"{type(error).__name__}: {error}"[:300], "traceback": _tail(error)}
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return {"synced_at": None, "ns_dtype": ns_dtypes(optimizer)}


def measure_mfu(case: MFUCase, plan: dict, ctx: Context) -> dict:
    """The trainer's own updates on synthetic tokens (bench/trainer_step.py): ordinary ones and the logging one
    timed apart (the device synchronised only at the window's ends), the update amortised over LOG_INTERVAL."""
    import gc

    from bench.trainer_step import build, preset_train_config, run_steps

    gc.collect()  # the previous row's model (or an error's frames) gone before this one allocates
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = optimizer = None
    try:
        device = torch.device("cuda")
        last = WARM_UPDATES + ctx.steps + 1  # the last update is a logging one (the trainer logs its final update)
        config = preset_train_config(case.name, case.batch, case.seq_len, case.accumulation, max_steps=last,
                                     compile=case.compile, log_interval=LOG_INTERVAL)
        model, optimizer = build(case.config, config, device)
        marks: dict[int, float] = {}

        def on_update(step: int) -> None:
            if step in (1, WARM_UPDATES, last - 1, last):
                torch.cuda.synchronize()
                marks[step] = time.perf_counter()

        started = time.perf_counter()
        run_steps(model, optimizer, config, device, case.config.vocab_size, on_update)
        ordinary_ms = (marks[last - 1] - marks[WARM_UPDATES]) / ctx.steps * 1e3
        logged_ms = (marks[last] - marks[last - 1]) * 1e3
        ms = ((LOG_INTERVAL - 1) * ordinary_ms + logged_ms) / LOG_INTERVAL
        tokens_per_s = case.batch * case.seq_len * case.accumulation / (ms / 1e3)
        row: dict[str, Any] = {"first_step_s": marks[1] - started, "ns_dtype": ns_dtypes(optimizer), "step_ms": ms,
                               "ordinary_update_ms": ordinary_ms, "logging_update_ms": logged_ms,
                               "tokens_per_s": tokens_per_s, "mfu": tokens_per_s * plan["flops_per_token"] / ctx.peak,
                               "ns_tflops_per_s": plan["ns_flops_per_step"] / (ms / 1e3) / 1e12,
                               "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30}
        row["goal_met"] = bool(row["mfu"] >= MFU_GOALS[case.kind])
        return row
    finally:
        model = optimizer = None  # the row's model and optimizer state go before the next row builds its own
        torch.cuda.empty_cache()


def profile_rows() -> list[Row]:
    """bench/gpu_profile.py's variants, each a row (eager about half a minute, compiled a minute more)."""
    import bench.gpu_profile as gpu_profile

    minutes = {("dense", False): 0.6, ("dense", True): 1.2, ("hybrid", False): 0.8, ("hybrid", True): 1.8}  # as the mfu rows
    return [Row(v.row, "profile", minutes[("hybrid" if v.model.startswith("hymo") else "dense", v.compile)],
                "two profiled updates of the trainer's step: top kernels, kernels/update, GPU idle, phases",
                lambda v=v: gpu_profile.plan(v), lambda plan, ctx, v=v: gpu_profile.measure(v, _distributed))
            for v in gpu_profile.PROFILE_VARIANTS]


# ---------------------------------------------------------------- the resilient runner


def _tail(error: BaseException, chars: int = 1500) -> str:
    return "".join(traceback.format_exception(type(error), error, error.__traceback__))[-chars:]


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, delete=False, suffix=".tmp") as handle:
        handle.write(text)
    os.replace(handle.name, path)


def save(report: Report, out: Path) -> None:
    """JSON first (the record), then the markdown; a formatting bug costs the table, never the record or the run."""
    _write_atomic(out / "gpu_check.json", json.dumps(report.to_json(), indent=2, default=str) + "\n")
    profiled = [r for r in report.rows if r["group"] == "profile"]
    if profiled:
        from bench.gpu_profile import write_summary

        summary = write_summary(profiled, report.device, torch.__version__, commit(), report.started)
        _write_atomic(out / "gpu_profile.json", json.dumps(summary, indent=2, default=str) + "\n")
    try:
        text = markdown(report)
    except Exception as error:  # noqa: BLE001
        text = f"markdown failed ({type(error).__name__}: {error}); gpu_check.json has every row"
    _write_atomic(out / "gpu_check.md", text + "\n")


def run_rows(selected: list[Row], report: Report, out: Path, budget: float, ctx: Context | None) -> None:
    """Each row in turn, whatever the others did. `ctx` None: the dry run (plans only)."""
    started = _clock()
    for row in selected:
        entry: dict[str, Any] = {"row": row.name, "group": row.group, "expected_min": row.minutes,
                                 "compares": row.compares}
        left = budget - (_clock() - started)
        if left < row.minutes * 60:
            entry.update(status="skipped: budget", budget_left_s=round(left, 1))
            report.rows.append(entry)
        else:
            entry["status"] = "running"
            report.rows.append(entry)
            save(report, out)  # a row the time limit kills is named on disk
            row_started = _clock()
            try:
                entry.update(row.plan())
                if ctx is None:
                    entry["status"] = "planned"
                else:
                    result = row.measure(entry, ctx)
                    entry["status"] = "ok"
                    entry.update(result)
                    ctx.results[row.name] = entry
            except Exception as error:  # noqa: BLE001 - one row's failure is that row's result
                entry.update(status="error", error=f"{type(error).__name__}: {error}"[:400], traceback=_tail(error))
            entry["seconds"] = round(_clock() - row_started, 2)
        save(report, out)
        print(f"[{row.group}] {row.name}: {entry['status']} {summary(entry)}", flush=True)


# ---------------------------------------------------------------- output


def _fmt(value: float | None, pattern: str = "{:.2f}") -> str:
    return "not measured" if value is None or (isinstance(value, float) and math.isnan(value)) else pattern.format(value)


def summary(entry: dict) -> str:
    """One short cell: the row's figures, or its error (never raises: the runner prints it after every row)."""
    try:
        return _summary(entry)
    except Exception as error:  # noqa: BLE001
        return f"(summary failed: {type(error).__name__}: {error}; see the JSON)"[:160]


def _summary(entry: dict) -> str:
    if entry.get("error") and entry["status"] != "failed":
        return entry["error"][:120].replace("|", "/").replace("\n", " ")
    if "triton_err" in entry:
        return f"triton {entry['triton_err']:.2e}, eager bf16 {entry['eager_bf16_err']:.2e}, bound {entry['bound']:.2e}"
    if "fla_ms" in entry:
        ratio = f", fla / ours {entry['fla_over_ours']:.2f} (goal >= {GDN_GOAL})" if "fla_over_ours" in entry else ""
        return f"fla {entry['fla_ms']:.2f} ms, {entry['fla_tflops']:.0f} TFLOP/s (timing only){ratio}"
    if "ours_ms" in entry:
        return f"ours {entry['ours_ms']:.2f} ms" + (f", {entry['ours_tflops']:.0f} TFLOP/s" if "ours_tflops" in entry else "")
    if "matmul_tflops" in entry:
        return f"bf16 matmul {entry['matmul_tflops']:.0f} TFLOP/s; stated peak {entry['stated_peak_tflops']:.0f}"
    if "synced_at" in entry:
        return "no host sync" if entry["synced_at"] is None else f"synced at {entry['synced_at']}"[:160]
    if "kernels_per_step" in entry:
        top = entry["top_kernels"][0]["name"][:40] if entry["top_kernels"] else "-"
        return (f"update {entry['step_ms']:.0f} ms, {entry['kernels_per_step']:,.0f} kernels, GPU idle "
                f"{entry['gpu_idle_share']:.0%}; top: {top}")
    if "launch_budget" in entry:
        return "launches (meta): " + ", ".join(f"{k} {v:,}" for k, v in entry["launch_budget"].items())
    if "mfu" in entry:
        return (f"MFU {entry['mfu']:.1%} (goal {MFU_GOALS[entry['kind']]:.0%}), {entry['tokens_per_s']:,.0f} tokens/s, "
                f"step {entry['step_ms']:.0f} ms")
    if entry["status"].startswith("skipped") and "fla" in entry:
        return entry["fla"][:120]
    if "flops_per_token" in entry:
        return (f"{entry['parameters'] / 1e6:,.0f} M params, {entry['flops_per_token'] / 1e9:.2f} GFLOP/token, "
                f"NS {entry['ns_flops_per_step'] / 1e12:.2f} TFLOP/step ({entry['ns_dtype']})")
    if "flops" in entry:
        return f"{entry['flops'] / 1e12:.2f} TFLOP per timed call" + (f"; fla {entry['fla']}"[:80] if "fla" in entry else "")
    return ""


def markdown(report: Report) -> str:
    lines = [f"Device: {report.device}; started {report.started}; budget {report.budget_s:.0f} s"
             + (" (dry run: plans only, not measured on a GPU)" if report.dry_run else "") + ".",
             f"FLOP convention: {report.flop_convention}.", ""]
    lines += [markdown_table(["row", "expected min", "took s", "status", "result", "compares"],
                             [(r["row"], f"{r['expected_min']:.2f}",
                               "-" if report.dry_run else _fmt(r.get("seconds"), "{:.0f}"), r["status"],
                               summary(r) or "-", r["compares"]) for r in report.rows]), ""]
    mfu = [r for r in report.rows if r["group"] == "mfu" and "flops_per_token" in r]
    if mfu:
        lines += [markdown_table(
            ["model", "compile", "batch x T x accumulation", "params", "model FLOPs/token", "NorMuon NS TFLOP/update", "NS / model FLOPs",
             "NS dtype", "step ms", "tokens/s", "MFU", "goal", "peak GiB"],
            [(r["model"], "on" if r["compile"] else "off", f"{r['batch']} x {r['seq_len']} x {r.get('accumulation', 1)}", f"{r['parameters'] / 1e6:,.0f} M",
              f"{r['flops_per_token'] / 1e9:.2f} G", f"{r['ns_flops_per_step'] / 1e12:.2f}",
              f"{r['ns_share_of_model_flops']:.1%}", _dtype_cell(r.get("ns_dtype")), _fmt(r.get("step_ms")),
              _fmt(r.get("tokens_per_s"), "{:,.0f}"), _fmt(r.get("mfu"), "{:.1%}"), f"{MFU_GOALS[r['kind']]:.0%}",
              _fmt(r.get("peak_memory_gib"), "{:.1f}")) for r in mfu]), ""]
    if report.notes:
        lines += [f"- {note}" for note in report.notes]
    return "\n".join(lines).rstrip("\n")


def _dtype_cell(value) -> str:
    if isinstance(value, dict):
        return ", ".join(sorted(set(value.values()))) or "-"
    return str(value) if value else "-"


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO_ROOT,
                              timeout=10).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def select(groups: str | None) -> list[Row]:
    wanted = GROUPS if not groups else tuple(g.strip() for g in groups.split(",") if g.strip())
    unknown = sorted(set(wanted) - set(GROUPS))
    if unknown:
        raise SystemExit(f"bench/gpu_check.py: --only {','.join(unknown)}: not a group (groups: {', '.join(GROUPS)})")
    return [row for row in rows() if row.group in wanted]


# ---------------------------------------------------------------- preflight: every CPU-side check in one command


def preflight(out: Path, triton_env: str | None, python: str = sys.executable) -> int:
    """One line per check; non-zero when any fails. The dry run, each issue-42 test file, the sm_90 compile."""
    results: list[tuple[str, bool, str]] = []
    started = time.perf_counter()
    try:
        report = Report(device="none (dry run)", dry_run=True, started=_now(), budget_s=float("inf"))
        with contextlib.redirect_stdout(open(os.devnull, "w")):
            run_rows(rows(), report, out, float("inf"), None)
        bad = [r["row"] for r in report.rows if r["status"] != "planned"]
        results.append(("dry run", not bad, f"{len(report.rows)} rows planned" if not bad else f"not planned: {', '.join(bad)}"))
    except Exception as error:  # noqa: BLE001
        results.append(("dry run", False, f"{type(error).__name__}: {error}"[:200]))
    _line(*results[-1], time.perf_counter() - started)
    for test in TEST_FILES:
        started = time.perf_counter()
        if not (REPO_ROOT / test).is_file():
            results.append((test, False, "missing: the file does not exist"))
        else:
            done = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", test], cwd=REPO_ROOT,
                                  capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
            last = (done.stdout.strip().splitlines() or ["no output"])[-1]
            results.append((test, done.returncode == 0, last))
        _line(*results[-1], time.perf_counter() - started)
    if triton_env:
        started = time.perf_counter()
        results.append(compile_check(triton_env, out))
        _line(*results[-1], time.perf_counter() - started)
    failed = [name for name, ok, _ in results if not ok]
    print(f"preflight: {len(results) - len(failed)} of {len(results)} checks pass" + (f"; failed: {', '.join(failed)}" if failed else ""),
          flush=True)
    return 1 if failed else 0


def compile_check(python: str, out: Path) -> tuple[str, bool, str]:
    """Every kernel compiled for sm_90 under the triton of another interpreter (bench/kernel_resources.py --json)."""
    target = out / "kernel_resources_sm90.json"
    done = subprocess.run([python, str(REPO_ROOT / "bench" / "kernel_resources.py"), "--json", str(target), "--targets", "sm_90"],
                          cwd=REPO_ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    name = f"sm_90 compile ({python})"
    if done.returncode not in (0, 1) or not target.is_file():
        return name, False, (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
    data = json.loads(target.read_text())
    misfits = [u for u in data["usages"] if u["problems"]]
    first = (f" (first: {misfits[0]['kernel']} {misfits[0]['preset']} {misfits[0]['shape']} {misfits[0]['config']}: "
             f"{'; '.join(misfits[0]['problems'])})") if misfits else ""
    return (f"sm_90 compile (triton {data['triton']})", not misfits,
            f"{len(data['usages'])} launches compiled, {len(misfits)} do not fit{first}")


def _line(name: str, ok: bool, detail: str, seconds: float) -> None:
    print(f"{'PASS' if ok else 'FAIL'}  {name}  ({seconds:.0f} s): {detail}", flush=True)


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())


# ---------------------------------------------------------------- docs


def doc_section(report: Report, table: str) -> tuple[str, str]:
    """The GPU check section of docs/benchmarks.md: how to prepare and run it, then the plan or the results."""
    plan = "\n".join(f"- `{row.name}` ({row.minutes:g} min): {row.compares}" for row in rows())
    total = sum(row.minutes for row in rows())
    prose = f"""One command on one GPU, built so that the first 15-minute lease returns something whatever happens:
each row is independent (an exception is recorded with its traceback tail and the next row runs), each is
printed as it finishes, and `gpu_check.json` / `gpu_check.md` are rewritten after every row into `$OUT` (else
`--out`). A row that would start with less `--budget` left than its expected minutes is recorded as
"skipped: budget". `--only kernels,gdn,sync,mfu,profile` picks groups; each group fits 8 minutes, all of
them together do not (the budget skips the last rows). Expected minutes on one H200 are estimates,
{total:.1f} in all (not measured). The MFU and profile rows run the trainer's own step (bench/trainer_step.py);
`--only profile` also writes `gpu_profile.json` (schema in bench/gpu_profile.py). `python bench/gpu_check.py --preflight [--triton-env PY]` runs every CPU-side
check of issue 42 first, one line per check.

The rows, in run order (expected minutes; what each compares):

{plan}

FLOP convention of every MFU figure (the trainer's monitor calls the same function,
`planner.training_flops_per_token`): {FLOP_CONVENTION}. The GDN row's FLOPs are the planner's forward
sequence term (already 2 per multiply-add) x 3 for forward + backward. NorMuon's Newton-Schulz FLOPs per step
(`planner.muon`) and its dtype are reported beside each MFU row; MFU itself counts model FLOPs only.

fla-core 0.6.0 refuses its gated backward (`chunk_bwd_dqkwg`) on Hopper with triton 3.4-3.7.0, because it
gives wrong gradients there (fla issue #640); the device has triton 3.6. The `gdn fla` row bypasses that guard
inside its own process for that row only, so its figure is **timing only**. Without fla the row records "fla
not installed" and the rest runs.

Preparation, once, on a machine with the package index (fla-core 0.6.0 and what it imports beyond torch and
triton, einops and packaging, are pure-Python wheels, about 1.3 MB together; `.whl/` is git-ignored, so name
it in the device tool's `carry`). Checked here: installed that way beside triton 3.6, fla imports and its
guard flags read TRITON_ABOVE_3_4_0 True, TRITON_ABOVE_3_7_1 False, the combination the row bypasses.

    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl fla-core==0.6.0 einops packaging

The device command (one line; no index there, so the wheels install from `.whl/` into /tmp/site):

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site; PYTHONUNBUFFERED=1 python3 bench/gpu_check.py --budget 450

Give that command the device tool's full 600 s: the 450 s budget leaves the rest for imports and for a row
that overruns its estimate. Without `.whl/` the install fails, the check still runs, and `gdn fla` says so.
If the command is killed anyway, `$OUT/gpu_check.json` holds every finished row and names the one running.

This run: {"`--dry-run`: plans only, **not measured on a GPU**" if report.dry_run else report.device}; commit {commit()}."""
    return prose, table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="plans only, on CPU: stop before the first CUDA call")
    parser.add_argument("--preflight", action="store_true", help="every CPU-side check of the first GPU lease; exit 1 if any fails")
    parser.add_argument("--triton-env", help="with --preflight: a python whose triton compiles every kernel for sm_90")
    parser.add_argument("--out", default=str(REPO_ROOT / "bench" / "out" / "gpu_check"),
                        help="directory for the JSON and markdown ($OUT wins when set)")
    parser.add_argument("--only", help="comma list of groups: kernels, gdn, sync, mfu, profile (default: all)")
    parser.add_argument("--steps", type=int, default=3, help="timed ordinary updates per MFU row (then one logging update)")
    parser.add_argument("--budget", type=float, default=450.0,
                        help="seconds; a row is skipped when less than its expected minutes are left")
    parser.add_argument("--write", action="store_true", help="replace the GPU check section of docs/benchmarks.md")
    args = parser.parse_args(argv)
    out = Path(os.environ.get("OUT") or args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.preflight:
        return preflight(out, args.triton_env)
    selected = select(args.only)
    if args.dry_run:
        report = Report(device="none (dry run)", dry_run=True, started=_now(), budget_s=args.budget)
        report.notes.append("not measured on a GPU: this is the dry run's plan of what the GPU run measures")
        run_rows(selected, report, out, args.budget, None)
    else:
        if not torch.cuda.is_available():
            print("bench/gpu_check.py needs a CUDA GPU (use --dry-run or --preflight on CPU).")
            return 2
        name = torch.cuda.get_device_name()
        peak_key = next((key for key in PEAK_FLOPS if key in name), None)
        import triton

        report = Report(device=f"{name}, torch {torch.__version__}, triton {triton.__version__}", dry_run=False,
                        started=_now(), budget_s=args.budget)
        ctx = Context(peak=PEAK_FLOPS[peak_key]["bf16"] if peak_key else float("nan"), steps=args.steps)
        if peak_key is None:
            report.notes.append(f"no bf16 peak known for {name}: MFU not computed")
        else:
            report.notes.append(f"MFU divides by the stated bf16 dense peak of the {peak_key}, {ctx.peak / 1e12:.0f} TFLOP/s "
                                "(hymo_core.train.monitor.PEAK_FLOPS); the matmul row shows what the device reaches")
        print(f"gpu_check: {report.device}; {len(selected)} rows, budget {args.budget:.0f} s; writing {out}", flush=True)
        run_rows(selected, report, out, args.budget, ctx)
    save(report, out)
    table = markdown(report)
    print(table, flush=True)
    if args.write:
        write_section("GPU check (bench/gpu_check.py)", *reversed(doc_section(report, table)))
    bad = [r["row"] for r in report.rows if r["status"] in ("error", "failed")]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
