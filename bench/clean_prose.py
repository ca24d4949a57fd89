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
the profiles before issue 16's part 3, after its first and second rounds, and
the current defaults; the junk pages the defaults keep are listed. The cost of the documentation profile's word count (word_split =
"identifiers") is measured per document on the bench corpus.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.report import markdown_table, publish  # noqa: E402

from manifests.sources import load_source  # noqa: E402
from tasks.filters.quality import evaluate, profile_configs, rule_plan
from tasks.filters.quality_config import QualityConfig
from tasks.filters.text_view import TextView

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
# After part 3's first round: today's prose profile; documentation with whitespace words, C4 sentences and
# duplicated n-grams removing.
ROUND_1 = {"prose": QualityConfig().profiles["prose"], "documentation": {
    **BEFORE["documentation"], "report_rules": ("gopher_duplicate_lines", "fineweb_too_many_newlines_per_word", "gopher_mean_word_length_too_long"),
    "duplicate_line_min_words": 5, "min_stop_words": 1, "max_top_ngram_char_fraction": ((2, 0.40), (3, 0.36), (4, 0.32))}}
# After its second round: words counted by identifier names, C4 sentences and duplicated n-grams (at Gopher's numbers)
# report-only; stop words still removing and Gopher's 50-word floor.
ROUND_2 = {"prose": ROUND_1["prose"], "documentation": {
    **{field: value for field, value in ROUND_1["documentation"].items() if field != "max_duplicate_ngram_char_fraction"},
    "report_rules": ROUND_1["documentation"]["report_rules"] + ("c4_too_few_sentences", "gopher_duplicate_*gram_coverage"),
    "word_split": "identifiers"}}


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


def junk_kept(docs: list[dict], config: QualityConfig, earlier: QualityConfig) -> list[list]:
    """Rows: every junk document the config keeps, with its identifier-word count and what the earlier config removed it for."""
    rows = []
    for doc in docs:
        if doc["label"] in JUNK and evaluate(doc["text"], "en", config).keep:
            before = evaluate(doc["text"], "en", earlier)
            rows.append([f"`{doc['id']}`", half(doc["id"]), doc["label"], TextView(doc["text"]).word_count("identifiers"),
                         "kept" if before.keep else f"`{before.failures[0].rule}`"])
    return rows


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


WHOLE_PROFILE_DOCS = 1000  # the whole-profile timing uses the first documents only, so best of 5 stays short
TIMING_ROUNDS = 5


def seconds_per_doc(measures: dict[str, object], texts: list[str]) -> dict[str, float]:
    """Best of TIMING_ROUNDS runs of each measure(text) over all texts, per text; the measures take turns within a
    round, so load from other processes on this shared machine falls on all of them alike."""
    best = dict.fromkeys(measures, float("inf"))
    for _ in range(TIMING_ROUNDS):
        for name, measure in measures.items():
            started = time.perf_counter()
            for text in texts:
                measure(text)
            best[name] = min(best[name], time.perf_counter() - started)
    return {name: seconds / max(1, len(texts)) for name, seconds in best.items()}


def word_split_cost(texts: list[str], documentation: QualityConfig) -> list[list]:
    """Per document: the word count alone (fresh TextView each time) and the whole profile with every rule evaluated
    (no early exit, so the difference is the count's own cost, not documents that now reach later rules)."""
    configs = {split: replace(documentation, all_rules=True, word_split=split) for split in ("whitespace", "identifiers")}
    count = seconds_per_doc({split: (lambda text, split=split: TextView(text).word_count(split)) for split in configs}, texts)
    whole = seconds_per_doc({split: (lambda text, config=config: evaluate(text, "en", config)) for split, config in configs.items()},
                            texts[:WHOLE_PROFILE_DOCS])
    return [[f"`{split}`", f"{1e6 * count[split]:.0f}", f"{1e6 * whole[split]:.0f}"] for split in configs]


def share(removed: int, total: int) -> str:
    return f"{removed} / {total} = {100 * removed / max(1, total):.2f} %"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default="/work/scratch/bench/corpus/small.jsonl")
    parser.add_argument("--write", default=None, help="Markdown file whose section is replaced")
    args = parser.parse_args()

    now = profile_configs(QualityConfig())
    before = profile_configs(QualityConfig(profiles=BEFORE))
    round_1 = profile_configs(QualityConfig(profiles=ROUND_1))
    round_2 = profile_configs(QualityConfig(profiles=ROUND_2))
    sets = [("sample `generated`", "prose", sample_docs())]
    corpus = Path(args.corpus)
    if corpus.exists():
        sets.append((f"bench corpus `{corpus.name}`", "documentation", corpus_docs(corpus)))

    summary, details = [], []
    for name, profile, docs in sets:
        steps = [totals(docs, configs[profile]) for configs in (before, round_1, round_2, now)]
        for h in HALVES + ("all",):
            summary.append([name, profile, h] + [share(t[h]["good_removed"], t[h]["good"]) for t in steps]
                           + [share(t[h]["junk_removed"], t[h]["junk"]) for t in steps])
        details += [f"### {name}, {profile} profile: every rule evaluated", "",
                    markdown_table(["rule", "good failing (A)", "good failing (B)", "junk failing", "junk failing only this rule"], per_rule(docs, now[profile])), ""]
        kept = junk_kept(docs, now[profile], round_2[profile])
        if kept:
            details += [f"Junk the {profile} profile keeps ({len(kept)}), and what round 2 removed it for:", "",
                        markdown_table(["id", "half", "label", "words (identifier names)", "round 2"], kept), ""]
    if corpus.exists():
        texts = [doc["text"] for doc in sets[-1][2]]
        details += ["### Cost of the documentation profile's word count", "",
                    f"Bench corpus, {len(texts)} documents, mean {sum(map(len, texts)) / len(texts):,.0f} characters; wall-clock microseconds per "
                    f"document on this loaded machine, best of {TIMING_ROUNDS} interleaved rounds (whole profile: every rule evaluated, first "
                    f"{WHOLE_PROFILE_DOCS:,} documents).", "",
                    markdown_table(["word_split", "word count, us/doc", "whole documentation profile, us/doc"], word_split_cost(texts, now["documentation"])), ""]

    out = [SECTION, "", f"Date {datetime.date.today().isoformat()}, machine {platform.machine()} {platform.system()} "
           f"({len(os.sched_getaffinity(0))} cores). `python bench/clean_prose.py --write docs/benchmarks.md`. Halves: xxh64(id) % 2; "
           "profile changes were decided on half A. Good = clean + exact/near copies; junk = navigation, spam, repeated_line, short. "
           "Before = the profiles before issue 16 part 3; round 1 = after its first round (whitespace words; C4 sentences and duplicated "
           "n-grams removing); round 2 = after its second (stop words removing, 50-word floor); now = the defaults (docs/quality.md, "
           "'Clean prose kept').", "",
           markdown_table(["labelled set", "profile", "half", "good removed before", "round 1", "round 2", "now",
                           "junk caught before", "round 1", "round 2", "now"], summary), ""]
    out += details
    return publish(out, SECTION, args.write)


if __name__ == "__main__":
    raise SystemExit(main())
