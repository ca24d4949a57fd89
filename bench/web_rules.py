#!/usr/bin/env python
"""Web rules on data no threshold was chosen on: each quality profile on the held-out labelled web set.

  python bench/web_rules.py [--write docs/benchmarks.md]

The held-out set (tests/fixtures/web_heldout/, built by its build.py) holds
real clean pages (Debian Handbook and FAQ, main text by trafilatura) and eight
kinds of web junk from a generator written for it. Per profile: clean pages
removed (by first failing rule) and junk caught per kind. The web profile is
FineWeb's published chain at its published numbers, so nothing in it was tuned
on any labelled set; the prose and documentation profiles were tuned on the
sample's `generated` source and the bench corpus (docs/quality.md), not on this.
"""
from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import platform
import subprocess
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.report import markdown_table, publish  # noqa: E402

from tasks.filters.quality import QualityConfig, evaluate, profile_configs  # noqa: E402

SECTION = "## Quality stages: web rules on a held-out labelled web set (bench/web_rules.py)"
HELDOUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "web_heldout" / "web_heldout.jsonl.gz"
PROFILES = ("web", "prose", "documentation")


def heldout_records(path: Path = HELDOUT) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines]


def outcome(records: list[dict], config: QualityConfig) -> dict[str, Counter]:
    """Counters: clean pages removed by first rule, junk caught and junk seen per kind."""
    counts = {"clean_removed": Counter(), "clean": Counter(), "junk_caught": Counter(), "junk": Counter()}
    for record in records:
        decision = evaluate(record["text"], "en", config)
        if record["label"] == "clean":
            counts["clean"][record["kind"]] += 1
            if not decision.keep:
                counts["clean_removed"][decision.failures[0].rule] += 1
        else:
            counts["junk"][record["kind"]] += 1
            counts["junk_caught"][record["kind"]] += not decision.keep
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", metavar="MARKDOWN", help="replace this script's section in that file")
    args = parser.parse_args()
    records = heldout_records()
    configs = profile_configs(QualityConfig())
    results = {profile: outcome(records, configs[profile]) for profile in PROFILES}
    kinds = sorted(results["web"]["junk"])
    clean_total = sum(results["web"]["clean"].values())
    junk_total = sum(results["web"]["junk"].values())
    summary = [(f"`{profile}`", f"{sum(r['clean_removed'].values())} / {clean_total} = {100 * sum(r['clean_removed'].values()) / clean_total:.1f} %",
                f"{sum(r['junk_caught'].values())} / {junk_total} = {100 * sum(r['junk_caught'].values()) / junk_total:.1f} %",
                *(f"{r['junk_caught'][kind]} / {r['junk'][kind]}" for kind in kinds)) for profile, r in results.items()]
    removed_by = [(f"`{profile}`", ", ".join(f"`{rule}` {count}" for rule, count in r["clean_removed"].most_common()) or "–")
                  for profile, r in results.items()]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = [SECTION, "", f"Date {datetime.date.today().isoformat()}, commit {commit}, machine {platform.machine()} {platform.system()}, "
           f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}. Counts, not timings: the same on any machine.", "",
           f"{clean_total} clean pages ({', '.join(f'{k} {v}' for k, v in sorted(results['web']['clean'].items()))}), "
           f"{junk_total} junk pages ({len(kinds)} kinds × {junk_total // len(kinds)}); every page evaluated as English.", "",
           markdown_table(["profile", "clean removed", "junk caught", *kinds], summary), "",
           "Clean pages removed, by first failing rule:", "", markdown_table(["profile", "rules"], removed_by)]
    return publish(out, SECTION, args.write)


if __name__ == "__main__":
    raise SystemExit(main())
