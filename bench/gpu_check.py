"""The one prepared GPU check (issue 23): kernels, GDN against fla, MFU under FSDP2. One command.

    python bench/gpu_check.py                  # on one H100/H200; about 6 minutes, at most --budget seconds
    python bench/gpu_check.py --dry-run        # on CPU: everything up to the first CUDA call (CI runs it)
    python bench/gpu_check.py --write          # also replace the "GPU check" section of docs/benchmarks.md

(a) every kernel's bf16 result and input gradients against its PyTorch reference evaluated in fp32
    (RMSNorm, SwiGLU, RoPE, cross-entropy + z-loss via bench/gpu_kernels.py's cases; the GDN chunked
    kernel; the attention-logit probe), each judged against the error of the eager bf16 reference;
(b) GDN forward + backward at hymo-750m's shapes (4 x 4096 tokens, 7 heads, K 128, V 256) against
    flash-linear-attention's `chunk_gated_delta_rule` when it is installed (goal: fla time / ours >= 0.8);
(c) MFU = tokens/s x the planner's training FLOPs per token / the device's bf16 dense peak, for a dense
    ~125 M decoder and hymo-750m, under FSDP2 (one rank, bf16 parameters, fp32 reductions), built on
    the meta device and materialised on the GPU, compile off and on (goals: >= 40 % dense, >= 30 % hybrid);
(d) one JSON file and one markdown table in --out.

Every check has a plan (shapes, FLOPs, what it compares) made on the CPU, and a run on the GPU; the dry
run makes and writes the plans, so a broken import, config or planner call fails in CI, not on the GPU.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench.report import markdown_table, write_section  # noqa: E402
from hymo_core.models.configs import ModelConfig  # noqa: E402
from hymo_core.models.presets import PRESETS  # noqa: E402
from hymo_core.planner.planner import count_parameters, model_shape, training_flops_per_token  # noqa: E402
from hymo_core.train.monitor import PEAK_FLOPS  # noqa: E402

# A GPT-2-small-sized dense decoder (~124 M parameters with the tied 50,304-token table).
DENSE_125M = ModelConfig(vocab_size=50_304, d_model=768, n_layers=12, n_heads=12, n_kv_heads=12, ffn_dim=2048,
                         max_seq_len=2048, tie_embeddings=True)
GDN_SHAPE = dict(B=4, T=4096, H=7, K=128, V=256)  # hymo-750m: 7 heads of 128, values 2x wide; 16k tokens a call
KERNEL_SLACK = 2.0  # a Triton kernel may be at most this much less accurate than the eager bf16 code it replaces
KERNEL_FLOOR = 1e-2  # ... or this max-relative error, whichever is larger
MFU_GOALS = {"dense": 0.40, "hybrid": 0.30}
GDN_GOAL = 0.8


@dataclass
class MFUCase:
    name: str
    kind: str  # dense | hybrid
    config: ModelConfig
    batch: int
    seq_len: int
    compile: bool
    flops_per_token: float = 0.0
    parameters: int = 0


@dataclass
class Report:
    device: str
    dry_run: bool
    started: str
    kernels: list[dict] = field(default_factory=list)
    gdn: dict = field(default_factory=dict)
    mfu: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def mfu_cases(steps_seq: int | None) -> list[MFUCase]:
    """The MFU runs; FLOPs per token from the planner (the trainer's MFU uses the same numbers)."""
    cases = []
    for name, kind, config, batch, seq in (("dense-125m", "dense", DENSE_125M, 8, 2048),
                                           ("hymo-750m", "hybrid", PRESETS["hymo-750m"], 2, 4096)):
        seq = steps_seq or seq
        for compiled in (False, True):
            shape = model_shape(config)
            cases.append(MFUCase(name, kind, config, batch, seq, compiled,
                                 float(training_flops_per_token(shape, seq)), count_parameters(shape).total))
    return cases


def gdn_plan() -> dict:
    s = GDN_SHAPE
    # Chunked GDN per token and head, forward: ~2 C (3 K + 2 V) + 6 K V multiply-adds (planner's term); x3 for fwd+bwd.
    chunk = 64
    flops = 3 * 2 * s["B"] * s["T"] * s["H"] * (2 * chunk * (3 * s["K"] + 2 * s["V"]) + 6 * s["K"] * s["V"])
    return {"shape": s, "tokens_per_call": s["B"] * s["T"], "approx_flops": flops}


def fla_available() -> str | None:
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule  # noqa: F401
    except Exception as error:  # noqa: BLE001 - absent or broken, both mean "not compared"
        return f"{type(error).__name__}: {error}"
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


def check_kernels() -> list[dict]:
    from bench.gpu_kernels import bf16_errors, cases

    rows = []
    for name, inputs, fn, reference in [*cases(small=True), *gdn_and_probe_cases()]:
        errors, _, _ = bf16_errors(inputs, fn, reference, catch=True)
        bound = max(KERNEL_SLACK * errors["reference"], KERNEL_FLOOR)
        rows.append({"kernel": name, "triton_err": errors["triton"], "eager_bf16_err": errors["reference"],
                     "bound": bound, "ok": bool(errors["triton"] <= bound),
                     **{k: v for k, v in errors.items() if k.endswith("_error")}})
    return rows


def gdn_and_probe_cases():
    """GDN (triton vs chunked reference) at a check-sized shape, and the logit probe (PyTorch on both sides)."""
    from hymo_core.kernels.gdn import gated_delta_rule
    from hymo_core.kernels.logit_probe import causal_max_logits

    gen = torch.Generator(device="cuda").manual_seed(0)
    B, T, H, K, V = 1, 1024, 2, 128, 256
    q = torch.nn.functional.normalize(torch.randn(B, T, H, K, device="cuda", generator=gen), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, device="cuda", generator=gen), dim=-1)
    v = torch.randn(B, T, H, V, device="cuda", generator=gen)
    g = -torch.rand(B, T, H, device="cuda", generator=gen) * 0.1
    beta = torch.rand(B, T, H, device="cuda", generator=gen)
    yield ("gdn_chunk", [q, k, v, g, beta],
           lambda q, k, v, g, b, backend: gated_delta_rule(q, k, v, g.float(), b.float(), backend=backend)[0],
           lambda q, k, v, g, b: gated_delta_rule(q, k, v, g, b, backend="reference")[0])
    qp = torch.randn(2, 4, 512, 64, device="cuda", generator=gen, requires_grad=False)
    kp = torch.randn(2, 4, 512, 64, device="cuda", generator=gen)

    class Probe(torch.autograd.Function):  # the probe has no gradient: zeros, so forward_backward applies
        @staticmethod
        def forward(ctx, q, k):
            ctx.shapes = (q.shape, k.shape)
            return causal_max_logits(q, k, 8.0)

        @staticmethod
        def backward(ctx, grad):
            return grad.new_zeros(ctx.shapes[0]), grad.new_zeros(ctx.shapes[1])

    yield ("logit_probe", [qp, kp], lambda q, k, backend: Probe.apply(q, k), lambda q, k: Probe.apply(q, k))


def gdn_against_fla(plan: dict) -> dict:
    from hymo_core.kernels.gdn import gated_delta_rule

    s = plan["shape"]
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape_k, shape_v, shape_h = (s["B"], s["T"], s["H"], s["K"]), (s["B"], s["T"], s["H"], s["V"]), (s["B"], s["T"], s["H"])
    q = torch.nn.functional.normalize(torch.randn(shape_k, device="cuda", generator=gen), dim=-1).bfloat16()
    k = torch.nn.functional.normalize(torch.randn(shape_k, device="cuda", generator=gen), dim=-1).bfloat16()
    v = torch.randn(shape_v, device="cuda", generator=gen).bfloat16()
    g = (-torch.rand(shape_h, device="cuda", generator=gen) * 0.1).float()
    beta = torch.rand(shape_h, device="cuda", generator=gen).float()
    do = torch.randn(shape_v, device="cuda", generator=gen).bfloat16()

    def step(op):
        leaves = [t.detach().requires_grad_() for t in (q, k, v, g, beta)]
        out = op(*leaves)
        out.backward(do)

    result = dict(plan)
    try:
        result["ours_ms"] = cuda_time(lambda: step(lambda *xs: gated_delta_rule(*xs, backend="triton")[0]))
    except Exception as error:  # noqa: BLE001
        result["ours_error"] = f"{type(error).__name__}: {error}"[:300]
    missing = fla_available()
    if missing:
        result["fla"] = f"not installed ({missing})"
    else:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        result["fla_ms"] = cuda_time(lambda: step(lambda q_, k_, v_, g_, b_: chunk_gated_delta_rule(
            q_, k_, v_, g_, b_.to(v_.dtype), scale=s["K"] ** -0.5)[0]))
        if "ours_ms" in result:
            result["fla_over_ours"] = result["fla_ms"] / result["ours_ms"]
            result["goal_met"] = result["fla_over_ours"] >= GDN_GOAL
    if "ours_ms" in result:
        result["ours_tflops"] = plan["approx_flops"] / result["ours_ms"] / 1e9
    return result


def measure_mfu(case: MFUCase, peak: float, steps: int) -> dict:
    """Synthetic-token training steps (forward, backward, clip, NorMuon step, MoE bookkeeping) under FSDP2."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from hymo_core.models.init import build_on_meta, materialise_
    from hymo_core.train.optim import build_optimizer
    from hymo_core.train.optim_config import NorMuonConfig

    row: dict[str, Any] = {"model": case.name, "kind": case.kind, "compile": case.compile, "batch": case.batch,
                           "seq_len": case.seq_len, "flops_per_token": case.flops_per_token, "parameters": case.parameters}
    if not dist.is_initialized():
        dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29533", rank=0, world_size=1)
    torch.cuda.reset_peak_memory_stats()
    model = None
    try:
        torch.manual_seed(0)
        model = build_on_meta(case.config)
        mesh = init_device_mesh("cuda", (1,))
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.blocks():
            if case.compile:
                block.compile()
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        materialise_(model, "cuda")
        model.train()
        optimizer = build_optimizer(model, NorMuonConfig(lr=1e-4, muon_lr=1e-4))
        gen = torch.Generator(device="cuda").manual_seed(0)
        tokens = torch.randint(0, case.config.vocab_size, (case.batch, case.seq_len + 1), device="cuda", generator=gen)
        x, y = tokens[:, :-1], tokens[:, 1:]

        def train_step():
            _, loss = model(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            model.after_optimizer_step(read=False)
            optimizer.zero_grad(set_to_none=True)

        started = time.perf_counter()
        train_step()  # the first step compiles (with compile on) and allocates optimizer state
        torch.cuda.synchronize()
        row["first_step_s"] = time.perf_counter() - started
        ms = cuda_time(train_step, warmup=1, repeats=steps)
        tokens_per_s = case.batch * case.seq_len / (ms / 1e3)
        row.update(step_ms=ms, tokens_per_s=tokens_per_s, mfu=tokens_per_s * case.flops_per_token / peak,
                   peak_memory_gib=torch.cuda.max_memory_allocated() / 2**30)
        row["goal_met"] = row["mfu"] >= MFU_GOALS[case.kind]
    except Exception as error:  # noqa: BLE001 - an OOM or a compile failure is the result of this row
        row["error"] = f"{type(error).__name__}: {error}"[:400]
    finally:
        model = None  # the row's model and optimizer state go before the next row builds its own
        torch.cuda.empty_cache()
    return row


# ---------------------------------------------------------------- output


def markdown(report: Report) -> str:
    lines = [f"Device: {report.device}; started {report.started}" + (" (dry run: plans only, not measured on a GPU)"
                                                                     if report.dry_run else "") + ".", ""]
    if report.kernels:
        lines += [markdown_table(["kernel", "triton max rel err", "eager bf16 err", "bound", "ok"],
                                 [(r["kernel"], f"{r['triton_err']:.2e}", f"{r['eager_bf16_err']:.2e}", f"{r['bound']:.2e}",
                                   "yes" if r["ok"] else "**no**") for r in report.kernels]), ""]
    gdn = report.gdn
    lines += [markdown_table(["GDN fwd+bwd (B, T, H, K, V)", "ours ms", "fla ms", "fla / ours (goal >= 0.8)"],
                             [(", ".join(str(gdn["shape"][k]) for k in "BTHKV"), _fmt(gdn.get("ours_ms")),
                               _fmt(gdn.get("fla_ms")) if "fla" not in gdn else gdn["fla"][:40],
                               _fmt(gdn.get("fla_over_ours")))]), ""]
    lines += [markdown_table(["model", "compile", "batch x T", "params", "FLOPs/token", "step ms", "tokens/s", "MFU", "goal",
                              "peak GiB"],
                             [(r["model"], "on" if r["compile"] else "off", f"{r['batch']} x {r['seq_len']}",
                               f"{r['parameters'] / 1e6:,.0f} M", f"{r['flops_per_token'] / 1e9:.2f} G",
                               _fmt(r.get("step_ms")), _fmt(r.get("tokens_per_s"), "{:,.0f}"),
                               _fmt(r.get("mfu"), "{:.1%}") if "error" not in r else r["error"][:60],
                               f"{MFU_GOALS[r['kind']]:.0%}", _fmt(r.get("peak_memory_gib"), "{:.1f}"))
                              for r in report.mfu])]
    if report.notes:
        lines += ["", *[f"- {note}" for note in report.notes]]
    return "\n".join(lines)


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO_ROOT,
                              timeout=10).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def _fmt(value: float | None, pattern: str = "{:.2f}") -> str:
    return "not measured" if value is None or (isinstance(value, float) and math.isnan(value)) else pattern.format(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="plans only, on CPU: stop before the first CUDA call")
    parser.add_argument("--out", default=str(REPO_ROOT / "bench" / "out" / "gpu_check"), help="directory for the JSON and markdown")
    parser.add_argument("--steps", type=int, default=5, help="timed training steps per MFU row")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds; rows that would start after it are skipped")
    parser.add_argument("--write", action="store_true", help="replace the GPU check section of docs/benchmarks.md")
    args = parser.parse_args(argv)
    started = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cases = mfu_cases(None)
    plan = gdn_plan()
    if args.dry_run:
        report = Report(device="none (dry run)", dry_run=True, started=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))
        report.gdn = {**plan, "fla": "available" if fla_available() is None else f"not installed ({fla_available()})"}
        from hymo_core.models.init import build_on_meta

        built: dict[str, int] = {}
        for case in cases:  # the models the run will build: on meta here, so a config error shows now
            if case.name not in built:
                built[case.name] = sum(p.numel() for p in build_on_meta(case.config).parameters())
            assert built[case.name] == case.parameters, case.name
            report.mfu.append({"model": case.name, "kind": case.kind, "compile": case.compile, "batch": case.batch,
                               "seq_len": case.seq_len, "flops_per_token": case.flops_per_token, "parameters": case.parameters})
        report.notes.append("not measured on a GPU: this is the dry run's plan of what the GPU run measures")
    else:
        if not torch.cuda.is_available():
            print("bench/gpu_check.py needs a CUDA GPU (use --dry-run on CPU).")
            return 2
        name = torch.cuda.get_device_name()
        peak_key = next((key for key in PEAK_FLOPS if key in name), None)
        report = Report(device=f"{name}, torch {torch.__version__}", dry_run=False,
                        started=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))
        report.kernels = check_kernels()
        report.gdn = gdn_against_fla(plan)
        peak = PEAK_FLOPS[peak_key]["bf16"] if peak_key else float("nan")
        if peak_key is None:
            report.notes.append(f"no bf16 peak known for {name}: MFU not computed")
        for case in cases:
            if time.time() - started > args.budget:
                report.mfu.append({**asdict(case), "config": case.name, "model": case.name, "error": "skipped: time budget"})
                continue
            report.mfu.append(measure_mfu(case, peak, args.steps))
        report.notes.append(f"wall time {time.time() - started:.0f} s")
    payload = asdict(report)
    for row in payload["mfu"]:
        row.pop("config", None)
    (out / "gpu_check.json").write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")
    table = markdown(report)
    (out / "gpu_check.md").write_text(table + "\n", encoding="utf-8")
    print(table)
    if args.write:
        where = (f"`--dry-run` on {platform.node() or 'this machine'} (CPU, load {os.getloadavg()[0]:.1f}): plans only, "
                 "**not measured on a GPU**" if args.dry_run else f"on {report.device}")
        write_section("GPU check (bench/gpu_check.py)", table,
                      f"One command on one GPU: kernels, GDN vs fla, MFU under FSDP2. This run: {where}; commit {commit()}.")
    failed = [r["kernel"] for r in report.kernels if not r["ok"]]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
