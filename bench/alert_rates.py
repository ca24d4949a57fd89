"""How often each default alert fires on healthy runs: the sample recipe trained for 200, 400 and 1,000 updates.

    python bench/alert_rates.py --corpus runs/sample --out /tmp/alert-rates [--updates 200 400 1000] [--write]

Each length is `hymo_core.train`'s sample recipe (SAMPLE_TRAIN, SAMPLE_MODEL) with `max_steps` (and so the cosine's
horizon) set to it; a finished run under OUT/updates-N is read again, not retrained. Every train and eval record of
its metrics.jsonl is then judged by today's default alerts (alerts.DEFAULT_ALERTS), in the order the loop judges
them, so the rates are those of the code the bench runs, whatever code trained the run. The table counts, per
default and run, the records judged, the warnings (kind "alert") and the information rows (kind "note": a spike
that recovered, a held-out loss below the forecast band). --write puts it into docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hymo_core.train.alerts import DEFAULT_ALERTS, RELATIVE_SCALE_FLOOR, AlertBook, fires, metric_value
from hymo_core.train.forecast import MIN_FORECAST_POINTS
from hymo_core.train.config import SAMPLE_TRAIN
from hymo_core.train.run import SAMPLE_MODEL, run_training

LENGTHS = (200, 400, 1000)


def train(corpus: Path, out: Path, updates: int) -> Path:
    """OUT/updates-N, trained unless its summary already says it reached N updates."""
    run = out / f"updates-{updates}"
    summary = run / "summary.json"
    if not (summary.is_file() and json.loads(summary.read_text())["final_step"] == updates):
        config = replace(SAMPLE_TRAIN, max_steps=updates)
        run_training(corpus, run, config, SAMPLE_MODEL, resume=True, cloze_path=None, progress=False, log=lambda *_: None)
    return run


def judge(run: Path) -> tuple[Counter, Counter, Counter, list[str]]:
    """(records judged, warnings, notes) per default alert, and a line per warning or note, from the run's metrics.jsonl."""
    summary = json.loads((run / "summary.json").read_text())
    book = AlertBook(DEFAULT_ALERTS, {"ln_vocab": summary["ln_vocab"], "tau": summary["train_config"]["qk_clip_threshold"]})
    checked, warnings, notes = Counter(), Counter(), Counter()
    rows: list[str] = []
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    for record in records:
        if record.get("kind") not in ("train", "eval"):
            continue
        for rule in DEFAULT_ALERTS:  # a rule judges a record that carries its metric (the forecast: once 6 evals fit a band)
            if any(metric_value(record, metric) is not None for metric in rule.metrics()) and (
                    rule.kind != "outside_forecast" or len(book.evals) >= MIN_FORECAST_POINTS):
                checked[rule.label] += 1
        firings = book.check_record(record, step=record["step"])
        for firing in firings:
            (warnings if firing.severity == "warning" else notes)[firing.alert] += 1
            rows.append(describe(firing))
    for firing in book.unresolved(summary["final_step"]):
        warnings[firing.alert] += 1
        rows.append(describe(firing))
    return checked, warnings, notes, rows + headroom(records)


def headroom(records: list[dict]) -> list[str]:
    """Per z-score default: the largest statistic a value reached without firing, against the window it was judged on:
    how close a healthy run came to a warning."""
    lines = []
    rules = [r for r in DEFAULT_ALERTS if r.kind == "zscore"]
    rules += [replace(r, spread_floor=RELATIVE_SCALE_FLOOR) for r in rules if r.spread_floor != RELATIVE_SCALE_FLOOR]  # the old floor
    for rule in rules:
        history: list[float] = []
        best = None
        for record in records:
            value = metric_value(record, rule.metric) if record.get("kind") == "train" else None
            if value is None or not math.isfinite(value):
                continue
            fired, statistic = fires(rule, value, history)
            if not fired and statistic is not None and (best is None or statistic > best[0]):
                window = sorted(history[-rule.window:])
                best = (statistic, record["step"], value, window[len(window) // 2])
            history = (history + [value])[-rule.window:]
        if best:
            lines.append(f"largest {rule.label} statistic that did not fire: {best[0]:.2f} at step {best[1]} "
                         f"({rule.metric} {best[2]:.3g}, window median {best[3]:.3g}, spread floor {rule.spread_floor:g})")
    return lines


def describe(firing) -> str:
    statistic = "" if firing.statistic is None or firing.statistic == firing.value else f", statistic {firing.statistic:.3g}"
    return (f"{'warning' if firing.severity == 'warning' else 'note'} at step {firing.step}: {firing.alert} "
            f"({firing.metric} {firing.value:.3g}{statistic}; {firing.note})")


def render(results: dict[int, tuple[Counter, Counter, Counter, list[str]]]) -> str:
    lengths = sorted(results)
    head = "| default alert | " + " | ".join(f"{n} updates: judged / warnings / notes" for n in lengths) + " |"
    rows = [head, "|---|" + "---|" * len(lengths)]
    for rule in DEFAULT_ALERTS:
        cells = [f"{results[n][0][rule.label]} / {results[n][1][rule.label]} / {results[n][2][rule.label]}" for n in lengths]
        rows.append(f"| {rule.label} | " + " | ".join(cells) + " |")
    total = [f"{sum(results[n][0].values())} / {sum(results[n][1].values())} / {sum(results[n][2].values())}" for n in lengths]
    rows.append("| all defaults | " + " | ".join(total) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--updates", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument("--write", action="store_true", help="put the table into docs/benchmarks.md")
    args = parser.parse_args(argv)
    results = {n: judge(train(args.corpus, args.out, n)) for n in args.updates}
    table = render(results)
    print(table)
    detail = []
    for n in sorted(results):
        run = args.out / f"updates-{n}"
        book_rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        evals = [r for r in book_rows if r.get("kind") == "eval"]
        events = "; ".join(results[n][3]) or "nothing fired"
        detail.append(f"{n} updates: {len(evals)} evaluations, final held-out loss {evals[-1]['val_loss']:.3f}; {events}" if evals
                      else f"{n} updates; {events}")
    print("\n".join(detail))
    if args.write:
        from bench.report import write_section

        note = (f"`bench/alert_rates.py --updates {' '.join(map(str, args.updates))}`: the sample recipe "
                "(SAMPLE_TRAIN, SAMPLE_MODEL; log every 10 updates, eval every 50) trained for each length with the cosine "
                "horizon at that length, then every train and eval record judged by the default alerts in the loop's order. "
                "judged: records carrying the alert's metric (the forecast alert judges evaluations from the 7th on, "
                "when 6 earlier ones fit a band); warnings: `kind: \"alert\"` rows; notes: information rows (a spike that "
                "recovered by the next log, a held-out loss below the forecast band); before issue 58 every note was a warning "
                "(a spike fired at once, the forecast alert was two-sided). " + " ".join(f"{line}." for line in detail))
        write_section("Default alerts on healthy sample runs (`bench/alert_rates.py`)", table, note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
