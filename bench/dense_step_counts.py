"""The dense step's kernel launches, bytes, copies around the custom ops, loss memory and compile, counted on CPU.

No GPU needed. Four measurements, one table each (issue 53, parts 2, 4, 5, 6):

* dense-125m (bench/gpu_check.py's DENSE_125M) at 8 x 2048 on the meta device, forward and backward
  under `LaunchCounter` (hymo_core/train/launch_count.py): launches and bytes per phase, the
  `slice_backward` zero-fills and `cat`s, strided inputs handed to `hymo::*` ops, and the most
  storage alive at once (`PeakBytes`) over the step and over the loss alone (final norm, head, loss,
  and its backward into the hidden state);
* RoPE's programs at the preset shapes (hymo_core/kernels/aot.py's launches; waves on 132 SMs);
* host time per call on the CPU of each `hymo::*` op against the plain PyTorch it replaces, at a
  tiny width (2 x 64 rows of 64): the dispatcher's fixed cost, which the GPU pays too;
* `torch.compile(model, fullgraph=True)` of a 2-layer dense model on the CPU (Inductor's C++), with the
  row ops traced as plain torch (`auto`) and kept as custom ops (`reference`): graph breaks, whether the
  loss has a gradient, and the launches in Inductor's generated code (its kernels, the hymo:: ops, the rest).

    python bench/dense_step_counts.py [--skip-compile]

Counts do not depend on the machine's load; the host times do (the table says the load).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench.gpu_check import DENSE_125M  # noqa: E402
from bench.report import markdown_table  # noqa: E402
from hymo_core import kernels  # noqa: E402
from hymo_core.models.configs import ModelConfig  # noqa: E402
from hymo_core.models.init import build_on_meta  # noqa: E402
from hymo_core.models.model import Transformer  # noqa: E402
from hymo_core.train.launch_count import LaunchCounter, PeakBytes  # noqa: E402

BATCH, SEQ = 8, 2048
GB = 1e9


def _loss_only(model, hidden_BTD, targets_BT):
    """The loss from the final hidden state, as the model's forward computes it (new API if present)."""
    if hasattr(model, "training_loss"):
        return model.training_loss(hidden_BTD, targets_BT)
    logits = model.head(model.norm(hidden_BTD))
    return kernels.cross_entropy_loss(logits.reshape(-1, logits.shape[-1]), targets_BT.reshape(-1),
                                      z_loss=model.config.z_loss)[0]


def meta_step() -> dict:
    model = build_on_meta(DENSE_125M, seed=0)
    tokens = torch.zeros(BATCH, SEQ, dtype=torch.long, device="meta")
    counter = LaunchCounter()
    with PeakBytes() as step_peak:
        with counter, counter.phase("forward"):
            _, loss = model(tokens, tokens)
        with counter, counter.phase("backward"):
            loss.backward()
        del loss
    hidden = torch.zeros(BATCH, SEQ, DENSE_125M.d_model, device="meta", requires_grad=True)
    with PeakBytes() as loss_peak:
        _loss_only(model, hidden, tokens).backward()
    fwd, bwd = counter.phases["forward"], counter.phases["backward"]
    every = fwd.launches + bwd.launches
    by_op = fwd.bytes_by_op + bwd.bytes_by_op
    return {"forward": fwd.total, "backward": bwd.total, "forward_gb": (fwd.bytes_read + fwd.bytes_written) / GB,
            "backward_gb": (bwd.bytes_read + bwd.bytes_written) / GB,
            "slice_backward": every["aten.slice_backward"], "slice_backward_gb": by_op["aten.slice_backward"] / GB,
            "cat": every["aten.cat"], "cat_gb": by_op["aten.cat"] / GB,
            "strided_inputs": sum(counter.noncontiguous_inputs().values()),
            "step_peak_gb": step_peak.peak / GB, "loss_peak_gb": loss_peak.peak / GB,
            "full_logits_gb": BATCH * SEQ * DENSE_125M.vocab_size * 4 / GB,
            "top": counter.top(12)}


def rope_waves() -> list[dict]:
    from hymo_core.kernels import aot
    from hymo_core.models.kernel_shapes import preset_kernel_shapes

    rows = []
    for model in preset_kernel_shapes():
        for launch in aot.row_kernel_launches(model, 90):
            if launch.kernel.endswith("_rope_kernel"):
                u = aot.usage(launch, aot.TARGETS["sm_90"])
                rows.append({"preset": model.preset, "programs": launch.programs, "per_sm": u.programs_per_sm,
                             "waves": u.waves, "registers": u.registers, "spill": u.spill})
    return rows


def _per_call_us(fn, calls: int = 300) -> float:
    for _ in range(20):
        fn()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def host_times() -> list[dict]:
    torch.manual_seed(0)
    x = torch.randn(2, 64, 64, requires_grad=True)
    gate_up = torch.randn(2, 64, 128, requires_grad=True)
    w = torch.ones(64, requires_grad=True)
    cos, sin = kernels.rope_tables(64, 16, 10000.0)
    q = torch.randn(2, 64, 4, 16)
    logits, targets = torch.randn(128, 64), torch.randint(0, 64, (128,))
    gate, up = gate_up.detach().chunk(2, dim=-1)
    swiglu_args = (gate_up.detach(),) if _swiglu_takes_fused() else (gate.contiguous(), up.contiguous())
    rows = [
        ("swiglu", lambda: kernels.swiglu(*swiglu_args), lambda: F.silu(gate) * up),
        ("rms_norm", lambda: kernels.rms_norm(x.detach(), w.detach()),
         lambda: F.rms_norm(x.detach(), (64,), w.detach(), 1e-5)),
        ("rope", lambda: kernels.apply_rope(q, cos, sin),
         lambda: torch.cat((q[..., :8] * cos[:64, None] - q[..., 8:] * sin[:64, None],
                            q[..., 8:] * cos[:64, None] + q[..., :8] * sin[:64, None]), -1)),
        ("cross_entropy", lambda: kernels.cross_entropy_rows(logits, targets),
         lambda: F.cross_entropy(logits, targets, reduction="none")),
    ]
    with torch.no_grad():
        return [{"op": name, "hymo_us": _per_call_us(op), "torch_us": _per_call_us(plain)} for name, op, plain in rows]


def _swiglu_takes_fused() -> bool:
    import inspect

    return "gate_up" in inspect.signature(kernels.swiglu).parameters


def whole_model_compile(kernel_backend: str | None = None) -> dict:
    """Compile a 2-layer dense model whole; count what the Inductor code launches, forward and backward:
    its generated kernels, the hymo:: custom ops it calls, and everything else it calls (mm, attention)."""
    import re

    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code

    config = ModelConfig(vocab_size=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=64)
    torch.manual_seed(0)
    model = Transformer(config, kernel_backend=kernel_backend)
    tokens = torch.randint(0, 256, (2, 32))
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, fullgraph=True)
    outcome = {}

    def step():
        _, loss = compiled(tokens, tokens)
        outcome["has_grad"] = loss.requires_grad
        if loss.requires_grad:
            loss.backward()

    start = time.perf_counter()
    _, codes = run_and_get_code(step)
    code = "\n".join(codes)
    generated = len(re.findall(r"^\s+cpp_fused_\w+\(", code, re.M))
    custom = len(re.findall(r"torch\.ops\.hymo\.\w+\.default\(", code))
    other = len(re.findall(r"(?:extern_kernels\.\w+|torch\.ops\.aten\.\w+\.default)\(", code))
    return {"graph_breaks": sum(counters["graph_break"].values()), "loss_has_grad": outcome["has_grad"],
            "generated": generated, "custom": custom, "other": other, "seconds": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-compile", action="store_true")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                            text=True).stdout.strip()
    print(f"commit {commit}, load {os.getloadavg()[0]:.2f}, torch {torch.__version__}\n")
    step = meta_step()
    print(f"dense-125m, {BATCH} x {SEQ}, meta device")
    print(markdown_table(["measure", "value"], [
        ["forward launches", step["forward"]], ["backward launches", step["backward"]],
        ["forward GB moved", f"{step['forward_gb']:.1f}"], ["backward GB moved", f"{step['backward_gb']:.1f}"],
        ["slice_backward launches (GB)", f"{step['slice_backward']} ({step['slice_backward_gb']:.1f})"],
        ["cat launches (GB)", f"{step['cat']} ({step['cat_gb']:.1f})"],
        ["strided inputs to hymo::* ops", step["strided_inputs"]],
        ["peak live GB, forward + backward", f"{step['step_peak_gb']:.2f}"],
        ["peak live GB, loss + its backward", f"{step['loss_peak_gb']:.2f}"],
        ["full fp32 logits GB", f"{step['full_logits_gb']:.2f}"]]))
    print("top ops:", ", ".join(f"{op} {n}" for op, n in step["top"]), "\n")
    print("RoPE on sm_90 (4 x 4096 tokens, 132 SMs)")
    print(markdown_table(["preset", "programs", "per SM", "waves", "registers", "spill"],
                         [[r["preset"], r["programs"], r["per_sm"], r["waves"], r["registers"], r["spill"]]
                          for r in rope_waves()]), "\n")
    print("host time per call, CPU, no grad (us)")
    print(markdown_table(["op", "hymo::", "plain torch"],
                         [[r["op"], f"{r['hymo_us']:.1f}", f"{r['torch_us']:.1f}"] for r in host_times()]), "\n")
    if not args.skip_compile:
        rows = []
        for label, backend in (("auto (row ops traced as plain torch)", None), ("reference (custom ops kept)", "reference")):
            r = whole_model_compile(backend)
            rows.append([label, r["graph_breaks"], r["loss_has_grad"], r["generated"], r["custom"], r["other"],
                         r["generated"] + r["custom"] + r["other"], f"{r['seconds']:.0f}"])
        print("torch.compile(model, fullgraph=True), 2 layers, CPU (Inductor C++): launches in the generated code, "
              "forward + backward")
        print(markdown_table(["kernel backend", "graph breaks", "loss has grad", "Inductor kernels", "hymo:: ops",
                              "mm / attention / other", "launches", "seconds"], rows))


if __name__ == "__main__":
    main()
