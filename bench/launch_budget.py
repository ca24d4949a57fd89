"""The training step's launch budget and CPU host time, this tree against a base commit, in one run.

    python bench/launch_budget.py                      # "before" = HEAD, "after" = this working tree
    python bench/launch_budget.py --base d120bf3       # "before" = that commit
    python bench/launch_budget.py --base d120bf3 --write   # also replace its section of docs/benchmarks.md

For each tree (the base is unpacked with `git archive` into a temporary directory, nothing in the repository
changes) a fresh interpreter, with that tree first on the path, measures:

- launches per phase of one training step at the preset shapes on the meta device (forward, backward, the
  global-norm clip, the preset's optimizer), counted by this tree's hymo_core/train/launch_budget.py (loaded
  by path, so both trees are counted by the same code; the presets' shapes are passed in, so a preset the base
  lacks is still counted);
- host time per step on the CPU at tiny widths (the sample dense model and hymo-tiny, 2 x 32 tokens, fp32,
  NorMuon + CautiousAdamW): forward, backward, clip, optimizer, median of `--steps` after 3 warm-up steps,
  unwrapped and wrapped in FSDP2 (gloo, one rank: `apply_fsdp`, the trainer's wrapping under torchrun).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
HEADING = "## Training step launch budget (bench/launch_budget.py)"
HOST_MODELS = ("sample-dense", "hymo-tiny")
HOST_BATCH, HOST_SEQ = 2, 32  # small enough that host work, not arithmetic, is most of a step


def _by_path(name: str, relative: str):
    """One of this tree's modules, loaded by path (the child's hymo_core may be the base's): both trees are
    counted by the same counting code."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO_ROOT / relative)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[name]


def _budget_module():
    return _by_path("launch_budget_counter", "hymo_core/train/launch_budget.py")


def _host_step_ms(config, wrapped: bool, steps: int) -> tuple[float, float, int]:
    """Median ms of a whole step and of its optimizer step, and the launches of one (warm) step: the count
    does not depend on the machine's load, the times do."""
    from hymo_core.train.launch_count import LaunchCounter

    import torch

    from hymo_core.distributed.process_group import Runtime, clip_grad_norm_
    from hymo_core.models.model import Transformer
    from hymo_core.train.config import TrainConfig
    from hymo_core.train.optim import build_optimizer
    from hymo_core.train.optim_config import NorMuonConfig

    torch.manual_seed(0)
    model = Transformer(config)
    if wrapped:
        from hymo_core.distributed.parallelize import apply_fsdp

        apply_fsdp(model, Runtime(device=torch.device("cpu"), launched=True), TrainConfig())
    optimizer = build_optimizer(model, NorMuonConfig(lr=1e-4, muon_lr=1e-4))  # the presets' optimizer, Newton-Schulz fp32
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, config.vocab_size, (HOST_BATCH, HOST_SEQ + 1), generator=generator)
    times, optimizer_times = [], []
    counter = LaunchCounter(sdpa_as_flash=False)
    for step in range(3 + steps):
        if step == 2:
            counter.__enter__()
        started = time.perf_counter()
        _, loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        clip_grad_norm_(model.parameters(), 1.0)
        stepping = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step == 2:
            counter.__exit__(None, None, None)
        if step >= 3:
            times.append((time.perf_counter() - started) * 1e3)
            optimizer_times.append((time.perf_counter() - stepping) * 1e3)
    return statistics.median(times), statistics.median(optimizer_times), counter.launches()


def child(configs: dict[str, dict], steps: int) -> dict:
    """Runs in the measured tree's interpreter: launch counts and host times, as JSON."""
    import torch
    import torch.distributed as dist

    from hymo_core.models.configs import SAMPLE_MODEL, ModelConfig

    budget = _budget_module()
    counts = {}
    for name, values in configs.items():
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
        counted = budget.count_step(name, ModelConfig(**values), *budget.BUDGET_SHAPES[name], budget.MODEL_PHASES[name])
        counts[name] = counted.launches
    torch.set_num_threads(1)
    trainer_step = _by_path("trainer_step_counter", "bench/trainer_step.py")
    logging = {name: trainer_step.logging_step_launches(config, "hymo-tiny")  # the presets' [train] defaults
               for name, config in (("sample-dense", SAMPLE_MODEL),
                                    ("hymo-tiny", ModelConfig(**{k: tuple(v) if isinstance(v, list) else v
                                                                  for k, v in configs["hymo-tiny"].items()})))}
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    models = {"sample-dense": SAMPLE_MODEL,
              "hymo-tiny": ModelConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in configs["hymo-tiny"].items()})}
    host = {name: {layout: _host_step_ms(models[name], layout == "fsdp2", steps) for layout in ("unwrapped", "fsdp2")}
            for name in HOST_MODELS}
    dist.destroy_process_group()
    return {"launches": counts, "host_ms": host, "logging": logging}


def measure(tree: Path, configs: dict, steps: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(configs), "--steps", str(steps)],
                         cwd=tree, env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode:
        raise SystemExit(f"bench/launch_budget.py: measuring {tree} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def unpack(commit: str, into: Path) -> Path:
    archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=REPO_ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def short(commit: str) -> str:
    return subprocess.run(["git", "rev-parse", "--short", commit], cwd=REPO_ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def report(before: dict, after: dict, base: str, steps: int, load: float) -> list[str]:
    from bench.report import markdown_table, run_stamp

    budget = _budget_module()
    rows = []
    for name, phases in after["launches"].items():
        for phase in phases:
            rows.append((name, phase, f"{before['launches'][name][phase]:,}", f"{after['launches'][name][phase]:,}",
                         f"{budget.LAUNCH_BUDGET[name][phase]:,}"))
        rows.append((name, "**step**", f"{sum(before['launches'][name].values()):,}", f"{sum(phases.values()):,}",
                     f"{sum(budget.LAUNCH_BUDGET[name].values()):,}"))
    host = [(name, layout, *(f"{tree['host_ms'][name][layout][part]:,.1f}" if part < 2 else f"{tree['host_ms'][name][layout][part]:,}"
                             for tree in (before, after) for part in (0, 1, 2)))
            for name in HOST_MODELS for layout in ("unwrapped", "fsdp2")]
    host += [(name, "fsdp2 / unwrapped", *(f"{tree['host_ms'][name]['fsdp2'][part] / tree['host_ms'][name]['unwrapped'][part]:.2f}x"
                                           for tree in (before, after) for part in (0, 1, 2))) for name in HOST_MODELS]
    logging = [(name, f"{before['logging'][name]['ordinary']:,}", f"{before['logging'][name]['logging_extra']:,}",
                f"{before['logging'][name]['amortised_per_update']:.1f}", f"{after['logging'][name]['ordinary']:,}",
                f"{after['logging'][name]['logging_extra']:,}", f"{after['logging'][name]['amortised_per_update']:.1f}",
                f"{budget.LOGGING_BUDGET[name]:,}") for name in HOST_MODELS]
    shapes = ", ".join(f"{name} {b} x {t}" for name, (b, t) in budget.BUDGET_SHAPES.items())
    return [HEADING, "",
            f"{run_stamp()} 1-minute load {load:.2f} at the start" + (" (not quiet: host times are indicative)" if load >= 1.5 else "")
            + f". Before = commit {base}, after = this tree; both measured in this one run.", "",
            f"Kernel launches of one training step on the meta device ({shapes}; NorMuon + CautiousAdamW, Newton-Schulz "
            "in bf16; no autocast on meta). The budget is hymo_core/train/launch_budget.py's LAUNCH_BUDGET, held by "
            "tests/hymo_core/train/test_launch_budget.py. The hybrids' forward is not countable on meta (MoE reads its "
            "routing counts on the host).", "",
            markdown_table(["preset", "phase", f"before ({base})", "after", "budget"], rows), "",
            f"Host time of one step on the CPU, ms (median of {steps}; {HOST_BATCH} x {HOST_SEQ} tokens, fp32, one thread, "
            "forward + backward + clip + NorMuon step; fsdp2 = the trainer's FSDP2 wrapping on one gloo rank), and the "
            "launches of one warm step (CPU ops, attention by the math backend):", "",
            markdown_table(["model", "layout", f"step ms, before ({base})", "optimizer ms, before", "launches, before",
                            "step ms, after", "optimizer ms, after", "launches, after"], host),
            "", "What a logging update (every log_interval = 10: the weights' snapshot, the fp64 update ratios, the record) "
            "launches beyond an ordinary one, counted through the trainer's own loop on the CPU (2 x 32 tokens, "
            "2 micro-batches, fp32; bench/trainer_step.py), and that extra amortised per update:", "",
            markdown_table(["model", f"ordinary update, before ({base})", "logging extra, before", "amortised, before",
                            "ordinary update, after", "logging extra, after", "amortised, after", "budget (extra)"], logging)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="HEAD", help="the commit measured as 'before' (default HEAD; the after is the working tree)")
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--write", action="store_true", help="replace this section of docs/benchmarks.md")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child), args.steps)))
        return 0
    sys.path.insert(0, str(REPO_ROOT))
    from hymo_core.models.presets import PRESETS

    load = os.getloadavg()[0]
    configs = {name: asdict(PRESETS[name]) for name in _budget_module().LAUNCH_BUDGET}
    base = short(args.base)
    with tempfile.TemporaryDirectory(prefix="launch_budget_") as tmp:
        before = measure(unpack(base, Path(tmp)), configs, args.steps)
    after = measure(REPO_ROOT, configs, args.steps)
    lines = report(before, after, base, args.steps, load)
    print(json.dumps({"before": before, "after": after}))
    from bench.report import publish

    return publish(lines, HEADING, str(REPO_ROOT / "docs/benchmarks.md") if args.write else None)


if __name__ == "__main__":
    raise SystemExit(main())
