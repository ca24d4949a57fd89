"""Quality evidence for the sample recipe: validation loss vs ln(V), cloze accuracy vs chance, the loss curve.

    python bench/pretrain_sample.py --corpus runs/sample --out /tmp/pretrain-sample [--reuse] [--write]

Trains with `hymo_core.train.run.SAMPLE_TRAIN` / `SAMPLE_MODEL` (`hymo run`'s pretrain stage trains 24 updates of it: manifests/configs/sample.toml),
or with --reuse reads an existing OUT/summary.json of that recipe. --write puts the table into
docs/benchmarks.md and the picture into docs/pretrain_sample_loss.png.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hymo_core.train.config import SAMPLE_TRAIN
from hymo_core.train.run import SAMPLE_MODEL, run_training

PICTURE = Path(__file__).resolve().parent.parent / "docs" / "pretrain_sample_loss.png"


def render(summary: dict, evals: list[dict], tokens_per_s: list[float]) -> str:
    cloze = summary["cloze"]
    rows = [
        "| quantity | value |", "|---|---|",
        f"| parameters | {summary['parameters']:,} |",
        f"| updates x tokens per update | {summary['final_step']} x {summary['train_config']['batch_size'] * summary['train_config']['seq_len']} "
        f"({summary['tokens_seen']:,} tokens) |",
        f"| ln V (uniform guess) | {summary['ln_vocab']:.3f} |",
        "| validation loss by step | " + ", ".join(f"{e['step']}: {e['val_loss']:.3f}" for e in evals) + " |",
        f"| final validation loss / perplexity | {summary['final_val_loss']:.3f} / {summary['final_val_perplexity']:.0f} |",
        f"| final train loss | {summary['final_train_loss']:.3f} |",
        f"| cloze accuracy, summed log-prob ({cloze['items']} items) | {cloze['accuracy']:.3f} ± {cloze['accuracy_stderr']:.3f} |",
        f"| cloze accuracy, length-normalised | {cloze['accuracy_length_normalised']:.3f} ± {cloze['accuracy_length_normalised_stderr']:.3f} |",
        f"| chance | {cloze['chance']:.3f} |",
        f"| tokens/s per logged window (min / median / max) | {min(tokens_per_s):,.0f} / {sorted(tokens_per_s)[len(tokens_per_s) // 2]:,.0f} / {max(tokens_per_s):,.0f} |",
        f"| wall time of the session | {summary['session_seconds']:.0f} s |",
        f"| weights sha256 | `{summary['weights_sha256'][:16]}…` |",
    ]
    return "\n".join(rows) + "\n\n![sample loss curve](pretrain_sample_loss.png)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--reuse", action="store_true", help="report OUT/summary.json instead of training")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args(argv)
    out = Path(args.out)
    summary = json.loads((out / "summary.json").read_text()) if args.reuse else run_training(args.corpus, out, SAMPLE_TRAIN, SAMPLE_MODEL, resume=True)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    table = render(summary, [r for r in records if r["kind"] == "eval"], [r["tokens_per_s"] for r in records if r["kind"] == "train"])
    print(table)
    if args.write:
        from bench.report import write_section

        shutil.copy2(out / "loss.png", PICTURE)
        write_section("Pretraining the sample (bench/pretrain_sample.py)", table,
                      "Machine: 2-core x86_64 CPU shared with other engineers' jobs (load average 5-8 during the run), "
                      "so tokens/s swings by 10x between windows; the wall time is not what an idle machine gives. "
                      "Corpus: the bundled sample through the shards stage (8,192-token BPE, ~2.0 M train tokens).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
