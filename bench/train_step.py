"""CPU throughput of one full training step: hymo_core vs a plain nanoGPT-style model.

Both models have Lab 2's shape (V4096, d256, L6, H8, ff688, tied; seed 001)
and train on the same random (B16, T256) batches. A step is forward, loss,
backward and optimizer step. Rows:

  * reference  - the plain-PyTorch decoder below (fused qkv projection,
                 interleaved RoPE, F.rms_norm, eager SwiGLU), torch AdamW;
  * hymo_core  - hymo_core.models.model.Transformer with the same torch AdamW, so
                 the ratio compares models, not optimizers;
  * hymo_core + MuonAdamW - the real recipe (Newton-Schulz in bf16 / fp32);

each eager and under torch.compile (model only). Then the optimizer step
alone: MuonAdamW vs NorMuon + CautiousAdamW vs torch AdamW on the same
parameters, and Newton-Schulz alone: MuonAdamW's per-parameter loop vs the
batched-by-shape bmm chain NorMuon uses.

    python bench/train_step.py                   # prints and updates docs/benchmarks.md
    python bench/train_step.py --no-compile      # eager rows only
    python bench/train_step.py --optimizer-only  # only the optimizer / Newton-Schulz tables (own section)

Numbers are wall-clock medians on whatever machine runs this; a compile
failure is recorded in the table rather than hidden.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from hymo_core.models.model import ModelConfig, Transformer  # noqa: E402
from hymo_core.train.optim import MuonAdamW, NorMuonAdamW, newton_schulz, newton_schulz_batched
from hymo_core.train.optim_config import NorMuonConfig, OptimizerConfig
from bench.report import replace_section  # noqa: E402

HEADING = "## hymo_core I: training step (bench/train_step.py)"
OPTIMIZER_HEADING = "## hymo_core IV: optimizer step, NorMuon vs MuonAdamW (bench/train_step.py --optimizer-only)"
BATCH, SEQ_LEN = 16, 256
LR = 1e-3


# ---------------------------------------------------------------- reference model


class ReferenceNorm(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, eps=1e-5)


class ReferenceAttention(nn.Module):
    def __init__(self, d: int, heads: int, context: int):
        super().__init__()
        self.heads, self.head_dim = heads, d // heads
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        inv_freq = 10000.0 ** (-torch.arange(0, self.head_dim, 2) / self.head_dim)
        angles = torch.outer(torch.arange(context).float(), inv_freq)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def rotate(self, x):  # interleaved pairs (x0, x1), (x2, x3), ...
        even, odd = x.reshape(*x.shape[:-1], self.head_dim // 2, 2).unbind(-1)
        cos, sin = self.cos[: x.shape[-2]], self.sin[: x.shape[-2]]
        return torch.stack((even * cos - odd * sin, even * sin + odd * cos), -1).flatten(-2)

    def forward(self, x):
        B, T, d = x.shape
        q, k, v = (t.view(B, T, self.heads, self.head_dim).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        y = F.scaled_dot_product_attention(self.rotate(q), self.rotate(k), v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, d))


class ReferenceBlock(nn.Module):
    def __init__(self, d: int, heads: int, ff: int, context: int):
        super().__init__()
        self.norm1, self.norm2 = ReferenceNorm(d), ReferenceNorm(d)
        self.attn = ReferenceAttention(d, heads, context)
        self.gate = nn.Linear(d, ff, bias=False)
        self.up = nn.Linear(d, ff, bias=False)
        self.down = nn.Linear(ff, d, bias=False)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class ReferenceGPT(nn.Module):
    def __init__(self, vocab=4096, d=256, layers=6, heads=8, ff=688, context=256):
        super().__init__()
        self.embedding = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(ReferenceBlock(d, heads, ff, context) for _ in range(layers))
        self.norm = ReferenceNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.embedding.weight
        for p in self.parameters():
            if p.ndim >= 2:
                nn.init.normal_(p, std=0.02)
        for block in self.blocks:
            nn.init.normal_(block.attn.proj.weight, std=0.02 / math.sqrt(2 * layers))
            nn.init.normal_(block.down.weight, std=0.02 / math.sqrt(2 * layers))

    def forward(self, tokens, targets):
        x = self.embedding(tokens)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        return logits, F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


# ---------------------------------------------------------------- timing


def adamw(model: nn.Module) -> torch.optim.Optimizer:
    matrices = [p for p in model.parameters() if p.ndim >= 2]
    vectors = [p for p in model.parameters() if p.ndim < 2]
    return torch.optim.AdamW([{"params": matrices, "weight_decay": 0.1}, {"params": vectors, "weight_decay": 0.0}],
                             lr=LR, betas=(0.9, 0.95), eps=1e-8)


def batches(n: int, vocab: int = 4096):
    generator = torch.Generator().manual_seed(0)
    for _ in range(n):
        window = torch.randint(0, vocab, (BATCH, SEQ_LEN + 1), generator=generator)
        yield window[:, :-1], window[:, 1:]


def train_step(model, optimizer, x, y) -> float:
    _, loss = model(x, y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def run_mode(mode: str, cases, warmup: int, steps: int) -> list[tuple]:
    """Time every case in `mode`, interleaved step by step.

    Interleaving (reference step, our step, ..., then the next batch) exposes
    every row to the same background load, which on a shared machine matters
    more than the number of steps.
    """
    runs, rows = [], []
    for name, build in cases:
        model, optimizer = build()
        note = ""
        try:
            if mode == "compile":
                model = torch.compile(model)
                start = time.perf_counter()
                x, y = next(batches(1))
                model(x, y)[1].backward()  # compile forward and backward outside the timing
                model.zero_grad(set_to_none=True)
                note = f"compile {time.perf_counter() - start:.0f} s"
            runs.append({"name": name, "model": model, "optimizer": optimizer, "times": [], "note": note,
                         "loss": None})
        except Exception as error:  # noqa: BLE001 - recorded in the table, not hidden
            rows.append((name, mode, None, None, failure(error)))
    for index, (x, y) in enumerate(batches(warmup + steps)):
        for run in runs:
            if run["note"].startswith("failed"):
                continue
            start = time.perf_counter()
            try:
                run["loss"] = train_step(run["model"], run["optimizer"], x, y)
            except Exception as error:  # noqa: BLE001
                run["note"] = failure(error)
                continue
            if index >= warmup:
                run["times"].append(time.perf_counter() - start)
    for run in runs:
        seconds = statistics.median(run["times"]) if run["times"] and not run["note"].startswith("failed") else None
        rows.append((run["name"], mode, seconds, run["loss"], run["note"]))
        shown = f"{BATCH * SEQ_LEN / seconds:,.0f} tok/s" if seconds else run["note"]
        print(f"{run['name']:38s} {mode:8s} {shown}", flush=True)
    return rows


def failure(error: Exception) -> str:
    first_line = (str(error).strip().splitlines() or [""])[0]
    return f"failed: {type(error).__name__}: {first_line[:160]}".replace("|", "/")


def time_optimizer(optimizer, model, repeats: int) -> float:
    """Median milliseconds of optimizer.step() with fixed random gradients."""
    generator = torch.Generator().manual_seed(1)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=generator) * 1e-3
    optimizer.step()  # state allocation is not part of a steady-state step
    durations = []
    for _ in range(repeats):
        start = time.perf_counter()
        optimizer.step()
        durations.append(time.perf_counter() - start)
    return 1000 * statistics.median(durations)


def time_newton_schulz(model: nn.Module, repeats: int) -> list[tuple[str, float]]:
    """Median ms of Newton-Schulz (fp32, 5 steps) over every hidden matrix: one call per matrix vs one stack per shape."""
    generator = torch.Generator().manual_seed(2)
    matrices = [torch.randn(p.shape, generator=generator) for name, p in model.named_parameters()
                if p.ndim == 2 and "tok_embeddings" not in name and "output" not in name]
    by_shape: dict[tuple[int, ...], list[torch.Tensor]] = {}
    for m in matrices:
        by_shape.setdefault(tuple(m.shape), []).append(m)

    def loop():
        return [newton_schulz(m, dtype=torch.float32) for m in matrices]

    def batched():
        return [newton_schulz_batched(torch.stack(same), dtype=torch.float32) for same in by_shape.values()]

    durations = {"loop": [], "batched": []}
    for _ in range(repeats + 1):  # interleaved, the first round is warm-up
        for name, run in (("loop", loop), ("batched", batched)):
            start = time.perf_counter()
            run()
            durations[name].append(time.perf_counter() - start)
    shapes = ", ".join(f"{len(v)}x{k[0]}x{k[1]}" for k, v in by_shape.items())
    return [(f"Newton-Schulz fp32, per-parameter loop ({len(matrices)} calls)", 1000 * statistics.median(durations["loop"][1:])),
            (f"Newton-Schulz fp32, batched by shape ({shapes})", 1000 * statistics.median(durations["batched"][1:]))]


def optimizer_rows(steps: int, with_bf16: bool = True) -> list[tuple[str, float]]:
    """`with_bf16`: also the bf16 Newton-Schulz row (emulated on CPU, by far the slowest)."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(), kernel_backend="reference")
    rows = [("torch.optim.AdamW, all parameters", time_optimizer(adamw(model), model, steps))]
    if with_bf16:
        rows.append(("MuonAdamW, NS bf16", time_optimizer(MuonAdamW(model.named_parameters(), OptimizerConfig(lr=LR)),
                                                          model, steps)))
    rows += [
        ("MuonAdamW, NS fp32 (per-parameter loop)", time_optimizer(
            MuonAdamW(model.named_parameters(), OptimizerConfig(lr=LR, ns_dtype="float32")), model, steps)),
        ("NorMuon + CautiousAdamW, NS fp32 batched, row norm", time_optimizer(
            NorMuonAdamW(model.named_parameters(), NorMuonConfig(lr=LR, muon_lr=LR)), model, steps)),
        ("NorMuon + CautiousAdamW, NS fp32 batched, no row norm", time_optimizer(
            NorMuonAdamW(model.named_parameters(), NorMuonConfig(lr=LR, muon_lr=LR, row_normalisation=False)), model, steps)),
    ]
    rows += time_newton_schulz(model, steps)
    for name, ms in rows:
        print(f"optimizer step: {name:60s} {ms:8.1f} ms", flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="timed eager steps per row")
    parser.add_argument("--compile-steps", type=int, default=2, help="timed compiled steps per row")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--optimizer-only", action="store_true", help="only the optimizer and Newton-Schulz tables")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "docs" / "benchmarks.md")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.optimizer_only:
        section = render_optimizer(optimizer_rows(args.steps, with_bf16=False), args)
        print()
        print(section)
        replace_section(args.output, OPTIMIZER_HEADING, section)
        print(f"wrote {args.output}")
        return 0

    def build_reference():
        torch.manual_seed(0)
        model = ReferenceGPT()
        return model, adamw(model)

    def build_hymo(optimizer_kind: str):
        def build():
            torch.manual_seed(0)
            model = Transformer(ModelConfig(), kernel_backend="reference")
            if optimizer_kind == "adamw":
                return model, adamw(model)
            config = OptimizerConfig(lr=LR, ns_dtype=optimizer_kind)
            return model, MuonAdamW(model.named_parameters(), config)
        return build

    cases = [
        ("reference (nanoGPT-style) + AdamW", build_reference),
        ("hymo_core + AdamW", build_hymo("adamw")),
        ("hymo_core + MuonAdamW (NS fp32)", build_hymo("float32")),
    ]
    rows = run_mode("eager", cases, args.warmup, args.steps)
    if not args.no_compile:
        rows += run_mode("compile", cases, args.warmup, args.compile_steps)

    section = render(rows, optimizer_rows(args.steps), args)
    print()
    print(section)
    replace_section(args.output, HEADING, section)
    return 0


def machine_line() -> str:
    return (f"Date: {datetime.date.today().isoformat()}. Machine: {os.cpu_count()}-core CPU ({platform.machine()}), "
            f"{torch.get_num_threads()} torch threads, torch {torch.__version__}, Python {platform.python_version()}; "
            f"load average {os.getloadavg()[0]:.1f} when the run ended (shared machine: compare rows, "
            "not absolute numbers).")


def optimizer_table(optimizer_rows, steps: int) -> list[str]:
    loop = next(ms for name, ms in optimizer_rows if "per-parameter loop (" in name)
    lines = [f"Optimizer step alone (same Lab 2 parameters, fixed random gradients, median of {steps}); "
             "Newton-Schulz alone on the same hidden matrices (fp32, 5 quintic steps):", "",
             "| optimizer | ms/step | vs NS loop |", "|---|---:|---:|"]
    lines += [f"| {name} | {ms:,.1f} | {f'{loop / ms:.2f}x' if name.startswith('Newton') else ''} |" for name, ms in optimizer_rows]
    return lines


def render_optimizer(optimizer_rows, args) -> str:
    lines = [OPTIMIZER_HEADING, "", machine_line(), "Lab 2 shape (V4096, d256, L6, H8, ff688, tied).", ""]
    lines += optimizer_table(optimizer_rows, args.steps)
    lines += ["", "The two Newton-Schulz rows alternate round by round, so both see the same background load; "
              "the optimizer rows run one after another, and on a loaded machine only their order of magnitude "
              "compares. The same matrices, the same arithmetic per matrix: the batched chain's gain is bmm "
              "over a stack (one call, threads across matrices) against 42 separate mm/addmm chains.", ""]
    return "\n".join(lines)


def render(rows, optimizer_rows, args) -> str:
    reference = {mode: seconds for name, mode, seconds, _, _ in rows if name.startswith("reference")}
    lines = [
        HEADING,
        "",
        machine_line(),
        f"Lab 2 shape (V4096, d256, L6, H8, ff688, tied), B{BATCH} x T{SEQ_LEN} = {BATCH * SEQ_LEN} tokens/step; "
        f"full step = forward + loss + backward + optimizer; median of {args.steps} eager / "
        f"{args.compile_steps} compiled steps after {args.warmup} warm-up steps. Ratio = tokens/s over the "
        "reference in the same mode.",
        "",
        "| model + optimizer | mode | ms/step | tokens/s | vs reference | final loss | note |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for name, mode, seconds, loss, note in rows:
        if seconds is None:
            lines.append(f"| {name} | {mode} | - | - | - | - | {note} |")
            continue
        base = reference.get(mode)
        ratio = f"{base / seconds:.2f}x" if base else "-"
        lines.append(f"| {name} | {mode} | {1000 * seconds:,.0f} | {BATCH * SEQ_LEN / seconds:,.0f} | {ratio} "
                     f"| {loss:.3f} | {note} |")
    lines += [""] + optimizer_table(optimizer_rows, args.steps)
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
