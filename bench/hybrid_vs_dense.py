"""hymo-tiny (GDN + MLA) vs the dense sample model: same corpus, seed, steps and tokens.

    python bench/hybrid_vs_dense.py --corpus RUN_OR_SHARDS --out /tmp/hybrid-vs-dense [--write]

Three runs of the sample recipe: the dense sample model; the hybrid trunk of equal size (hymo-tiny
with `moe_on = ""`, `mtp_depth = 0`, the same MuonAdamW); and the full hymo-tiny preset (MoE on the
MLA layer, MTP depth 2, NorMuon + CautiousAdamW, as `preset = "hymo-tiny"` trains it). Trains each
(or reuses OUT/NAME when that run already finished with the same model), prints validation loss by
step, and with --write draws the curves into docs/hybrid_vs_dense_loss.png and the table into
docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, fields, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import markdown_table, write_section  # noqa: E402
from hymo_core.models.configs import ModelConfig
from hymo_core.train.config import TrainConfig
from hymo_core.models.presets import PRESET_TRAINING, PRESETS  # noqa: E402
from hymo_core.train.config import SAMPLE_TRAIN
from hymo_core.train.run import SAMPLE_MODEL, run_training

PICTURE = Path(__file__).resolve().parent.parent / "docs" / "hybrid_vs_dense_loss.png"
TITLE = "hymo_core III: hymo-tiny hybrid vs dense sample model (bench/hybrid_vs_dense.py)"
RUNS = {  # name: (model, training recipe)
    "dense": (SAMPLE_MODEL, SAMPLE_TRAIN),
    # hymo-tiny's shape with MoE and MTP off (their size fields back at the defaults they then do not use)
    "hybrid-trunk": (replace(PRESETS["hymo-tiny"], **{f.name: f.default for f in fields(ModelConfig)
                                                       if f.name.startswith(("moe_", "mtp_"))}), SAMPLE_TRAIN),
    "hymo-tiny": (PRESETS["hymo-tiny"], TrainConfig.from_dict({**SAMPLE_TRAIN.to_dict(), **PRESET_TRAINING["hymo-tiny"]})),
}


def finished(run: Path, model: ModelConfig, train: TrainConfig) -> dict | None:
    """The run's summary when it reached max_steps with this model (fields it predates at their defaults)."""
    path = run / "summary.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text())
    defaults = json.loads(json.dumps({f.name: f.default for f in fields(ModelConfig)}))  # tuples as JSON lists
    saved = {**defaults, **summary["model_config"]}
    wanted = json.loads(json.dumps({**asdict(model), "vocab_size": saved["vocab_size"], "max_seq_len": saved["max_seq_len"]}))
    return summary if summary["final_step"] == train.max_steps and saved == wanted else None


def records(run: Path, kind: str) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("kind") == kind]


def plot(runs: dict[str, Path], ln_v: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for (name, run), colour in zip(runs.items(), ("tab:blue", "tab:orange", "tab:green")):
        train, val = records(run, "train"), records(run, "eval")
        ax.plot([r["step"] for r in train], [r["loss"] for r in train], color=colour, alpha=0.45, label=f"{name} train")
        ax.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o-", color=colour, label=f"{name} validation")
    ax.axhline(ln_v, color="grey", linestyle=":", label="ln V (uniform)")
    ax.axhline(ln_v - 2, color="grey", linestyle="--", label="ln V - 2")
    ax.set_xlabel("update")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args(argv)
    out = Path(args.out)
    runs, summaries = {}, {}
    for name, (model, train) in RUNS.items():
        runs[name] = out / name
        summaries[name] = finished(runs[name], model, train) or run_training(args.corpus, runs[name], train, model,
                                                                            resume=True)
    ln_v = math.log(summaries["dense"]["model_config"]["vocab_size"])
    rows = []
    for name, summary in summaries.items():
        evals = records(runs[name], "eval")
        rows.append((name, f"{summary['parameters']:,}", f"{summary['tokens_seen']:,}",
                     ", ".join(f"{e['step']}: {e['val_loss']:.3f}" for e in evals),
                     f"{summary['final_val_loss']:.3f}", f"{ln_v - summary['final_val_loss']:.2f}",
                     f"{summary['session_seconds']:.0f}"))
    table = markdown_table(["model", "parameters", "tokens", "validation loss by step", "final val loss",
                            "nats below ln V", "wall s"], rows)
    print(table)
    if args.write:
        plot(runs, ln_v, PICTURE)
        write_section(TITLE, table + f"\n\n![hybrid vs dense]({PICTURE.name})",
                      f"Sample recipe (seed {SAMPLE_TRAIN.seed}, {SAMPLE_TRAIN.max_steps} updates of "
                      f"{SAMPLE_TRAIN.batch_size} x {SAMPLE_TRAIN.seq_len} tokens, cosine) on the same corpus; "
                      f"dense and hybrid-trunk with MuonAdamW, hymo-tiny with its preset's NorMuon + CautiousAdamW "
                      f"and MoE + MTP (its validation loss is the next-token CE, as for the others); "
                      f"ln V = {ln_v:.3f}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
