#!/usr/bin/env python
"""Speed and agreement: HyMo's quality stage vs datatrove's Gopher/C4/FineWeb chain on the same documents.

  python bench/filters.py [--corpus /work/scratch/bench/corpus/small.jsonl] [--workers 2] [--write docs/benchmarks.md]

Both sides run in this one invocation on the same shards: datatrove in a
subprocess with its own venv (--datatrove-python; never installed into HyMo's),
HyMo in-process. Reported: docs/s of each chain with the same worker count,
per-family docs/s on one core, and per rule family how often the two keep/drop
decisions agree (definitions that differ are listed in docs/quality.md).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.report import markdown_table  # noqa: E402

from manifests.schema import docs_table  # noqa: E402
from tasks.filters.quality import evaluate, run_quality, whitespace_rules
from tasks.filters.quality_config import QualityConfig
from tasks.runner.stage_runner import StageWriter  # noqa: E402

SECTION = "## Quality stages: speed vs datatrove"
FAMILIES = {
    "gopher_quality": lambda name: name.startswith("gopher_") and not name.startswith(("gopher_duplicate_", "gopher_top_")),
    "gopher_repetition": lambda name: name.startswith(("gopher_duplicate_", "gopher_top_")),
    "c4": lambda name: name.startswith("c4_"),
    "fineweb": lambda name: name.startswith("fineweb_"),
}


def family_config(base: QualityConfig, family: str) -> QualityConfig:
    names = [rule.__name__ for rule in whitespace_rules(base, "en")] + ["c4_line_filter"]
    return replace(base, skip_rules=tuple(n for n in names if not FAMILIES[family](n)), profiles={})


def load_corpus(path: Path, limit: int | None) -> list[dict]:
    rows = []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                record = json.loads(line)
                rows.append({"id": str(record["id"]), "text": record["text"]})
                if limit and len(rows) >= limit:
                    break
    return rows


def write_shards(rows: list[dict], shards: int, jsonl_dir: Path, stage_dir: Path) -> None:
    """The same documents as datatrove JSONL shards and as a published HyMo stage (its input)."""
    jsonl_dir.mkdir(parents=True, exist_ok=True)
    writer = StageWriter("langid", "bench", {}, "bench", [], stage_dir)
    for index in range(shards):
        part = rows[index::shards]
        (jsonl_dir / f"part-{index:05d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part), encoding="utf-8")
        writer.write_shard(index, docs_table([{**r, "source": "bench", "url": "", "lang": "en", "lang_score": 1.0, "meta": {}} for r in part]), [])
    writer.publish()




def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default="/work/scratch/bench/corpus/small.jsonl")
    parser.add_argument("--datatrove-python", default="/work/scratch/bench/venv/bin/python")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--write", default=None)
    args = parser.parse_args()

    rows = load_corpus(Path(args.corpus), args.limit)
    config = QualityConfig()
    tmp = Path(tempfile.mkdtemp(prefix="hymo-bench-filters-"))
    write_shards(rows, args.shards, tmp / "jsonl", tmp / "03_langid")

    # datatrove first, alone on the machine, in its own venv.
    dt_out = tmp / "datatrove.json"
    subprocess.run([args.datatrove_python, str(Path(__file__).with_name("datatrove_filters_worker.py")), str(tmp / "jsonl"), str(dt_out),
                    "--workers", str(args.workers), "--work", str(tmp / "dt")], check=True)
    datatrove = json.loads(dt_out.read_text())

    started = time.perf_counter()
    manifest = run_quality(config, tmp / "03_langid", tmp / "04_quality", workers=args.workers)
    stage_s = time.perf_counter() - started

    started = time.process_time()
    for row in rows:
        evaluate(row["text"], "en", config)
    one_core_s = time.process_time() - started

    ours: dict[str, dict[str, bool]] = {row["id"]: {} for row in rows}
    family_s: dict[str, float] = {}
    for family in FAMILIES:
        family_cfg = family_config(config, family)
        started = time.process_time()
        for row in rows:
            ours[row["id"]][family] = evaluate(row["text"], "en", family_cfg).keep
        family_s[family] = time.process_time() - started

    n = len(rows)
    chain_rate = n / datatrove["chain_wall_s"]
    stage_rate = n / stage_s
    cpu_ratio = datatrove["chain_cpu_s"] / one_core_s
    speed_rows = [
        [f"datatrove {datatrove['version']}", "Gopher quality → repetition → C4 → FineWeb, one process, CPU s (per document up to its first failing filter)",
         n, f"{datatrove['chain_cpu_s']:.1f}", f"{n / datatrove['chain_cpu_s']:.0f}"],
        ["HyMo quality", "evaluate(): all rules in the same order, one process, CPU s (stops at the first failing rule)", n, f"{one_core_s:.1f}", f"{n / one_core_s:.0f}"],
        [f"datatrove {datatrove['version']}", f"the same chain under LocalPipelineExecutor, {args.workers} workers, wall s (read + filters + write)",
         n, f"{datatrove['chain_wall_s']:.1f}", f"{chain_rate:.0f}"],
        ["HyMo quality", f"the stage via run_stage, {args.workers} workers, wall s (Parquet read + rules + C4 line edit + write + audit)", n, f"{stage_s:.1f}", f"{stage_rate:.0f}"],
    ]
    per_family = [[family, f"{n / datatrove['filter_cpu_s'][family]:.0f}", f"{n / family_s[family]:.0f}", f"{datatrove['filter_cpu_s'][family] / family_s[family]:.1f}x"]
                  for family in FAMILIES]

    agreement = []
    for family in FAMILIES:
        row_out = [family]
        for variant in (family, family + "_ws"):
            both_keep = both_drop = only_ours = only_dt = 0
            for row in rows:
                mine = ours[row["id"]][family]
                theirs = datatrove["decisions"][row["id"]][variant][0]
                both_keep += mine and theirs
                both_drop += (not mine) and (not theirs)
                only_ours += (not mine) and theirs
                only_dt += mine and (not theirs)
            row_out += [both_keep, both_drop, only_ours, only_dt, f"{100 * (both_keep + both_drop) / n:.1f} %"]
        agreement.append(row_out)

    import datetime
    import os
    import platform

    machine = f"{len(os.sched_getaffinity(0))}-core {platform.machine()} CPU (shared)"
    out = [SECTION, "", f"Date {datetime.date.today().isoformat()}, machine {machine}. `python bench/filters.py --write docs/benchmarks.md` on {args.corpus} "
           f"({n} real documentation pages, {args.shards} shards), both tools in the same run on the same documents, English, prose rule set.", "",
           "### Throughput", "", markdown_table(["tool", "what", "docs", "seconds", "docs/s"], speed_rows), "",
           f"**HyMo / datatrove: {cpu_ratio:.1f}x in CPU time per document; {stage_rate / chain_rate:.1f}x in wall time of the "
           f"{args.workers}-worker runs** (the machine is shared with other jobs, so wall times carry their load; the CPU-time figure does not).", "",
           "### Per rule family, one process, CPU time (each family alone on every document)", "",
           markdown_table(["family", "datatrove docs/s", "HyMo docs/s", "HyMo speed-up"], per_family), "",
           "### Decision agreement per family (each family alone on the original text)", "",
           "Left: datatrove as shipped (spaCy words). Right: the same datatrove filters given a whitespace word tokenizer and "
           "HyMo's sentence rule (bench/datatrove_filters_worker.py), i.e. with the definitions aligned where datatrove lets them be.", "",
           markdown_table(["family", "both keep", "both drop", "only HyMo drops", "only datatrove drops", "agreement",
                           "ws: both keep", "ws: both drop", "ws: only HyMo", "ws: only datatrove", "ws: agreement"], agreement), "",
           "Where the two disagree the definitions differ on purpose (whitespace words vs spaCy tokens, distinct case-folded stop words, "
           "bullet prefixes, n-gram character units, C4 sentence counting); see docs/quality.md, 'Definitions that differ from datatrove'.", ""]
    examples = ["Examples of remaining disagreements with aligned tokenisation (HyMo rule: value vs threshold | datatrove reason):", ""]
    texts = {row["id"]: row["text"] for row in rows}
    for family in FAMILIES:
        family_cfg = family_config(config, family)
        shown = 0
        for row in rows:
            mine = ours[row["id"]][family]
            theirs, reason = datatrove["decisions"][row["id"]][family + "_ws"]
            if mine != theirs and shown < 3:
                shown += 1
                failures = evaluate(texts[row["id"]], "en", family_cfg).failures
                ours_says = f"{failures[0].rule}: {failures[0].value:.4g} vs {failures[0].threshold:g}" if failures else "keep"
                examples.append(f"- {family} `{row['id']}`: HyMo {ours_says} | datatrove {'keep' if theirs else reason}")
    unique_top = short_docs = 0
    for row in rows:
        theirs, reason = datatrove["decisions"][row["id"]]["gopher_repetition_ws"]
        if ours[row["id"]]["gopher_repetition"] and not theirs and reason and reason.startswith("top_"):
            size = int(reason.split("_")[1])
            tokens = texts[row["id"]].split()
            most = max(Counter(tuple(tokens[i:i + size]) for i in range(len(tokens) - size + 1)).values())
            unique_top += most == 1
            short_docs += len(tokens) < config.min_words
    examples += ["", f"Of the documents only datatrove drops on a top-n-gram rule (aligned tokenisation), {unique_top} have a most frequent "
                 f"n-gram that occurs once (HyMo requires a repeat) and {short_docs} have fewer than {config.min_words} words, so in the chain "
                 "gopher_too_few_words removes them first."]
    out += examples + [""]
    print(f"kept by HyMo stage: {manifest.counts['kept']} / {n}; removed {manifest.counts['removed']}", file=sys.stderr)
    from bench.report import publish

    return publish(out, SECTION, args.write)


if __name__ == "__main__":
    raise SystemExit(main())
