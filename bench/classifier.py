#!/usr/bin/env python
"""The quality classifier: junk precision/recall alone, heuristics alone, both; stage speed vs bare predict.

  python bench/classifier.py [--corpus /work/scratch/bench/corpus/small.jsonl] [--limit 2000] [--write docs/benchmarks.md]

Labelled documents: the sample's generated source (after ingest + extract;
clean, exact_copy, near_copy are good, navigation, spam, repeated_line, short
are junk) and the anchor bench corpus (same labels, documentation pages). A
document counts as removed by the heuristics when the quality rules of its
profile fail (sample: prose; bench corpus: documentation, its pages' profile),
by the classifier when P(hq) < the stage threshold, by both when either does.

Speed: CPU seconds on one core, on the bench corpus's documents, of
(a) bare `model.predict(one_line(text), k=2)` per document and (b) the whole
`quality_model` stage (Parquet read, scoring, meta update, audit, write) run
in-process with one worker, both with the same model.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.filters import load_corpus, write_shards  # noqa: E402
from bench.lab1_filters import extracted_docs  # noqa: E402
from bench.report import markdown_table, publish  # noqa: E402

from tasks.filters.fasttext_model import load_fasttext, one_line  # noqa: E402
from tasks.filters.quality import evaluate, profile_configs
from tasks.filters.quality_config import QualityConfig
from tasks.filters.quality_classifier import is_heldout, positive_scores  # noqa: E402
from tasks.filters.quality_model import QualityModelConfig, model_file, run_quality_model  # noqa: E402

SECTION = "## Quality classifier (bench/classifier.py)"
GOOD = ("clean", "exact_copy", "near_copy")
JUNK = ("navigation", "spam", "repeated_line", "short")


def scores_for(texts: list[str], model) -> list[float]:
    return positive_scores(model, texts).tolist()


def confusion(rows: list[dict], removed_key: str) -> list:
    removed = [r for r in rows if r[removed_key]]
    junk = [r for r in rows if r["label"] in JUNK]
    good = [r for r in rows if r["label"] in GOOD]
    junk_removed = sum(r["label"] in JUNK for r in removed)
    precision = junk_removed / len(removed) if removed else float("nan")
    return [len(removed), f"{precision:.3f}", f"{junk_removed / max(1, len(junk)):.3f}", f"{sum(r[removed_key] for r in good) / max(1, len(good)) * 100:.1f} %"]


def judge(rows: list[dict], model, quality: QualityConfig, threshold: float) -> None:
    for row, score in zip(rows, scores_for([r["text"] for r in rows], model)):
        row["score"] = score
        row["by_model"] = score < threshold
        row["by_rules"] = not evaluate(row["text"], "en", quality).keep
        row["by_both"] = row["by_model"] or row["by_rules"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default="/work/scratch/bench/corpus/small.jsonl")
    parser.add_argument("--limit", type=int, default=2000, help="bench-corpus documents (the first N)")
    parser.add_argument("--work", default="/tmp/hymo-lab1", help="ingest + extract of the sample (shared with bench/lab1_filters.py)")
    parser.add_argument("--write", default=None)
    args = parser.parse_args()

    stage_config = QualityModelConfig(enabled=True, sources=("*",), langs=("*",))
    model = load_fasttext(str(model_file(stage_config)))
    card = json.loads((model_file(stage_config).parent / "model.json").read_text())
    profiles = profile_configs(QualityConfig())

    sample = []
    for doc in extracted_docs(Path(args.work), 2):
        if doc["source"] == "generated":
            sample.append({"id": doc["id"], "text": doc["text"], "label": doc["meta"].get("label")})
    judge(sample, model, profiles["prose"], stage_config.threshold)
    heldout = [r for r in sample if r["label"] in GOOD or is_heldout(r["id"], card["train_config"]["heldout_fraction"])]

    corpus = [dict(r, label=r["label"]) for r in (json.loads(line) for line in Path(args.corpus).read_text(encoding="utf-8").splitlines()[: args.limit])]
    judge(corpus, model, profiles["documentation"], stage_config.threshold)

    header = ["documents", "removed by", "removed", "junk precision", "junk recall", "good removed"]
    rows = []
    for name, docs in (("sample `generated` (all; its junk was in the training negatives)", sample),
                       ("sample `generated`, junk held out from training only", heldout),
                       (f"bench corpus, first {len(corpus)} (documentation pages; unseen)", corpus)):
        for key, label in (("by_model", "classifier alone (P(hq) < 0.5)"), ("by_rules", "heuristics alone"), ("by_both", "both")):
            rows.append([f"{name}: {len(docs)}", label] + confusion(docs, key))

    # Speed on the bench corpus: bare predict vs the whole stage, one core, CPU seconds.
    texts = [r["text"] for r in corpus]
    started = time.process_time()
    for text in texts:
        model.predict(one_line(text), k=2)
    bare_s = time.process_time() - started
    tmp = Path(tempfile.mkdtemp(prefix="hymo-bench-classifier-"))
    write_shards(load_corpus(Path(args.corpus), args.limit), 4, tmp / "jsonl", tmp / "04_quality")
    started = time.process_time()
    run_quality_model(stage_config, tmp / "04_quality", tmp / "05_quality_model", workers=1)
    stage_s = time.process_time() - started
    n = len(texts)
    mean_kb = sum(len(t.encode()) for t in texts) / n / 1000
    speed = [["bare `model.predict(one_line(text), k=2)`, one call per document", n, f"{bare_s:.2f}", f"{n / bare_s:.0f}", "100 %"],
             ["`quality_model` stage, 1 worker (Parquet read, batched predict, meta, audit, write)", n, f"{stage_s:.2f}", f"{n / stage_s:.0f}",
              f"{100 * bare_s / stage_s:.0f} %"]]

    out = [SECTION, "", f"Date {datetime.date.today().isoformat()}, machine {platform.machine()} {platform.system()}, "
           f"`python bench/classifier.py --write docs/benchmarks.md`. Model: `manifests/models/quality-sample/model.bin` "
           f"(sha256 {card['sha256'][:12]}, dim {card['train_config']['dim']}, word bigrams, quantised; held out at training: "
           f"precision {card['heldout']['precision']:.3f}, recall {card['heldout']['recall']:.3f}, AUC {card['heldout']['auc']:.3f}).", "",
           "### Junk detection: classifier, heuristics, both", "",
           "Junk = navigation, spam, repeated_line, short; good = clean, exact_copy, near_copy. Heuristics: the quality rules of the "
           "documents' profile (sample: prose; bench corpus: documentation).", "",
           markdown_table(header, rows), "",
           "### Speed per core", "", f"Bench corpus documents, mean {mean_kb:.1f} KB; CPU seconds of this process.", "",
           markdown_table(["what", "docs", "CPU s", "docs/s/core", "of bare speed"], speed), ""]
    return publish(out, SECTION, args.write)


if __name__ == "__main__":
    raise SystemExit(main())
