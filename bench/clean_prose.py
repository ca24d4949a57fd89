#!/usr/bin/env python
"""Clean text kept, junk still caught: every quality rule on the two labelled sets, split in two halves.

  python bench/clean_prose.py [--corpus /work/scratch/bench/corpus/small.jsonl] [--write docs/benchmarks.md]

Labelled sets: the sample's `generated` source (its JSONL records, prose
profile) and the bench corpus (documentation pages, documentation profile).
Good = clean, exact_copy, near_copy; junk = navigation, spam, repeated_line,
short. Each set is split into halves by xxh64(id) % 2: profile changes were
decided looking at half A only, half B is the held-out check.

Per rule, with every rule evaluated (`all_rules`): good documents it fails,
junk it fails, and junk it alone fails (no other removing rule would catch
it). Report-only rules are listed with what they would remove. Totals compare
the profiles before issue 16's part 3 with the current defaults.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.lab1_filters import write_section  # noqa: E402
from bench.report import markdown_table  # noqa: E402

from manifests.sources import load_source  # noqa: E402
from tasks.quality import QualityConfig, evaluate, profile_configs, rule_plan  # noqa: E402

SECTION = "## Quality stages: clean text kept (bench/clean_prose.py)"
GOOD = ("clean", "exact_copy", "near_copy")
JUNK = ("navigation", "spam", "repeated_line", "short")
HALVES = ("A", "B")

# The prose and documentation profiles as they were before the changes measured here (docs/quality.md).
_LINE_SHAPE = ("fineweb_too_few_terminal_punct_lines", "fineweb_too_many_short_lines")
BEFORE = {
    "prose": {"c4_drop_unpunctuated_lines": False, "skip_rules": _LINE_SHAPE},
    "documentation": {"c4_drop_unpunctuated_lines": False,
                      "skip_rules": ("gopher_too_few_alphabetic_words", "c4_curly_bracket", "c4_line_filter", "fineweb_duplicate_line_chars") + _LINE_SHAPE,
                      "max_duplicate_ngram_char_fraction": ((5, 0.30), (6, 0.28), (7, 0.26), (8, 0.24), (9, 0.22), (10, 0.20))},
}


def half(doc_id: str) -> str:
    return HALVES[xxhash.xxh64_intdigest(doc_id.encode()) % 2]


def sample_docs() -> list[dict]:
    records = (json.loads(line) for line in load_source("generated").root.read_text(encoding="utf-8").splitlines())
    return [{"id": r.get("id") or r["url"], "text": r["text"], "label": r["meta"]["label"]} for r in records]


def corpus_docs(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as lines:
        return [{"id": r["id"], "text": r["text"], "label": r["label"]} for r in map(json.loads, lines)]


def totals(docs: list[dict], config: QualityConfig) -> dict[str, dict[str, int]]:
    """Per half (and 'all'): good, good removed, junk, junk caught."""
    out = {h: Counter() for h in HALVES + ("all",)}
    for doc in docs:
        removed = not evaluate(doc["text"], "en", config).keep
        kind = "good" if doc["label"] in GOOD else "junk"
        for h in (half(doc["id"]), "all"):
            out[h][kind] += 1
            out[h][kind + "_removed"] += removed
    return out


def per_rule(docs: list[dict], config: QualityConfig) -> list[list]:
    """Rows: rule, good failing per half, junk failing, junk failing this rule alone (among removing rules)."""
    every = replace(config, all_rules=True)
    removing = {rule.__name__ for rule in rule_plan(every, "en", False).removing}
    good, junk, only = Counter(), Counter(), Counter()
    for doc in docs:
        decision = evaluate(doc["text"], "en", every)
        failing = {v.rule for v in decision.failures} | {v.rule for v in decision.flags}
        if doc["label"] in GOOD:
            for rule in failing:
                good[(rule, half(doc["id"]))] += 1
        else:
            for rule in failing:
                junk[rule] += 1
            removing_failures = failing & removing
            if len(removing_failures) == 1:
                only[next(iter(removing_failures))] += 1
    rules = sorted({rule for rule, _ in good} | set(junk), key=lambda r: (-(good[(r, "A")] + good[(r, "B")]), -junk[r], r))
    return [[f"`{r}`" + ("" if r in removing else " (report-only)"), good[(r, "A")], good[(r, "B")], junk[r], only[r] if r in removing else "-"] for r in rules]


def share(removed: int, total: int) -> str:
    return f"{removed} / {total} = {100 * removed / max(1, total):.2f} %"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default="/work/scratch/bench/corpus/small.jsonl")
    parser.add_argument("--write", default=None, help="Markdown file whose section is replaced")
    args = parser.parse_args()

    now = profile_configs(QualityConfig())
    before = profile_configs(QualityConfig(profiles=BEFORE))
    sets = [("sample `generated`", "prose", sample_docs())]
    corpus = Path(args.corpus)
    if corpus.exists():
        sets.append((f"bench corpus `{corpus.name}`", "documentation", corpus_docs(corpus)))

    summary, details = [], []
    for name, profile, docs in sets:
        was, is_now = totals(docs, before[profile]), totals(docs, now[profile])
        for h in HALVES + ("all",):
            summary.append([name, profile, h, share(was[h]["good_removed"], was[h]["good"]), share(is_now[h]["good_removed"], is_now[h]["good"]),
                            share(was[h]["junk_removed"], was[h]["junk"]), share(is_now[h]["junk_removed"], is_now[h]["junk"])])
        details += [f"### {name}, {profile} profile: every rule evaluated", "",
                    markdown_table(["rule", "good failing (A)", "good failing (B)", "junk failing", "junk failing only this rule"], per_rule(docs, now[profile])), ""]

    out = [SECTION, "", f"Date {datetime.date.today().isoformat()}, machine {platform.machine()} {platform.system()} "
           f"({len(os.sched_getaffinity(0))} cores). `python bench/clean_prose.py --write docs/benchmarks.md`. Halves: xxh64(id) % 2; "
           "profile changes were decided on half A. Good = clean + exact/near copies; junk = navigation, spam, repeated_line, short. "
           "Before = the profiles before issue 16 part 3; now = the defaults (docs/quality.md, 'Clean prose kept').", "",
           markdown_table(["labelled set", "profile", "half", "good removed before", "good removed now", "junk caught before", "junk caught now"], summary), ""]
    out += details
    text = "\n".join(out)
    print(text)
    if args.write:
        write_section(Path(args.write), SECTION, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
