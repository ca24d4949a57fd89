"""The data half (ingest → shards) at growing document counts: wall time, peak memory, bytes on disk per stage.

    python bench/scale.py --docs 100000 300000 1000000 [--workers 2] [--reuse] [--include OTHER_WORK_DIR] [--no-write]

The corpus is synthetic but keeps real word statistics: unigram frequencies
and document lengths are read from --word-source (the anchor harness's
labelled documentation corpus by default, so the source is declared with the
documentation profile), document lengths are the source's page lengths times
--length-scale (default 1/4: about 260 words, section-sized like the harness's
large.jsonl and like extracted web pages), documents are drawn from them, a paragraph ends after
a sentence-final word with probability 1/4, and 10 % are near copies (3 % of
words replaced) of a recent document. It is written as one
JSONL source, streamed, never held in memory. Each size runs every stage up
to `shards` in a fresh child process (the stage functions in a plain loop, as
bench/orchestration.py's "plain" side) while a sampler records the peak RSS of
the whole process tree and of its largest process, and the tree's CPU
seconds, every 100 ms. `--reuse` takes a size's stored result when it ran on
the same commit with the same settings (a 1M run is long; sizes can run apart).
Writes a table and docs/scale.png, and a section of docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

WORK = Path(os.environ.get("HYMO_BENCH_WORK", "/tmp/hymo-bench-scale"))
DEFAULT_WORD_SOURCE = Path("/work/scratch/bench/corpus/small.jsonl")
TITLE = "Data half at scale (`python bench/scale.py`)"
NEAR_COPY_SHARE, EDIT_RATE, RECENT = 0.10, 0.03, 4096
PARAGRAPH_END = 0.25  # chance that a word ending a sentence also ends a paragraph


def word_statistics(path: Path, docs: int = 20_000) -> tuple[list[str], list[float], list[int]]:
    """(words, their frequencies, document lengths in words) of the first `docs` documents of a JSONL corpus."""
    counts: Counter[str] = Counter()
    lengths = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle):
            if number >= docs:
                break
            words = json.loads(line)["text"].split()
            counts.update(words)
            lengths.append(len(words))
    words, freq = zip(*counts.most_common())
    total = sum(freq)
    return list(words), [f / total for f in freq], lengths


def paragraphs(words: list[str], rng) -> str:
    """Words joined by spaces, with a newline instead after some sentence-final words (pages have paragraphs)."""
    breaks = (rng.random(len(words)) < PARAGRAPH_END).tolist()
    return "".join(w + ("\n" if b and w.endswith((".", "!", "?")) else " ") for w, b in zip(words, breaks)).rstrip()


def write_corpus(path: Path, count: int, word_source: Path, seed: int = 1234, chunk: int = 10_000, length_scale: float = 0.25) -> None:
    """`count` documents as JSONL, written a chunk at a time; 10 % near copies of a recent document."""
    import numpy as np

    words, freq, lengths = word_statistics(word_source)
    vocab, probabilities = np.array(words, dtype=object), np.array(freq)  # object: one long word must not widen every cell
    rng = np.random.default_rng(seed)
    recent: list[list[str]] = []
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        for start in range(0, count, chunk):
            size = min(chunk, count - start)
            doc_lengths = np.maximum(1, np.round(rng.choice(lengths, size=size) * length_scale)).astype(np.int64)
            drawn = vocab[rng.choice(len(vocab), size=int(doc_lengths.sum()), p=probabilities)].tolist()
            copies = rng.random(size) < NEAR_COPY_SHARE
            offset = 0
            for i in range(size):
                doc = drawn[offset: offset + int(doc_lengths[i])]
                offset += int(doc_lengths[i])
                if copies[i] and recent:
                    source = recent[int(rng.integers(0, len(recent)))]
                    edits = rng.random(len(source)) < EDIT_RATE
                    doc = [vocab[int(rng.integers(0, len(vocab)))] if e else w for w, e in zip(source, edits.tolist())]
                recent.append(doc)
                if len(recent) > RECENT:
                    recent.pop(int(rng.integers(0, RECENT)))
                handle.write(json.dumps({"text": paragraphs(doc, rng), "url": f"https://synthetic.example/{start + i}"}) + "\n")
    tmp.replace(path)


def write_config(root: Path, corpus: Path, workers: int) -> Path:
    spec = root / "synthetic.toml"
    spec.write_text("\n".join([
        'name = "synthetic"', 'kind = "jsonl"', f'path = "{corpus}"', 'origin = "bench/scale.py"',
        'snapshot = "generated"', 'license = "CC0-1.0"', 'profile = "documentation"']) + "\n", encoding="utf-8")
    config = root / "pipeline.toml"
    config.write_text(f'[run]\nsources = ["{spec}"]\nworkers = {workers}\n\n[quality_model]\nenabled = false\n', encoding="utf-8")
    return config


class TreeSampler:
    """Peak RSS of this process tree and of its largest process, and the tree's CPU seconds, every 100 ms.

    CPU seconds (user + system, summed over every process seen) are what a
    stage costs whatever else the machine runs; wall seconds stretch with the
    load. A process that exits between two samples loses at most 100 ms.
    """

    def __init__(self) -> None:
        import psutil

        self.tree_mb = self.largest_mb = 0.0
        self.me = psutil.Process()
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def sample(self) -> None:
        import psutil

        sizes = []
        for process in [self.me, *self.me.children(recursive=True)]:
            try:
                with process.oneshot():
                    sizes.append(process.memory_info().rss / 2**20)
                    times = process.cpu_times()
                    self.last[process.pid] = times.user + times.system
            except psutil.Error:
                pass
        self.tree_mb, self.largest_mb = max(self.tree_mb, sum(sizes)), max(self.largest_mb, max(sizes, default=0.0))

    def run(self) -> None:
        while not self.stop.wait(0.1):
            self.sample()

    @property
    def cpu_seconds(self) -> float:
        return sum(cpu - self.first.get(pid, 0.0) for pid, cpu in self.last.items())

    def __enter__(self) -> "TreeSampler":
        self.sample()
        self.first = dict(self.last)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        self.sample()


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def child(config_path: Path, run: Path, result: Path) -> None:
    """Every stage up to `shards`, in order, timed and sampled one stage at a time."""
    from flows.config import load_config
    from flows.stages import pipeline_stages, previous_stage_path, stage_path
    from tasks.runner.stage_runner import shutdown_worker_pools

    config = load_config(config_path)
    rows = []
    for entry in pipeline_stages(config):
        if entry.name == "pretrain":
            break
        out = stage_path(run, entry.name, config)
        with TreeSampler() as sampler:
            started = time.perf_counter()
            entry.run(config, run, previous_stage_path(run, entry.name, config), out)
            seconds = time.perf_counter() - started
        rows.append({"stage": entry.name, "seconds": seconds, "cpu_seconds": sampler.cpu_seconds, "tree_mb": sampler.tree_mb,
                     "largest_mb": sampler.largest_mb, "bytes": dir_bytes(out), "load": os.getloadavg()[0]})
        result.write_text(json.dumps(rows))
    shutdown_worker_pools()


def plot(results: dict[int, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(results)
    figure, axes = plt.subplots(1, 3, figsize=(15, 4))
    for stage in [row["stage"] for row in results[sizes[0]]]:
        for axis, key, scale in ((axes[0], "seconds", 1), (axes[1], "largest_mb", 1), (axes[2], "bytes", 2**-20)):
            axis.plot(sizes, [next(r[key] for r in results[n] if r["stage"] == stage) * scale for n in sizes], marker="o", label=stage)
    for axis, label in zip(axes, ("wall seconds", "largest process MB", "MB on disk")):
        axis.set_xlabel("documents")
        axis.set_ylabel(label)
        axis.set_xscale("log")
        axis.set_yscale("log")
    axes[2].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, nargs="+", default=[100_000, 300_000, 1_000_000])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--word-source", type=Path, default=DEFAULT_WORD_SOURCE)
    parser.add_argument("--length-scale", type=float, default=0.25, help="document length = a word-source page's length times this")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--reuse", action="store_true", help="take a size's stored result when it ran on this same commit with the same settings")
    parser.add_argument("--include", action="append", default=[], type=Path,
                        help="also show every stored size under this work directory (e.g. a 1M run on an earlier commit)")
    parser.add_argument("--child", type=Path)
    parser.add_argument("--run", type=Path)
    parser.add_argument("--result", type=Path)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.run, args.result)
        return 0
    from bench.report import write_section

    commit = code_commit()
    results: dict[int, list[dict]] = {}
    runs: dict[int, dict] = {}
    for count in args.docs:
        root = WORK / f"{count}"
        meta = {"docs": count, "length_scale": args.length_scale, "workers": args.workers, "word_source": str(args.word_source), "commit": commit}
        if args.reuse and (root / "run.json").exists() and json.loads((root / "run.json").read_text())["meta"] == meta:
            runs[count] = json.loads((root / "run.json").read_text())
            results[count] = json.loads((root / "result.json").read_text())
            print(f"{count} documents: reused the run of {runs[count]['date']} on {commit}", flush=True)
            continue
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        corpus = root / "synthetic.jsonl"
        write_corpus(corpus, count, args.word_source, length_scale=args.length_scale)
        config = write_config(root, corpus, args.workers)
        result = root / "result.json"
        load_start, started = os.getloadavg()[0], time.perf_counter()
        subprocess.run([sys.executable, __file__, "--child", str(config), "--run", str(root / "run"), "--result", str(result)], check=True)
        results[count] = json.loads(result.read_text())
        runs[count] = {"meta": meta, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_start": load_start,
                       "load_end": os.getloadavg()[0], "seconds": time.perf_counter() - started}
        (root / "run.json").write_text(json.dumps(runs[count]))
        print(f"{count} documents: {runs[count]['seconds']:.0f} s, load {load_start:.1f} -> {runs[count]['load_end']:.1f}", flush=True)
        shutil.rmtree(root / "run", ignore_errors=True)
        corpus.unlink()
    columns = [(runs[n]["meta"]["commit"], n, results[n], runs[n]) for n in sorted(results)]
    for directory in args.include:
        for root in sorted(Path(directory).iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1):
            if (root / "run.json").exists() and (root / "result.json").exists():
                stored = json.loads((root / "run.json").read_text())
                columns.append((stored["meta"]["commit"], stored["meta"]["docs"], json.loads((root / "result.json").read_text()), stored))
    table = scale_table(columns)
    loads = "; ".join(f"{n:,} at {c}: {r['date']}, load {r['load_start']:.1f} -> {r['load_end']:.1f}" for c, n, _, r in columns)
    note = (f"x86_64 with {os.cpu_count()} CPUs, {args.workers} workers; synthetic documents with the word statistics of "
            f"{args.word_source.name} (page lengths x {args.length_scale:g}, documentation profile, paragraphs), 10 % near copies. "
            f"Runs ({loads}). Cells: wall s / CPU s of the process tree / largest process / bytes on disk; a column's per-document "
            f"cost is compared with the smallest size run on the same code. CPU seconds are the cost measure when runs saw different "
            f"loads (wall stretches with the load, CPU much less). Plot (this invocation's runs): docs/scale.png.")
    print(f"\n{note}\n\n{table}")
    if not args.no_write:
        plot(results, REPO / "docs" / "scale.png")
        write_section(TITLE, table, note)
    return 0


def code_commit() -> str:
    """The checked-out commit, marked when the tree has local changes: a reused run must come from the same code."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    return head + ("+changes" if dirty else "")


def scale_table(columns: list[tuple[str, int, list[dict], dict]]) -> str:
    """Per stage and (code, size): wall / CPU / largest process / on disk; totals; per-document cost against the
    smallest size run on the same code."""
    from bench.report import markdown_table

    rows = []
    for stage in [row["stage"] for row in columns[0][2]]:
        cells = [next((r for r in rows_of if r["stage"] == stage), None) for _, _, rows_of, _ in columns]
        rows.append((stage, *("-" if c is None else f"{c['seconds']:.1f} s / {c.get('cpu_seconds', float('nan')):.1f} s / "
                              f"{c['largest_mb']:.0f} MB / {c['bytes'] / 2**20:.1f} MB" for c in cells)))
    wall = [sum(r["seconds"] for r in rows_of) / n for _, n, rows_of, _ in columns]
    cpu = [sum(r.get("cpu_seconds", float("nan")) for r in rows_of) / n for _, n, rows_of, _ in columns]
    rows.append(("all stages", *(f"{w * n:.0f} s ({w * 1e6:.0f} µs/doc) / {c * n:.0f} s ({c * 1e6:.0f} µs/doc) / "
                                 f"{max(r['largest_mb'] for r in rows_of):.0f} MB largest, {max(r['tree_mb'] for r in rows_of):.0f} MB tree / "
                                 f"{sum(r['bytes'] for r in rows_of) / 2**30:.2f} GB" for w, c, (_, n, rows_of, _) in zip(wall, cpu, columns))))
    ratios = []
    for commit, n, _, _ in columns:
        base = min(i for i, (other, m, _, _) in enumerate(columns) if other == commit and m == min(k for o, k, _, _ in columns if o == commit))
        i = next(i for i, (other, m, _, _) in enumerate(columns) if other == commit and m == n)
        ratios.append(f"wall {wall[i] / wall[base]:.2f}x, CPU {cpu[i] / cpu[base]:.2f}x vs {columns[base][1]:,}")
    rows.append(("per-document cost", *ratios))
    return markdown_table(["stage", *(f"{n:,} docs @{commit}: wall / CPU / largest / on disk" for commit, n, _, _ in columns)], rows)


if __name__ == "__main__":
    sys.exit(main())
