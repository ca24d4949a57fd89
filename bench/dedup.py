"""dedup_exact + dedup_fuzzy against datatrove's 4-stage MinHash and plain datasketch MinHashLSH, in one run.

    python bench/dedup.py --scale small            # the 5k labelled workload
    python bench/dedup.py --scale large            # the 50k one
    python bench/dedup.py --scaling                # HyMo alone at 5k, 50k and a synthetic 500k
    python bench/dedup.py --signatures             # signature engines: numpy (ours) vs datasketch bulk

The workload and the other tools' runners are the anchor harness in
--bench-dir (../shared/bench copied to a scratch dir with its corpus and the
datatrove venv). datatrove and datasketch run there with --datatrove-python,
exactly as the harness measures them (its results JSON is read back); HyMo
runs in a child process of /work/venv measured the same way (/usr/bin/time -v
plus psutil sampling of the process tree). HyMo's input is the corpus as a
published stage of 8 Parquet shards, like datatrove's 8 JSONL shards,
written before timing starts. Scores use the harness's score_dedup (truth =
exact copies + near copies with true Jaccard ≥ 0.8, per duplicate family).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_BENCH_DIR = Path("/work/scratch/bench")
DEFAULT_DATATROVE_PYTHON = DEFAULT_BENCH_DIR / "venv" / "bin" / "python"
WORK = Path(os.environ.get("HYMO_BENCH_WORK", "/tmp/hymo-bench-dedup"))


def harness(bench_dir: Path):
    sys.path.insert(0, str(bench_dir))
    import common

    return common


# ------------------------------------------------------------------ child processes

def prepare_input(source: str, out_dir: Path, shards: int) -> None:
    """Write the corpus (a JSONL path, or synthetic:N) as a published stage of `shards` Parquet shards."""
    import numpy as np
    import pyarrow as pa

    from manifests.schema import DOC_SCHEMA
    from tasks.runner.stage_runner import StageWriter

    if source.startswith("synthetic:"):
        ids, texts = synthetic_corpus(int(source.split(":")[1]))
    else:
        ids, texts = [], []
        with open(source, encoding="utf-8") as handle:
            for line in handle:
                record = json.loads(line)
                ids.append(record["id"])
                texts.append(record["text"])
    if out_dir.exists():
        shutil.rmtree(out_dir)
    writer = StageWriter("ingest", "bench", {}, f"bench-{source}-{shards}", [], out_dir)
    for shard in range(shards):
        shard_ids, shard_texts = ids[shard::shards], texts[shard::shards]
        n = len(shard_ids)
        table = pa.table({"id": shard_ids, "text": shard_texts, "source": ["bench"] * n, "url": shard_ids,
                          "lang": pa.nulls(n, pa.string()), "lang_score": pa.nulls(n, pa.float32()), "meta": ["{}"] * n},
                         schema=DOC_SCHEMA)
        writer.write_shard(shard, table, [])
    writer.publish()
    del np


def synthetic_corpus(count: int, seed: int = 1234) -> tuple[list[str], list[str]]:
    """Random-word documents (~215 words, like the large set) with 5 % exact and 10 % lightly edited copies."""
    import numpy as np

    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = np.array(["".join(rng.choice(letters, size=rng.integers(3, 10))) for _ in range(30_000)])
    lengths = rng.integers(100, 330, size=count)
    word_ids = rng.integers(0, len(vocab), size=int(lengths.sum()))
    texts: list[str] = []
    start = 0
    kinds = rng.random(count)
    for i, length in enumerate(lengths.tolist()):
        if i > 100 and kinds[i] < 0.05:
            texts.append(texts[int(rng.integers(0, i))])
        elif i > 100 and kinds[i] < 0.15:
            words = texts[int(rng.integers(0, i))].split()
            edit = rng.random(len(words)) < 0.03
            texts.append(" ".join("river" if e else w for w, e in zip(words, edit.tolist())))
        else:
            texts.append(" ".join(vocab[word_ids[start: start + length]].tolist()))
        start += length
    return [f"syn-{i:07d}" for i in range(count)], texts


def rss_split_mb(pid: int | str) -> tuple[float, float]:
    """(anonymous, file-backed) resident MB of one process: file-backed pages (mapped files) are reclaimable."""
    values = {"RssAnon": 0, "RssFile": 0}
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                name = line.split(":")[0]
                if name in values:
                    values[name] = int(line.split()[1]) / 1024
    except OSError:  # the process ended between listing and reading
        pass
    return values["RssAnon"], values["RssFile"]


class RssSplitSampler:
    """Peak anonymous / file-backed RSS of this process (the global passes) and of its pool workers, every 50 ms."""

    def __init__(self) -> None:
        import threading

        self.peaks = {"parent_anon_mb": 0.0, "parent_file_mb": 0.0, "worker_anon_mb": 0.0, "worker_file_mb": 0.0, "tree_anon_mb": 0.0}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psutil

        me = psutil.Process()
        while not self.stop.wait(0.05):
            anon, file = rss_split_mb("self")
            workers = [rss_split_mb(child.pid) for child in me.children(recursive=True)]
            for key, value in (("parent_anon_mb", anon), ("parent_file_mb", file), ("tree_anon_mb", anon + sum(w[0] for w in workers)),
                               ("worker_anon_mb", max((w[0] for w in workers), default=0.0)),
                               ("worker_file_mb", max((w[1] for w in workers), default=0.0))):
                self.peaks[key] = max(self.peaks[key], value)

    def __enter__(self) -> "RssSplitSampler":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def hymo_worker(upstream: Path, workdir: Path, workers: int, result: Path) -> None:
    """Child: time dedup_exact then dedup_fuzzy on a published stage; write removed ids, stage stats, anon/file RSS peaks."""
    from tasks.runner.stage_runner import read_stage_audit

    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    with RssSplitSampler() as sampler:
        timings = run_both_stages(upstream, workdir, workers)
    removed = read_stage_audit(workdir / "exact").column("id").to_pylist() + read_stage_audit(workdir / "fuzzy").column("id").to_pylist()
    result.write_text(json.dumps({**timings, "rss_split": sampler.peaks, "removed_ids": removed}))


def run_both_stages(upstream: Path, workdir: Path, workers: int) -> dict:
    from tasks.dedup.exact import DedupExactConfig, run_dedup_exact
    from tasks.dedup.fuzzy import DedupFuzzyConfig, run_dedup_fuzzy

    started = time.perf_counter()
    exact = run_dedup_exact(DedupExactConfig(), upstream, workdir / "exact", workers)
    exact_done = time.perf_counter()
    fuzzy = run_dedup_fuzzy(DedupFuzzyConfig(), workdir / "exact", workdir / "fuzzy", workers)
    finished = time.perf_counter()
    return {"seconds": finished - started, "exact_seconds": exact_done - started, "fuzzy_seconds": finished - exact_done,
            "exact": exact.extra.get("context", {}), "fuzzy": fuzzy.extra.get("context", {})}


# ------------------------------------------------------------------ runners

def run_hymo(common, source: str, label: str, workers: int, shards: int) -> dict:
    upstream = WORK / f"input-{label}"
    from manifests.stage_manifest import is_complete

    if not is_complete(upstream, verify=False):  # inputs are deterministic: reuse the one written last time
        subprocess.run([sys.executable, __file__, "--prepare-input", source, "--out", str(upstream), "--shards", str(shards)], check=True)
    result = WORK / f"hymo-{label}.json"
    measured = common.run_measured([sys.executable, __file__, "--hymo-worker", str(upstream), "--out", str(WORK / f"run-{label}"),
                                    "--workers", str(workers), "--result", str(result)], result_file=result)
    shutil.rmtree(WORK / f"run-{label}", ignore_errors=True)
    return measured


def run_harness_tool(bench_dir: Path, python: str, script: str, scale: str, extra: list[str]) -> dict:
    subprocess.run([python, str(bench_dir / script), "--scale", scale, *extra], check=True, cwd=bench_dir)
    tool = script.removeprefix("bench_").removesuffix(".py")
    return json.loads((bench_dir / "results" / f"{tool}_{scale}.json").read_text())


def row_named(payload: dict, stage: str) -> dict:
    return next(row for row in payload["rows"] if row["stage"] == stage)


def compare(args: argparse.Namespace) -> int:
    common = harness(args.bench_dir)
    labels = common.load_labels(args.scale)
    rows = []
    if not args.skip_datatrove:
        payload = run_harness_tool(args.bench_dir, args.datatrove_python, "bench_datatrove.py", args.scale,
                                   ["--repeats", str(args.repeats), "--stages", "mh1,mh2,mh3,mh4"])
        total = row_named(payload, "minhash dedup total (4 stages)")
        rows.append(("datatrove 4-stage MinHash (2 workers)", total["seconds"]["median"], total["tree_peak_mb"]["median"],
                     total["precision"], total["recall"], "no verification"))
    if not args.skip_datasketch:
        payload = run_harness_tool(args.bench_dir, args.datatrove_python, "bench_datasketch.py", args.scale,
                                   ["--repeats", str(args.repeats), "--variants", "bulk_lean"])
        total = row_named(payload, "[bulk_lean] TOTAL shingle+sig+index+query (14x8)")
        verify = row_named(payload, "[bulk_lean]   + verify est. J>=0.8 (14x8)")
        rows.append(("datasketch bulk MinHash + MinHashLSH 14×8 (1 core)", total["seconds"]["median"], total["tree_peak_mb"]["median"],
                     total["precision"], total["recall"], "no verification"))
        rows.append(("datasketch, + estimated-J ≥ 0.8 check", total["seconds"]["median"] + verify["seconds"]["median"],
                     total["tree_peak_mb"]["median"], verify["precision"], verify["recall"], "signature estimate, not exact"))
    hymo_runs = [run_hymo(common, str(common.corpus_path(args.scale)), f"{args.scale}-{rep}", args.workers, 8) for rep in range(args.repeats)]
    hymo_seconds = sorted(r["worker"]["seconds"] for r in hymo_runs)[len(hymo_runs) // 2]
    last = hymo_runs[-1]
    score = common.score_dedup(set(last["worker"]["removed_ids"]), labels)
    rows.append((f"HyMo dedup_exact + dedup_fuzzy ({args.workers} workers)", hymo_seconds,
                 sorted(r["tree_peak_rss_mb"] for r in hymo_runs)[len(hymo_runs) // 2], score["precision"], score["recall"], "exact Jaccard verified"))
    print(f"\n### {args.scale}: {len(labels)} documents, {score['needed_removals']} removals needed "
          f"(date {time.strftime('%Y-%m-%d')}, 2-core x86_64 CPU, median of {args.repeats})\n")
    print("| tool | seconds | peak MB (process tree) | precision | recall | note |\n|---|---|---|---|---|---|")
    for name, seconds, peak, precision, recall, note in rows:
        print(f"| {name} | {seconds:.1f} | {peak:.0f} | {precision:.3f} | {recall:.3f} | {note} |")
    if not args.skip_datatrove:
        print(f"\nHyMo vs datatrove: {rows[0][1] / hymo_seconds:.1f}× faster.")
    fuzzy = last["worker"]["fuzzy"]
    print(f"HyMo stages: exact {last['worker']['exact_seconds']:.1f} s, fuzzy {last['worker']['fuzzy_seconds']:.1f} s "
          f"(signatures {fuzzy['signature_seconds']} s, candidates+verification+clusters {fuzzy['candidate_and_cluster_seconds']} s); "
          f"candidate pairs {fuzzy['candidate_pairs']}, verified {fuzzy['verified_pairs']}, rejected {fuzzy['rejected_pairs']}; "
          f"FP by label {json.dumps(score['fp_by_label'])}")
    return 0


def scaling(args: argparse.Namespace) -> int:
    common = harness(args.bench_dir)
    cases = [("5k", str(common.corpus_path("small")), 8), ("50k", str(common.corpus_path("large")), 8),
             (f"synthetic {args.synthetic // 1000}k", f"synthetic:{args.synthetic}", 32)]
    print(f"\n### Scaling (HyMo dedup_exact + dedup_fuzzy, {args.workers} workers, {time.strftime('%Y-%m-%d')}, 2-core x86_64 CPU)\n")
    print("| corpus | documents | shingles | seconds | µs / shingle | peak MB (process tree) | largest process MB | "
          "parent anon / file MB | largest worker anon MB |\n|---|---|---|---|---|---|---|---|---|")
    for label, source, shards in cases:
        measured = run_hymo(common, source, label.replace(" ", "-"), args.workers, shards)
        worker = measured["worker"]
        docs = worker["fuzzy"]["documents"] + worker["exact"]["removed"]
        shingles = worker["fuzzy"]["shingles"]
        split = worker["rss_split"]
        print(f"| {label} | {docs} | {shingles:,} | {worker['seconds']:.1f} | {worker['seconds'] / shingles * 1e6:.2f} | "
              f"{measured['tree_peak_rss_mb']:.0f} | {measured['max_single_proc_rss_mb']:.0f} | "
              f"{split['parent_anon_mb']:.0f} / {split['parent_file_mb']:.0f} | {split['worker_anon_mb']:.0f} |", flush=True)
    return 0


def signature_engines(args: argparse.Namespace) -> int:
    """Same shingle sets, one core: datasketch MinHash.bulk vs our numpy multiply-shift signatures."""
    import numpy as np
    from datasketch import MinHash

    from tasks.dedup.minhash import HashFamily, signatures
    from tasks.dedup.shingles import TokenHashCache, batch_ngram_hashes, tokens

    common = harness(args.bench_dir)
    texts = [r["text"] for r in common.load_corpus(args.scale)]
    toks = [tokens(t) for t in texts]
    started = time.perf_counter()
    hashes, offsets = batch_ngram_hashes(toks, 5, TokenHashCache())
    hashed = time.perf_counter()
    signatures(hashes, offsets, HashFamily.from_seed(112, 1))
    numpy_done = time.perf_counter()
    shingle_bytes = [[" ".join(t[i:i + 5]).encode() for i in range(len(t) - 4)] for t in toks]
    bytes_done = time.perf_counter()
    MinHash.bulk([s for s in shingle_bytes if s], num_perm=112)
    bulk_done = time.perf_counter()
    print(f"\n### Signature engines, {args.scale} ({len(texts)} docs, {int(offsets[-1])} shingles, 112 hashes, 1 core)\n")
    print("| engine | shingle → hash input (s) | signatures (s) | total (s) |\n|---|---|---|---|")
    print(f"| numpy multiply-shift over 64-bit shingle hashes (HyMo) | {hashed - started:.2f} | {numpy_done - hashed:.2f} | {numpy_done - started:.2f} |")
    print(f"| datasketch MinHash.bulk over shingle strings | {bytes_done - numpy_done:.2f} | {bulk_done - bytes_done:.2f} | {bulk_done - numpy_done:.2f} |")
    del np
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", default="small", choices=["small", "large"])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--bench-dir", type=Path, default=DEFAULT_BENCH_DIR)
    parser.add_argument("--datatrove-python", default=str(DEFAULT_DATATROVE_PYTHON))
    parser.add_argument("--skip-datatrove", action="store_true")
    parser.add_argument("--skip-datasketch", action="store_true")
    parser.add_argument("--scaling", action="store_true")
    parser.add_argument("--synthetic", type=int, default=500_000)
    parser.add_argument("--signatures", action="store_true")
    # child modes
    parser.add_argument("--prepare-input")
    parser.add_argument("--hymo-worker", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--result", type=Path)
    args = parser.parse_args(argv)
    if args.prepare_input:
        prepare_input(args.prepare_input, args.out, args.shards)
        return 0
    if args.hymo_worker:
        hymo_worker(args.hymo_worker, args.out, args.workers, args.result)
        return 0
    WORK.mkdir(parents=True, exist_ok=True)
    if args.signatures:
        return signature_engines(args)
    if args.scaling:
        return scaling(args)
    return compare(args)


if __name__ == "__main__":
    sys.exit(main())
