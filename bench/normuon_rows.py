"""NorMuon's per-neuron (row) normalisation on vs off, with MuonAdamW as the baseline, on the sample.

Every variant trains the sample recipe (hymo_core.models.configs SAMPLE_TRAIN / SAMPLE_MODEL: same steps,
seed, data order, LR schedule) and differs only in the optimizer switches. The table goes into
docs/benchmarks.md; docs/training.md states the default chosen from it.

    python bench/normuon_rows.py --corpus runs/sample [--steps 200] [--threads 1] [--baseline] [--write]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import markdown_table, write_section  # noqa: E402
from hymo_core.models.configs import SAMPLE_MODEL, ModelConfig
from hymo_core.train.config import SAMPLE_TRAIN
from hymo_core.train.run import run_training  # noqa: E402

TITLE = "NorMuon row normalisation on the sample (bench/normuon_rows.py)"
BASELINE = {"MuonAdamW (Nesterov, quintic NS, decoupled WD)": dict(optimizer="muon_adamw")}
VARIANTS = {
    "NorMuon + CautiousAdamW, row normalisation on": dict(optimizer="normuon", cautious_weight_decay=True,
                                                          normuon_row_normalisation=True),
    "NorMuon + CautiousAdamW, row normalisation off": dict(optimizer="normuon", cautious_weight_decay=True,
                                                           normuon_row_normalisation=False),
}


def train_variants(corpus: str, variants: dict[str, tuple[ModelConfig, dict]], steps: int) -> list[tuple[str, str, str, str]]:
    """Train each (model, [train] switches) with the sample recipe for `steps` updates; one table row each."""
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for label, (model, switches) in variants.items():
            config = replace(SAMPLE_TRAIN, max_steps=steps, eval_interval=max(steps // 4, 1), **switches)
            out = Path(scratch) / str(len(rows))
            summary = run_training(corpus, out, config, model, resume=False, progress=False, cloze_path=None,
                                   log=lambda *_: None, threads=torch.get_num_threads())
            evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
            evals = [e for e in evals if e.get("kind") == "eval"]
            rows.append((label, ", ".join(f"{e['step']}: {e['val_loss']:.3f}" for e in evals),
                         f"{summary['final_train_loss']:.3f}", f"{summary['session_seconds']:.0f}"))
            print(rows[-1], flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--steps", type=int, default=SAMPLE_TRAIN.max_steps)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (small model: 1 is fastest on a shared machine)")
    parser.add_argument("--baseline", action="store_true", help="also a MuonAdamW row")
    parser.add_argument("--write", action="store_true", help="put the table into docs/benchmarks.md")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    variants = {label: (SAMPLE_MODEL, switches) for label, switches in {**(BASELINE if args.baseline else {}), **VARIANTS}.items()}
    rows = train_variants(args.corpus, variants, args.steps)
    table = markdown_table(["optimizer", "validation loss by step", "final train loss", "seconds"], rows)
    print(table)
    if args.write:
        note = (f"Sample recipe ({args.steps} updates of {SAMPLE_TRAIN.batch_size} x {SAMPLE_TRAIN.seq_len} tokens, "
                f"seed {SAMPLE_TRAIN.seed}, peak LR {SAMPLE_TRAIN.peak_lr} for every group, weight decay "
                f"{SAMPLE_TRAIN.weight_decay}), same data order for every row; {os.cpu_count()}-core CPU, "
                f"{args.threads} torch thread(s), load average {os.getloadavg()[0]:.1f} at the end (seconds are noisy).")
        write_section(TITLE, table, note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
