"""Lab 2's resume experiment on HyMo's trainer: N updates in one go vs N/2 + save + a new process + load + N/2.

    python bench/exact_resume.py --corpus runs/sample [--steps 20] [--write]

Same recipe as the pretrain stage (hymo_core.train.run.SAMPLE_*), horizon fixed at N so both sessions see
the same LR schedule. The control resumes the same weights, data cursor and RNG with a fresh optimizer.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hymo_core.checkpoint.common import rng_from_payload, weights_sha256
from hymo_core.checkpoint.single import read_checkpoint
from hymo_core.train.data import CorpusReader, TokenLoader  # noqa: E402
from hymo_core.models.model import ModelConfig, Transformer  # noqa: E402
from hymo_core.train.optim import build_optimizer  # noqa: E402
from hymo_core.train.config import SAMPLE_TRAIN
from hymo_core.train.run import SAMPLE_MODEL, run_training
from hymo_core.train.trainer import TrainHooks, TrainState, restore_rng, train  # noqa: E402


def losses(out: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["last_loss"] for r in rows if r["kind"] == "train"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args(argv)
    n, half = args.steps, args.steps // 2
    config = replace(SAMPLE_TRAIN, max_steps=n, horizon_steps=n, warmup_steps=min(SAMPLE_TRAIN.warmup_steps, half - 1), log_interval=1,
                     eval_interval=n, checkpoint_interval=half)
    tmp = Path(tempfile.mkdtemp(prefix="hymo-resume-"))
    started = time.perf_counter()
    whole = run_training(args.corpus, tmp / "whole", config, SAMPLE_MODEL, resume=False, cloze_path=None, progress=False)
    run_training(args.corpus, tmp / "split", replace(config, max_steps=half), SAMPLE_MODEL, resume=False, cloze_path=None, progress=False)
    recipe = tmp / "recipe.toml"
    train_keys = {k: v for k, v in config.to_dict().items() if k not in ("adamw_betas", "muon_ns_dtype")}
    model_keys = {k: v for k, v in SAMPLE_MODEL.__dict__.items() if k != "vocab_size"}
    recipe.write_text("[train]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in train_keys.items())
                      + "[model]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in model_keys.items()))
    done = subprocess.run([sys.executable, "-m", "hymo_core.train", "--corpus", args.corpus, "--config", str(recipe), "--out",
                           str(tmp / "split"), "--resume"], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    if done.returncode:
        print(done.stderr)
        return 1
    split = json.loads((tmp / "split" / "summary.json").read_text())
    a, b = losses(tmp / "whole"), losses(tmp / "split")

    payload = read_checkpoint(tmp / "split" / "checkpoints" / f"step-{half:08d}.pt")
    model = Transformer(ModelConfig(**payload["model_config"]))
    model.load_state_dict(payload["model"])
    optimizer = build_optimizer(model, config.optimizer_config(torch.device("cpu")))
    loader = TokenLoader(CorpusReader(args.corpus), "train", config.seq_len, config.batch_size, config.seed)
    loader.load_state_dict(payload["loaders"]["train"])
    restore_rng(rng_from_payload(payload["rng"]))
    control: dict[int, float] = {}
    train(model, optimizer, loader, None, config, TrainState.from_dict(payload["state"]), torch.device("cpu"),
          TrainHooks(on_update=lambda s, loss, lr: control.__setitem__(s.step, float(loss))))

    table = "\n".join([
        "| run | steps | max \\|loss - uninterrupted\\| | final weights sha256 | equal to uninterrupted |", "|---|---|---|---|---|",
        f"| uninterrupted | {n} | 0 | `{whole['weights_sha256'][:16]}…` | — |",
        f"| {half} + save + new process + load + {n - half} | {n} | {max(abs(a[s] - b[s]) for s in a):.3g} | "
        f"`{split['weights_sha256'][:16]}…` | {split['weights_sha256'] == whole['weights_sha256']} |",
        f"| control: resumed with a fresh optimizer | {n} | {max(abs(a[s] - control[s]) for s in control):.3g} | "
        f"`{weights_sha256(model)[:16]}…` | {weights_sha256(model) == whole['weights_sha256']} |",
    ])
    print(table)
    print(f"({time.perf_counter() - started:.0f} s)")
    if args.write:
        from bench.report import write_section

        write_section("Exact resume (bench/exact_resume.py; CI: tests/hymo_core/checkpoint/test_resume.py)", table,
                      f"Sample recipe ({sum(p.numel() for p in model.parameters()):,} parameters, {config.batch_size} x {config.seq_len} tokens "
                      f"per update) on the sample corpus, CPU fp32, {torch.get_num_threads()} threads; Lab 2's criterion is a maximum loss "
                      "error of 0. Machine: 2-core x86_64 CPU (shared).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
