"""Validate the loss forecast on the sample: train longer than usual, fit L(D) on the first half, forecast the second.

    python -m bench.loss_forecast --corpus runs/sample [--steps 400] [--eval-interval 20] [--write]

Trains the sample recipe (hymo_core.train.config.SAMPLE_TRAIN / SAMPLE_MODEL) with a constant LR after
warmup, so that the loss follows one power law and no decay phase bends it late, evaluating the
held-out set every `--eval-interval` updates. The forecast (hymo_core.train.forecast) is fitted on the
evaluations of the first half of the tokens and compared with every evaluation of the second half:
absolute error, whether each point lies in the 90 % band, and how the final forecast moves with the fit
window. With --write the table replaces its section in docs/training.md (under "Watching a run") and
in docs/benchmarks.md (bench/report.replace_section).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import tempfile
import time
from dataclasses import replace
from pathlib import Path

TITLE = "Forecast validation on the sample (`bench/loss_forecast.py`)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True, help="a run directory, shards stage directory or corpus.json of the sample")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--eval-interval", type=int, default=20)
    parser.add_argument("--write", action="store_true", help="replace the section in docs/training.md")
    args = parser.parse_args(argv)

    import numpy as np
    import torch

    from bench.report import markdown_table, replace_section
    from hymo_core.models.configs import SAMPLE_MODEL
    from hymo_core.train.config import SAMPLE_TRAIN
    from hymo_core.train.forecast import forecast_loss
    from hymo_core.train.run import run_training

    config = replace(SAMPLE_TRAIN, max_steps=args.steps, schedule="constant", eval_interval=args.eval_interval,
                     log_interval=args.eval_interval, checkpoint_interval=args.steps, alerts=())
    load_before, started = os.getloadavg()[0], time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        summary = run_training(args.corpus, out, config, SAMPLE_MODEL, resume=False, cloze_path=None, device=torch.device("cpu"),
                               log=lambda *_: None, progress=False)
        evals = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines() if '"kind": "eval"' in line]
    minutes = (time.perf_counter() - started) / 60
    tokens = np.array([e["tokens_seen"] for e in evals], dtype=float)
    losses = np.array([e["val_loss"] for e in evals], dtype=float)
    half = tokens <= tokens[-1] / 2
    result, fits = forecast_loss(tokens[half], losses[half], tokens[-1])
    rows, inside, errors, signed = [], 0, [], []
    for t, observed in zip(tokens[~half], losses[~half]):
        low, high = fits.band(t)
        predicted = float(result.fit(t))
        inside += low <= observed <= high
        errors.append(abs(predicted - observed))
        signed.append(predicted - observed)
        rows.append((f"{t:,.0f}", f"{observed:.4f}", f"{predicted:.4f}", f"{predicted - observed:+.4f}", f"[{low:.4f}, {high:.4f}]",
                     "yes" if low <= observed <= high else "no"))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    load = os.getloadavg()[0]
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [f"## {TITLE}", "",
             f"Measured {date} on commit {commit}, {platform.machine()} CPU ({os.cpu_count()} cores), load {load_before:.1f} before and "
             f"{load:.1f} after, {torch.get_num_threads()} threads, {minutes:.1f} min: "
             f"the sample recipe with a constant LR for {args.steps} updates ({tokens[-1]:,.0f} tokens), held-out loss every "
             f"{args.eval_interval} updates ({len(evals)} points). Fit on the {int(half.sum())} points up to {tokens[half][-1]:,.0f} tokens: "
             f"L(D) = {result.fit.l_inf:.3f} + {result.fit.a:.3g} D^-{result.fit.gamma:.3f}.", "",
             markdown_table(["tokens", "observed", "forecast", "error", "90 % band for an observation", "inside"], rows), "",
             f"Second half: mean absolute error {np.mean(errors):.4f} nats, largest {np.max(errors):.4f}, mean signed error "
             f"{np.mean(signed):+.4f} (forecast above the observation at {sum(e > 0 for e in signed)} of {len(signed)} points); "
             f"{inside} of {len(errors)} points inside the 90 % band an observation is expected in (the residual bootstrap: refits' "
             f"spread plus one observation's scatter, times Student's t; the `outside_forecast` alert reads the same band at 99 %). "
             f"At the last point ({tokens[-1]:,.0f} tokens) the forecast is {result.forecast:.4f}, "
             f"band [{result.low:.4f}, {result.high:.4f}] "
             f"(the summary's `forecast.low` / `high`), against {losses[-1]:.4f} observed.", "",
             "How the forecast at the last point moves with the fit window (latest k of the first-half points):", "",
             markdown_table(["points", "from tokens", "forecast", "L_inf", "gamma"],
                            [(w["points"], f"{w['from_tokens']:,.0f}", f"{w['forecast']:.4f}", f"{w['l_inf']:.3f}", f"{w['gamma']:.3f}")
                             for w in result.window_sensitivity]),
             "", f"(final train loss {summary['final_train_loss']:.4f}, final held-out loss {summary['final_val_loss']:.4f})"]
    text = "\n".join(lines)
    print(text)
    if args.write:
        docs = Path(__file__).resolve().parent.parent / "docs"
        replace_section_level3(docs / "training.md", text)
        replace_section(docs / "benchmarks.md", f"## {TITLE}", text)
    return 0


def replace_section_level3(doc: Path, text: str) -> None:
    """The section sits under "Watching a run" as a #### heading, up to the next ### one: replace it in place."""
    body = text.replace(f"## {TITLE}", f"#### {TITLE}", 1)
    existing = doc.read_text(encoding="utf-8")
    heading = f"#### {TITLE}"
    start = existing.index(heading)
    end = existing.find("\n### ", start)
    updated = existing[:start] + body + "\n" + existing[end:]
    doc.write_text(updated, encoding="utf-8")


if __name__ == "__main__":
    raise SystemExit(main())
