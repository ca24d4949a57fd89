"""hymo-tiny's full recipe with one part switched off at a time, on the sample (same steps, seed, data).

Rows: the preset as shipped (MoE on the MLA layer, MTP depth 2, NorMuon + CautiousAdamW), then
`mtp_depth = 0`, `moe_on = ""`, `optimizer = "muon_adamw"`, and the plain trunk (all three off).
Validation loss is the next-token cross-entropy for every row (MTP never enters evaluation).

    python bench/recipe_ablation.py --corpus runs/sample [--steps 120] [--threads 1] [--write]
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.normuon_rows import train_variants  # noqa: E402
from bench.report import markdown_table, write_section  # noqa: E402
from hymo_core.train.config import SAMPLE_TRAIN
from hymo_core.models.presets import PRESET_TRAINING, PRESETS  # noqa: E402

TITLE = "hymo-tiny recipe ablation (bench/recipe_ablation.py)"
FULL, FULL_TRAIN = PRESETS["hymo-tiny"], PRESET_TRAINING["hymo-tiny"]
VARIANTS = {
    "full preset (MoE + MTP 2 + NorMuon)": (FULL, FULL_TRAIN),
    "MTP off (mtp_depth = 0)": (replace(FULL, mtp_depth=0), FULL_TRAIN),
    "MoE off (moe_on = \"\")": (replace(FULL, moe_on=""), FULL_TRAIN),
    "NorMuon off (optimizer = \"muon_adamw\")": (FULL, {"optimizer": "muon_adamw"}),
    "trunk (all three off)": (replace(FULL, moe_on="", mtp_depth=0), {"optimizer": "muon_adamw"}),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--write", action="store_true", help="put the table into docs/benchmarks.md")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = train_variants(args.corpus, VARIANTS, args.steps)
    table = markdown_table(["hymo-tiny variant", "validation loss by step", "final train loss", "seconds"], rows)
    print(table)
    if args.write:
        note = (f"Sample recipe, {args.steps} updates of {SAMPLE_TRAIN.batch_size} x {SAMPLE_TRAIN.seq_len} tokens, "
                f"seed {SAMPLE_TRAIN.seed}, same data order for every row; {os.cpu_count()}-core CPU, {args.threads} "
                f"torch thread(s), load average {os.getloadavg()[0]:.1f} at the end (seconds are noisy).")
        write_section(TITLE, table, note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
