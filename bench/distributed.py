"""Training throughput on more than one process, through the trainer itself: tokens/s and CPU-seconds per
update of `hymo train` as one process on all cores (the baseline), one process on one thread, and
`--nproc N` ranks; and GPU MFU when a GPU exists.

CPU section: every row is `hymo train --corpus C --config R --max-steps W+S --threads T [--nproc N]`,
the command a user runs, so the rows include what the trainer does per update (data loading, the
host reads of a logged step, QK-Clip, the alert checks; under --nproc, FSDP2's gloo collectives and
the thread policy's per-rank count). The recipe is the sample's (or --config's) with a record every
update and no evaluation or checkpoint before the last step. Per row:
  tokens/s        over the S updates after W warm-up ones, from the run's own metrics.jsonl
                  (each record's window: tokens / seconds), so start-up and the final evaluation are out;
  CPU s / update  the CPU time (user + system, every rank and torchrun included: RUSAGE_CHILDREN) of the
                  W+S run minus that of a W-update run, over S: what one update costs the machine (start-up
                  varies by about a CPU-second between runs, so S of 30 keeps that under ~0.03 s per update).
The load average (1 min) is read before and after each row; the figures mean something only when the
machine is otherwise idle (load < 1.5 before the first row); `--write` refuses otherwise.

GPU section (only with CUDA): a dense ~125M model (d768, L12, H12, ff2048, V32768, T2048) on one GPU
under torchrun (FSDP2, bf16 parameters, fp32 reduce), compile off and on, through this script's own
update loop; MFU against the GPU's bf16 dense peak. Goals: >= 45 % dense, >= 35 % hybrid.

    nice -n 10 python bench/distributed.py --corpus runs/sample [--steps 30] [--warmup 3] [--passive] [--write]

`--passive`: each multi-thread or multi-rank row again with OMP_WAIT_POLICY=PASSIVE (OpenMP threads
sleep instead of spin-waiting at barriers), to measure whether that helps.
Writes the tables into docs/benchmarks.md ("Distributed training (bench/distributed.py)") with --write.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DENSE_125M = dict(vocab_size=32768, d_model=768, n_layers=12, n_heads=12, n_kv_heads=12, ffn_dim=2048, max_seq_len=2048)


def worker(args: argparse.Namespace) -> None:
    """One rank (or the plain process): time `steps` updates after 2 warm-up updates; rank 0 prints JSON."""
    import torch

    from hymo_core.models.configs import ModelConfig
    from hymo_core.train.config import TrainConfig
    from hymo_core.distributed.process_group import all_reduce_mean, close_runtime, init_runtime
    from hymo_core.models.model import Transformer
    from hymo_core.train.optim import build_optimizer
    from hymo_core.distributed.parallelize import parallelize
    from hymo_core.train.monitor import model_flops_per_token, reference_flops
    from hymo_core.train.trainer import QKClip, autocast

    shape = json.loads(args.shape)
    config = TrainConfig(batch_size=args.batch, seq_len=args.seq_len, gradient_accumulation_steps=args.accum, max_steps=10,
                         warmup_steps=1, precision=args.precision, compile=args.compile)
    runtime = init_runtime()
    device = runtime.device
    torch.manual_seed(0)
    model = parallelize(Transformer(ModelConfig(**shape)).to(device), runtime, config)
    optimizer = build_optimizer(model, config.optimizer_config(device))
    micro, accumulation = runtime.batch_plan(config)
    clip = QKClip(model, config.qk_clip_threshold, True)
    model.set_attention_probe(True)
    generator = torch.Generator().manual_seed(runtime.rank)
    tokens_BT = torch.randint(0, shape["vocab_size"], (micro, args.seq_len + 1), generator=generator).to(device)

    def update() -> None:
        clip.reset()
        for _ in range(accumulation):
            with autocast(device, config.precision):
                _, loss = model(tokens_BT[:, :-1], tokens_BT[:, 1:])
            clip.observe()
            (loss / accumulation).backward()
        all_reduce_mean(float(loss), device)
        clip.reduce()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        clip.apply()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(2):
        update()
    if device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(args.steps):
        update()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    tokens = args.steps * config.tokens_per_update
    if runtime.is_writer:
        flops = model_flops_per_token(model, args.seq_len)
        peak, label = reference_flops(device, args.precision)
        print("RESULT " + json.dumps({"tokens_per_s": tokens / seconds, "seconds_per_update": seconds / args.steps,
                                      "mfu": tokens / seconds * flops / peak, "peak": label,
                                      "threads": torch.get_num_threads(), "world_size": runtime.world_size}), flush=True)
    close_runtime(runtime)


def launch(nproc: int | None, shape: dict, batch: int, accum: int, seq_len: int, steps: int, precision: str = "fp32",
           compile_blocks: bool = False, threads: int | None = None) -> dict:
    """nproc None: one plain process; else torchrun with nproc ranks."""
    worker_args = ["--worker", "--shape", json.dumps(shape), "--batch", str(batch), "--accum", str(accum), "--seq-len", str(seq_len),
                   "--steps", str(steps), "--precision", precision] + (["--compile"] if compile_blocks else [])
    script = str(Path(__file__).resolve())
    if nproc is None:
        command = [sys.executable, script, *worker_args]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", script, *worker_args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(command[:6])}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


CLI = "import sys; from flows.cli import main; sys.exit(main())"  # `hymo`, from this checkout


def bench_recipe(base: Path | None, steps: int, directory: Path) -> Path:
    """The recipe with a metrics record every update and no evaluation or checkpoint before the last step (the LR
    warm-up shortened to one update: the schedule changes no update's cost, and a shorter run must stay valid)."""
    import tomllib

    raw = tomllib.loads(base.read_text(encoding="utf-8")) if base else {}
    train = {**raw.get("train", {}), "log_interval": 1, "eval_interval": steps, "checkpoint_interval": steps, "max_steps": steps,
             "warmup_steps": 1}
    lines = ["[train]"] + [f"{key} = {json.dumps(value)}" for key, value in train.items()]
    for table in ("model", "parallel"):
        if raw.get(table):
            lines += [f"[{table}]"] + [f"{key} = {json.dumps(value)}" for key, value in raw[table].items()]
    path = directory / "recipe.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def train_once(corpus: str, recipe: Path, out: Path, steps: int, threads: int, nproc: int | None, env: dict[str, str]) -> float:
    """One `hymo train` of `steps` updates; the CPU seconds it (and every process it started) used."""
    import resource

    command = [sys.executable, "-c", CLI, "train", "--corpus", corpus, "--config", str(recipe), "--out", str(out),
               "--max-steps", str(steps), "--threads", str(threads)] + (["--nproc", str(nproc)] if nproc else [])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[3:])}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(corpus: str, recipe_base: Path | None, warmup: int, steps: int, threads: int, nproc: int | None,
            scratch: Path, extra_env: dict[str, str] | None = None) -> dict:
    """tokens/s over the timed updates and CPU-seconds per update (see the module docstring)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "HYMO_PROGRESS": "0", **(extra_env or {})}
    for name in ("HYMO_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.pop(name, None)  # --threads says it; the launcher hands it to the ranks
    label = f"{nproc or 1}x{threads}" + ("-" + "-".join(f"{k}={v}" for k, v in sorted((extra_env or {}).items())) if extra_env else "")
    load_before = os.getloadavg()[0]
    long_out, short_out = scratch / f"{label}-long", scratch / f"{label}-short"
    recipe = bench_recipe(recipe_base, warmup + steps, _fresh(scratch / f"{label}-recipe"))  # one schedule for both runs
    cpu_long = train_once(corpus, recipe, long_out, warmup + steps, threads, nproc, env)
    cpu_short = train_once(corpus, recipe, short_out, warmup, threads, nproc, env)
    records = [json.loads(line) for line in (long_out / "metrics.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
    timed = [r for r in records if r.get("kind") == "train" and r["step"] > warmup]
    if len(timed) != steps:
        raise RuntimeError(f"{long_out}/metrics.jsonl: {len(timed)} train records after step {warmup}, expected {steps}")
    summary = json.loads((long_out / "summary.json").read_text(encoding="utf-8"))
    tokens_per_update = summary["train_config"]["batch_size"] * summary["train_config"]["seq_len"] * summary["train_config"]["gradient_accumulation_steps"]
    seconds = sum(tokens_per_update / r["tokens_per_s"] for r in timed)
    return {"tokens_per_s": steps * tokens_per_update / seconds, "seconds_per_update": seconds / steps,
            "cpu_seconds_per_update": (cpu_long - cpu_short) / steps, "world_size": summary["world_size"],
            "threads": summary["threads"], "load_before": load_before, "load_after": os.getloadavg()[0]}


def _fresh(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def cpu_cases(cpus: int, passive: bool) -> list[tuple[str, int | None, int, dict[str, str]]]:
    """(label, nproc, threads per process, extra environment); the first row is the baseline."""
    cases = [(f"1 process x {cpus} threads (all cores)", None, cpus, {})]
    if cpus > 1:
        cases += [("1 process x 1 thread", None, 1, {}), (f"--nproc {cpus} (FSDP2, gloo) x 1 thread", cpus, 1, {})]
    if passive:
        cases += [(f"{label}, OMP_WAIT_POLICY=PASSIVE", nproc, threads, {"OMP_WAIT_POLICY": "PASSIVE"})
                  for label, nproc, threads, _ in list(cases) if (nproc or 1) * threads > 1]
    return cases


def cpu_rows(corpus: str, recipe: Path | None, warmup: int, steps: int, passive: bool, scratch: Path) -> list[tuple]:
    from hymo_core.threads import usable_cpus

    rows, baseline = [], None
    for label, nproc, threads, extra in cpu_cases(usable_cpus(), passive):
        result = measure(corpus, recipe, warmup, steps, threads, nproc, scratch, extra)
        baseline = baseline or result["tokens_per_s"]
        rows.append((label, result["world_size"], result["threads"]["threads"], f"{result['tokens_per_s']:,.0f}",
                     f"{result['tokens_per_s'] / baseline:.2f}x", f"{result['seconds_per_update']:.3f}",
                     f"{result['cpu_seconds_per_update']:.3f}", f"{result['load_before']:.2f} -> {result['load_after']:.2f}"))
        print(rows[-1], flush=True)
    return rows


def gpu_rows(steps: int) -> list[tuple]:
    rows = []
    for compile_blocks in (False, True):
        result = launch(1, DENSE_125M, 8, 1, 2048, steps, precision="bf16", compile_blocks=compile_blocks)
        rows.append(("dense ~125M, FSDP2 1 rank, bf16", "on" if compile_blocks else "off", f"{result['tokens_per_s']:,.0f}",
                     f"{100 * result['mfu']:.1f} %", result["peak"]))
        print(rows[-1], flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--shape", default=json.dumps(DENSE_125M), help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=8, help=argparse.SUPPRESS)
    parser.add_argument("--accum", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--seq-len", type=int, default=2048, help=argparse.SUPPRESS)
    parser.add_argument("--precision", default="bf16", help=argparse.SUPPRESS)
    parser.add_argument("--compile", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--corpus", help="a training corpus (run directory, shards stage or corpus.json), e.g. runs/sample")
    parser.add_argument("--config", type=Path, help="training TOML (default: the sample recipe)")
    parser.add_argument("--steps", type=int, default=30, help="timed updates per row (after --warmup)")
    parser.add_argument("--warmup", type=int, default=3, help="updates before the timed ones")
    parser.add_argument("--passive", action="store_true", help="also each multi-thread / multi-rank row with OMP_WAIT_POLICY=PASSIVE")
    parser.add_argument("--write", action="store_true", help="write the tables into docs/benchmarks.md (refused at load >= 1.5)")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    if not args.corpus:
        parser.error("--corpus is required (e.g. runs/sample, from `hymo run` of the sample pipeline)")

    import tempfile

    import torch

    from bench.report import markdown_table, refuse_if_loaded, write_section

    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="hymo-bench-distributed-") as scratch:
        rows = cpu_rows(args.corpus, args.config, args.warmup, args.steps, args.passive, Path(scratch))
    load_end = os.getloadavg()
    header = ["launch", "ranks", "threads/rank", "tokens/s", "vs baseline", "s/update", "CPU s/update", "load (1 min) before -> after"]
    cpu = markdown_table(header, rows)
    if args.json:
        args.json.write_text(json.dumps({"header": header, "rows": rows, "load_start": load_start, "load_end": load_end}, indent=2) + "\n")
    if torch.cuda.is_available():
        gpu_table = markdown_table(["model", "compile", "tokens/s", "MFU", "peak"], gpu_rows(args.steps))
        gpu = f"GPU ({torch.cuda.get_device_name(0)}):\n\n{gpu_table}"
    else:
        gpu = ("GPU: none on this machine, so no GPU rows here; the MFU measured on an H200 (dense ~125M and hymo-750m, "
               "compile off/on) is in the section written from bench/gpu_check.py's device runs.")
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    fmt = lambda load: ", ".join(f"{x:.2f}" for x in load)  # noqa: E731
    note = (f"At {time.strftime('%H:%M UTC', time.gmtime())} on commit {commit}. Machine: {machine}. Every row is `hymo train` "
            f"on {args.corpus} with {'the recipe ' + str(args.config) if args.config else 'the sample recipe'} (a record every update, "
            f"evaluation and checkpoint only at the end); tokens/s over {args.steps} updates after {args.warmup} warm-up ones, "
            "from the run's metrics.jsonl; CPU s/update from the CPU time of every process of the run (ranks and torchrun "
            f"included), the {args.warmup + args.steps}-update run minus the {args.warmup}-update one. Baseline: one process "
            f"on all cores. Load average (1, 5, 15 min) at start: {fmt(load_start)}; at end: {fmt(load_end)}.")
    text = f"{cpu}\n\n{gpu}"
    print(text)
    print(note)
    if args.write:
        if refuse_if_loaded(load_start[0]):
            return 1
        write_section("Distributed training (bench/distributed.py)", text, note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
