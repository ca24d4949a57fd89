"""Lab 1 of seed 001, dedup section, on the bundled sample's `generated` source (or any labelled JSONL).

Prints markdown: MinHash estimate error against the exact Jaccard, candidate
pairs against all pairs, the Jaccard-bin table of empirical candidate rate
against 1-(1-s^r)^b, and precision/recall of dedup_exact + dedup_fuzzy at
thresholds 0.7 / 0.8 / 0.9 against the generator's labels.

    python bench/lab1_dedup.py [--input manifests/sample/generated.jsonl]

Labels: each record has label, source_id (id or url of the original), q and
true_jaccard, either in `meta` (the sample) or at top level (the bench
corpus). Truth at threshold t: exact copies and near copies whose labelled
true Jaccard is ≥ t; scoring is per duplicate family (which member is kept
does not matter), as in ../shared/bench/common.py.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from itertools import combinations
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from manifests.schema import docs_table  # noqa: E402
from tasks.dedup.exact import DedupExactConfig, run_dedup_exact  # noqa: E402
from tasks.dedup.fuzzy import DedupFuzzyConfig, run_dedup_fuzzy  # noqa: E402
from tasks.dedup.minhash import HashFamily, band_keys, candidate_probability, signatures  # noqa: E402
from tasks.dedup.shingles import TokenHashCache, batch_ngram_hashes, jaccard_of_sets, sorted_set, tokens  # noqa: E402
from tasks.runner.stage_runner import StageWriter, read_stage_audit  # noqa: E402

DEFAULT_INPUT = Path(__file__).resolve().parent.parent / "manifests" / "sample" / "generated.jsonl"
BIN_EDGES = [0, .4, .5, .6, .7, .8, .9, 1.000001]  # the seed's bins
THRESHOLDS = (0.7, 0.8, 0.9)


def load(path: Path) -> list[dict]:
    records = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            raw = json.loads(line)
            labels = raw.get("meta", raw)
            records.append({"id": raw.get("id") or raw["url"], "text": raw["text"], "label": labels.get("label"),
                            "source_id": labels.get("source_id"), "q": labels.get("q"), "true_jaccard": labels.get("true_jaccard")})
    return records


def truth_groups(records: list[dict], threshold: float) -> dict[str, set[str]]:
    groups: dict[str, set[str]] = {}
    for r in records:
        if r["label"] == "exact_copy" or (r["label"] == "near_copy" and (r["true_jaccard"] or 0) >= threshold):
            groups.setdefault(r["source_id"], {r["source_id"]}).add(r["id"])
    return groups


def score(removed: set[str], groups: dict[str, set[str]]) -> tuple[float, float, int, int]:
    """Per-family precision/recall: a family of size g needs g-1 removals; extra or outside removals are false."""
    member_of = {d: s for s, g in groups.items() for d in g}
    needed = sum(len(g) - 1 for g in groups.values())
    inside: dict[str, int] = {}
    outside = 0
    for d in removed:
        if d in member_of:
            inside[member_of[d]] = inside.get(member_of[d], 0) + 1
        else:
            outside += 1
    tp = sum(min(c, len(groups[s]) - 1) for s, c in inside.items())
    fp = outside + sum(max(0, c - (len(groups[s]) - 1)) for s, c in inside.items())
    return (tp / (tp + fp) if tp + fp else 1.0), (tp / needed if needed else 1.0), tp, fp


def publish(records: list[dict], out_dir: Path, shards: int = 4) -> Path:
    writer = StageWriter("ingest", "bench", {}, f"bench-{len(records)}", [], out_dir)
    for shard in range(shards):
        rows = [{"id": r["id"], "text": r["text"], "source": "bench", "url": r["id"], "lang": None, "lang_score": None, "meta": {}}
                for r in records[shard::shards]]
        writer.write_shard(shard, docs_table(rows), [])
    writer.publish()
    return out_dir


def removed_ids(stage_dir: Path) -> set[str]:
    return set(read_stage_audit(stage_dir).column("id").to_pylist())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    records = load(args.input)
    index_of = {r["id"]: i for i, r in enumerate(records)}
    near_pairs = [(index_of[r["source_id"]], i) for i, r in enumerate(records) if r["label"] == "near_copy" and r["source_id"] in index_of]

    cache = TokenHashCache()
    hashes, offsets = batch_ngram_hashes((tokens(r["text"]) for r in records), 5, cache)
    sets = [sorted_set(hashes[offsets[i]: offsets[i + 1]]) for i in range(len(records))]
    true_j = np.array([jaccard_of_sets(sets[a], sets[b]) for a, b in near_pairs])
    print(f"## Lab 1 dedup on `{args.input.name}` ({len(records)} documents, {len(near_pairs)} near-copy pairs)\n")
    print(f"Near-pair exact Jaccard (our shingles) range {true_j.min():.3f} .. {true_j.max():.3f}; "
          f"generator's labelled Jaccard differs by at most {max(abs(true_j[k] - (records[b]['true_jaccard'] or 0)) for k, (a, b) in enumerate(near_pairs)):.3f} "
          "(it shingles whitespace words, we shingle alphanumeric words with numbers folded)\n")

    for bands, rows in ((14, 8), (16, 8)):
        family = HashFamily.from_seed(bands * rows, 1)
        sig = signatures(hashes, offsets, family)
        estimated = np.array([(sig[a] == sig[b]).mean() for a, b in near_pairs])
        error = np.abs(estimated - true_j)
        keys = band_keys(sig, bands, rows)
        has_shingles = np.diff(offsets) > 0
        candidates: set[tuple[int, int]] = set()
        for band in range(bands):
            buckets: dict[int, list[int]] = {}
            for i in np.flatnonzero(has_shingles).tolist():
                buckets.setdefault(int(keys[band, i]), []).append(i)
            for members in buckets.values():
                candidates.update(combinations(members, 2))
        detected = np.array([(min(a, b), max(a, b)) in candidates for a, b in near_pairs])
        all_pairs = len(records) * (len(records) - 1) // 2
        print(f"### {bands} bands × {rows} rows ({bands * rows} hashes)\n")
        print(f"MinHash estimate vs exact Jaccard over {len(near_pairs)} pairs: mean abs error {error.mean():.4f}, max {error.max():.4f} "
              f"(ideal estimator: sd ≤ {np.sqrt(0.25 / (bands * rows)):.4f}). Candidate pairs {len(candidates)} of {all_pairs} possible "
              f"({len(candidates) / all_pairs:.2e}).\n")
        print("| Jaccard bin | pairs | empirical | theory mean |\n|---|---|---|---|")
        for lo, hi in zip(BIN_EDGES, BIN_EDGES[1:]):
            mask = (true_j >= lo) & (true_j < hi)
            if mask.any():
                theory = candidate_probability(true_j[mask], bands, rows).mean()
                print(f"| [{lo:.1f}, {min(hi, 1):.1f}] | {int(mask.sum())} | {detected[mask].mean():.3f} | {theory:.3f} |")
        print()

    print("### dedup_exact + dedup_fuzzy (14×8, verified) against the labels\n")
    print("| threshold | removed | families needing removal | precision | recall | removed outside the labelled families |\n|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        upstream = publish(records, Path(tmp) / "ingest")
        run_dedup_exact(DedupExactConfig(), upstream, Path(tmp) / "exact", args.workers)
        exact_removed = removed_ids(Path(tmp) / "exact")
        for threshold in THRESHOLDS:
            out = Path(tmp) / f"fuzzy-{threshold}"
            run_dedup_fuzzy(DedupFuzzyConfig(jaccard_threshold=threshold), Path(tmp) / "exact", out, args.workers)
            removed = exact_removed | removed_ids(out)
            groups = truth_groups(records, threshold)
            precision, recall, tp, fp = score(removed, groups)
            members = {d for g in groups.values() for d in g}
            outside = sorted(d for d in removed if d not in members)
            why = ", ".join(f"{records[index_of[d]]['label']} (labelled J {records[index_of[d]]['true_jaccard'] or 0:.3f})" for d in outside[:4])
            print(f"| {threshold:.1f} | {len(removed)} | {sum(len(g) - 1 for g in groups.values())} | {precision:.3f} | {recall:.3f} | {why or '-'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
