"""Lab 5 (seed 001): five continued-pretraining conditions from one base, judged by the gate fixed before any of them.

Corpora, all in the bundled sample's token ids (the sample run's tokenizer):
  general  the sample without its Python-docs sources (prose-enwiki, multilingual, generated):
           `hymo run --until split` on those sources, then `hymo retokenize` with the sample's tokenizer
  domain   the Python documentation pages alone (python-docs, python-docs-warc), built the same way
The base is the sample recipe (200 updates) trained on the general corpus; each condition continues it for
100 updates (replay 0 / 10 / 30 % at the low peak LR, 0 / 30 % at the high one; warmup 10, cosine to 10 %,
fresh optimizer, sampler seed 0) and is judged by Lab 5's gate: domain loss down >= 1.00 nat/token, general
loss up <= 0.20 nat/token, on 10 fixed validation batches of each corpus.

    nice -n 10 python bench/lab5_cpt.py --sample runs/sample --work /tmp/lab5   (runs/sample: `hymo run`, through its shards stage)

Writes WORK/lab5-metrics.json, docs/lab5_cpt.png (domain reduction vs general rise with the gate lines) and
the table into docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hymo_core.models.configs import SAMPLE_MODEL
from hymo_core.train.config import SAMPLE_TRAIN

GENERAL_SOURCES = ["prose-enwiki", "multilingual", "generated"]
DOMAIN_SOURCES = ["python-docs", "python-docs-warc"]
LOW_LR, HIGH_LR = SAMPLE_TRAIN.peak_lr / 10, SAMPLE_TRAIN.peak_lr  # Lab 5: 3e-4 and 3e-3 after a 3e-3 base
CONDITIONS = [("low / 0%", 0.0, LOW_LR), ("low / 10%", 0.1, LOW_LR), ("low / 30%", 0.3, LOW_LR),
              ("high / 0%", 0.0, HIGH_LR), ("high / 30%", 0.3, HIGH_LR)]
PLOT = REPO / "docs" / "lab5_cpt.png"


def hymo(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "flows", *args], cwd=REPO, check=True, env={**os.environ, "HYMO_PROGRESS": "0"})


def corpus_from_sources(sample: Path, sources: list[str], work: Path, name: str) -> Path:
    """A split of `sources` only, tokenized with the sample's tokenizer; returns the run directory to read."""
    run, corpus = work / f"{name}-run", work / f"{name}-corpus"
    if not (corpus / "02_shards" / "corpus.json").is_file():
        config = work / f"{name}.toml"
        config.write_text(f"[run]\nsources = {json.dumps(sources)}\n", encoding="utf-8")
        hymo("run", "--config", str(config), "--out", str(run), "--until", "split")
        from tasks.corpus.retokenize import retokenize

        retokenize(run, sample, corpus)
    return corpus


def train_base(general: Path, work: Path) -> Path:
    from hymo_core.train.run import run_training

    out = work / "base"
    checkpoint = out / "checkpoints" / f"step-{SAMPLE_TRAIN.max_steps:08d}.pt"
    if not checkpoint.is_file():
        run_training(general, out, SAMPLE_TRAIN, SAMPLE_MODEL, resume=True, cloze_path=None)
    return checkpoint


def run_conditions(base: Path, domain: Path, general: Path, work: Path) -> dict:
    from hymo_core.cpt.run import CptConfig, run_cpt

    results = {}
    for name, replay_ratio, peak in CONDITIONS:
        out = work / "cpt" / name.replace(" / ", "-").replace("%", "pct")
        summary_path = out / "summary.json"
        if summary_path.is_file() and "verdict" in json.loads(summary_path.read_text()) and "criteria" in json.loads(summary_path.read_text())["verdict"]:
            summary = json.loads(summary_path.read_text())
        else:
            if out.exists():
                import shutil

                shutil.rmtree(out)
            started = time.perf_counter()
            summary = run_cpt(base, domain, general, out, CptConfig(replay_ratio=replay_ratio, peak_lr=peak, steps=100, warmup_steps=10,
                                                                     eval_interval=25, eval_batches=10), log=lambda *_: None)
            summary["seconds"] = time.perf_counter() - started
        criteria = {row["metric"]: row for row in summary["verdict"]["criteria"]}
        results[name] = {"replay": replay_ratio, "peak_lr": peak, "general": summary["losses"]["cpt"]["general_loss"],
                         "domain": summary["losses"]["cpt"]["domain_loss"],
                         "general_rise": criteria["general_loss_rise"]["value"], "general_rise_stderr": criteria["general_loss_rise"]["stderr"],
                         "domain_reduction": criteria["domain_loss_reduction"]["value"],
                         "domain_reduction_stderr": criteria["domain_loss_reduction"]["stderr"],
                         "actual_replay": summary["replay"]["actual"], "passes_gate": summary["verdict"]["passed"],
                         "seconds": summary.get("seconds"), "baseline": summary["losses"]["base"]}
        print(f"{name:12} general {results[name]['general']:.3f}  domain {results[name]['domain']:.3f}  rise {results[name]['general_rise']:+.3f}  "
              f"reduction {results[name]['domain_reduction']:+.3f}  replay {results[name]['actual_replay']:.3f}  pass {results[name]['passes_gate']}", flush=True)
    return results


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7.2, 3.8))
    for (name, r), color in zip(results.items(), ["#D55E00", "#E69F00", "#009E73", "#CC79A7", "#0072B2"]):
        axis.errorbar(r["domain_reduction"], r["general_rise"], xerr=1.96 * r["domain_reduction_stderr"], yerr=1.96 * r["general_rise_stderr"],
                      fmt="o", color=color, markersize=7, capsize=3, label=name)
    axis.axhline(0.20, color="gray", linestyle="--", label="gate: general rise <= 0.20")
    axis.axvline(1.00, color="gray", linestyle=":", label="gate: domain reduction >= 1.00")
    axis.set(xlabel="domain loss reduction (nats/token)", ylabel="general loss rise (nats/token)",
             title="Continued pretraining on the sample: adaptation vs forgetting (95 % intervals)")
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sample", type=Path, required=True, help="a finished `hymo run` of the bundled sample (its tokenizer is used)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/lab5"))
    parser.add_argument("--no-doc", action="store_true", help="do not write docs/benchmarks.md and the picture")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: on a shared machine, OpenMP spinning costs more than it gives)")
    args = parser.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # also for the `hymo run` subprocesses
    import torch

    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    general = corpus_from_sources(args.sample, GENERAL_SOURCES, args.work, "general")
    domain = corpus_from_sources(args.sample, DOMAIN_SOURCES, args.work, "domain")
    base = train_base(general, args.work)
    results = run_conditions(base, domain, general, args.work)
    baseline = next(iter(results.values()))["baseline"]
    metrics = {"baseline": baseline, "results": results, "conditions": CONDITIONS, "base_recipe": replace(SAMPLE_TRAIN).to_dict(),
               "gate": {"domain_loss_reduction": ">= 1.00", "general_loss_rise": "<= 0.20"}, "seconds": time.perf_counter() - started}
    (args.work / "lab5-metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    header = ["condition", "peak LR", "general", "domain", "general rise", "domain reduction", "actual replay", "passes gate"]
    rows = [(name, f"{r['peak_lr']:.0e}", f"{r['general']:.3f}", f"{r['domain']:.3f}", f"{r['general_rise']:+.3f} ± {r['general_rise_stderr']:.3f}",
             f"{r['domain_reduction']:+.3f} ± {r['domain_reduction_stderr']:.3f}", f"{r['actual_replay']:.3f}", str(r["passes_gate"]))
            for name, r in results.items()]
    from bench.report import markdown_table, write_section

    table = markdown_table(header, rows)
    print(f"base: general {baseline['general_loss']:.3f}, domain {baseline['domain_loss']:.3f}\n{table}")
    if not args.no_doc:
        plot(results, PLOT)
        note = (f"`bench/lab5_cpt.py --sample RUN`. Machine: {platform.machine()} {os.cpu_count()}-core CPU, torch {__import__('torch').__version__}, "
                f"shared with other jobs; {metrics['seconds']:.0f} s in all. Base: the sample recipe ({SAMPLE_TRAIN.max_steps} updates of "
                f"{SAMPLE_TRAIN.batch_size} x {SAMPLE_TRAIN.seq_len} tokens, peak {SAMPLE_TRAIN.peak_lr:g}) on the sample without its Python-docs sources; "
                f"base held-out loss general {baseline['general_loss']:.3f}, domain (Python docs) {baseline['domain_loss']:.3f} nats/token. Each condition: "
                "100 updates, warmup 10, cosine to 10 % of peak, fresh optimizer, replay by a per-sequence coin with sampler seed 0; losses on 10 fixed "
                "validation batches per corpus; ± is the paired standard error over those sequences. Gate (fixed before the runs): domain reduction "
                "≥ 1.00, general rise ≤ 0.20. Picture: `docs/lab5_cpt.png`.")
        write_section("Lab 5: continued pretraining with replay (bench/lab5_cpt.py)", table, note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
