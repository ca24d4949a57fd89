"""The data half (ingest → shards) at growing document counts, through the distributed path: wall, CPU, memory per process, files and bytes per stage, and a cost model.

    python bench/scale.py --docs 100000 300000 1000000 [--workers 2] [--path flow|loop] [--reuse] [--keep-run] [--include OTHER_WORK_DIR] [--no-write]
    python bench/scale.py --docs 50000 --shard-sweep 0 800000 80000   # flow-host memory against the number of shards

The corpus is synthetic but keeps real word statistics: unigram frequencies
and document lengths are read from --word-source (by default the sample's
generated.jsonl, which ships in the repo: 626 English pages, 465 words on
average; the synthetic source is declared with the documentation profile),
document lengths are the source's page lengths times --length-scale (default
1/2: about 230 words, section-sized like extracted web pages), documents are
drawn from them, a paragraph ends after
a sentence-final word with probability 1/4, and 10 % are near copies (3 % of
words replaced) of a recent document. It is written as one
JSONL source, streamed, never held in memory.

Each size runs in a fresh child process. `--path flow` (the default) is what a
cluster user runs: a real Prefect server (`prefect server start`, its own
process), a Dask LocalCluster of --workers worker processes (one thread each),
and one Prefect flow run per stage (`hymo_pipeline(until=ingest)`, then
`hymo_stage(stage=S, until=S)` for each later stage: the re-run-one-stage path),
each with `--runner dask --dask-address` of that cluster, so every per-shard
pass runs as a Dask task in a worker process. `--path loop` calls the stage
functions in a plain loop with the process pool (bench/orchestration.py's
"plain" side). Each stage's flow runs in a fresh process and the workers are restarted
before it, so a stage's peak memory is its own. A sampler records, every
100 ms, the RSS of every process in the tree by role (the stage's flow host;
the bench child, which holds the Dask scheduler and nannies; the Prefect
server; the Dask workers) and their CPU seconds.
`--reuse` takes a size's stored result when it ran on the same commit with the
same settings (a 1M run is long; sizes can run apart).

The cost model fits each stage's CPU seconds, on the flow host (serial) and on
the workers (parallel), to fixed + per-document terms from the sizes run on the
same code, checks the per-document (marginal) cost for growth with N, and
extrapolates to 100M and 1B documents on 64 and 512 workers: time = host
CPU + worker CPU / workers (perfect scaling of the workers' part: a lower bound),
memory = the flow host's peak and the largest worker's peak, each fitted as
fixed + bytes per document.
Writes the tables and docs/scale.png, and a section of docs/benchmarks.md.
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
# Run as a script, bench/ is sys.path[0], where bench/distributed.py would shadow the `distributed` package.
sys.path[:] = [str(REPO)] + [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"]

from bench.process_tree import tree_pids, usage  # noqa: E402  (after the path fix)

WORK = Path(os.environ.get("HYMO_BENCH_WORK", "/tmp/hymo-bench-scale"))
DEFAULT_WORD_SOURCE = REPO / "manifests" / "sample" / "generated.jsonl"  # in the repo: a fresh clone can run the bench
TITLE = "Data half at scale (`python bench/scale.py`)"
# The largest spread of one stage's flow-host peak between shard layouts of the same 50,000 documents (quality,
# 265-314 MB, shard sweep on 6ec633c): a smaller rise between two sizes is not read as a per-document term.
RSS_RESOLUTION_MB = 50.0
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


def write_corpus(path: Path, count: int, word_source: Path, seed: int = 1234, chunk: int = 10_000, length_scale: float = 0.5) -> None:
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


def write_config(root: Path, corpus: Path, workers: int, bytes_per_shard: int | None = None) -> Path:
    spec = root / "synthetic.toml"
    spec.write_text("\n".join([
        'name = "synthetic"', 'kind = "jsonl"', f'path = "{corpus}"', 'origin = "bench/scale.py"',
        'snapshot = "generated"', 'license = "CC0-1.0"', 'profile = "documentation"']) + "\n", encoding="utf-8")
    config = root / "pipeline.toml"
    ingest = f"\n[ingest]\nbytes_per_shard = {bytes_per_shard}\n" if bytes_per_shard else ""
    config.write_text(f'[run]\nsources = ["{spec}"]\nworkers = {workers}\n{ingest}\n[quality_model]\nenabled = false\n', encoding="utf-8")
    return config


class TreeSampler:
    """Peak RSS of this process tree, of its largest process and per role, and CPU seconds per role, every 100 ms.

    Roles: "host" is the process `host_pid` (the stage's flow host; this process
    when unset), "scheduler" this process when it is not the host (it holds the
    Dask scheduler and the nannies), "server" every process under `server_pid`
    (the Prefect server), "worker" every other descendant (Dask workers, pool
    processes). CPU seconds (user + system, summed over every
    process seen) are what a stage costs whatever else the machine runs; wall
    seconds stretch with the load. A process that exits between two samples
    loses at most 100 ms. The sampling thread's own CPU is left out.
    """

    ROLES = ("host", "host_child", "scheduler", "server", "worker")

    def __init__(self, server_pid: int | None = None) -> None:
        import psutil

        self.tree_mb = self.largest_mb = 0.0
        self.peak_mb = dict.fromkeys(self.ROLES, 0.0)
        self.me = psutil.Process()
        self.server_pid = server_pid
        self.host_pid: int | None = None
        self.own_cpu = 0.0
        self.role: dict[int, str] = {}
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def roles(self) -> dict[int, str]:
        host = self.host_pid or self.me.pid
        found = {self.me.pid: "host" if host == self.me.pid else "scheduler"}
        server = tree_pids(self.server_pid) if self.server_pid is not None else set()
        host_tree = tree_pids(host) if host != self.me.pid else set()
        for pid in tree_pids(self.me.pid) - {self.me.pid}:
            found[pid] = "server" if pid in server else "host" if pid == host else "host_child" if pid in host_tree else "worker"
        return found

    def sample(self) -> None:
        total = 0.0
        for pid, role in self.roles().items():
            read = usage(pid)
            if read is None:
                continue
            mb, self.last[pid] = read
            self.role[pid] = role
            total += mb
            self.largest_mb = max(self.largest_mb, mb)
            self.peak_mb[role] = max(self.peak_mb[role], mb)
        self.tree_mb = max(self.tree_mb, total)

    def run(self) -> None:
        while not self.stop.wait(0.1):
            self.sample()
        self.own_cpu = time.thread_time()  # this sampling thread's CPU: the bench's, not the pipeline's


    def cpu_seconds(self, role: str | None = None) -> float:
        total = sum(cpu - self.first.get(pid, 0.0) for pid, cpu in self.last.items() if role is None or self.role.get(pid) == role)
        if role is None or role == self.role.get(self.me.pid):
            total -= self.own_cpu
        return total

    def row(self) -> dict:
        return {"cpu_seconds": self.cpu_seconds(), **{f"cpu_{r}": self.cpu_seconds(r) for r in self.ROLES},
                "tree_mb": self.tree_mb, "largest_mb": self.largest_mb, **{f"{r}_mb": self.peak_mb[r] for r in self.ROLES},
                "host_mb": max(self.peak_mb["host"], self.peak_mb["host_child"])}  # under py-spy, the flow host is its child

    def __enter__(self) -> "TreeSampler":
        self.sample()
        self.first = dict(self.last)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        self.sample()


def dir_files(path: Path) -> tuple[int, int]:
    """(files, bytes) under `path`."""
    files = [p for p in path.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def stage_row(name: str, seconds: float, sampler: TreeSampler, out: Path) -> dict:
    files, size = dir_files(out)
    shards = len(list((out / "data").glob("*.parquet"))) if (out / "data").is_dir() else 0
    return {"stage": name, "seconds": seconds, **sampler.row(), "files": files, "shards": shards, "bytes": size, "load": os.getloadavg()[0]}


def child_loop(config_path: Path, run: Path, result: Path) -> None:
    """Every stage up to `shards`, in order, as plain function calls with the process pool."""
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
        rows.append(stage_row(entry.name, seconds, sampler, out))
        result.write_text(json.dumps(rows))
    shutdown_worker_pools()


def child_flow(config_path: Path, run: Path, result: Path, workers: int, profile: Path | None = None) -> None:
    """Every stage up to `shards`: a real Prefect server, a Dask LocalCluster, and per stage a fresh flow-host process.

    Each stage's flow runs in a process of its own (a user re-running one stage
    starts one too), and the workers are restarted before it, so every stage's
    peak RSS is its own, not the high-water mark an earlier stage left in a
    long-lived process.
    """
    from flows.prefect_env import apply_prefect_defaults

    apply_prefect_defaults()
    from distributed import Client, LocalCluster

    from flows.config import load_config
    from flows.server import LocalServer, free_port, prefect_api
    from flows.stages import pipeline_stages, stage_path

    config = load_config(config_path)
    server = LocalServer(home=run.parent / "prefect", port=free_port()).start()
    rows = []
    try:
        with prefect_api(server.api_url):  # the environment now names the API: the cluster and the stage processes inherit it
            for n, entry in enumerate(pipeline_stages(config)):
                if entry.name == "pretrain":
                    break
                # A fresh cluster per stage rather than client.restart(): a nanny's restart now and then waited out its
                # 120 s timeout for a worker that never came back (seen twice in a row after extract).
                with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
                        Client(cluster):
                    command = [sys.executable, __file__, "--stage-flow", entry.name, "--run", str(run), "--address", cluster.scheduler_address]
                    if n == 0:
                        command += ["--child", str(config_path)]
                    if profile is not None:  # py-spy's folded stacks of the flow host, one file a stage
                        profile.mkdir(parents=True, exist_ok=True)
                        command = ["py-spy", "record", "--format", "raw", "--rate", "50", "-o", str(profile / f"{entry.name}.txt"), "--", *command]
                    with TreeSampler(server.process.pid) as sampler:
                        started = time.perf_counter()
                        stage_process = subprocess.Popen(command)
                        sampler.host_pid = stage_process.pid  # under py-spy, its child is the flow host: still the host's tree
                        if stage_process.wait() != 0:
                            raise RuntimeError(f"stage {entry.name} failed (exit {stage_process.returncode})")
                        seconds = time.perf_counter() - started
                    rows.append(stage_row(entry.name, seconds, sampler, stage_path(run, entry.name, config)))
                    result.write_text(json.dumps(rows))
                    row = rows[-1]
                    print(f"  {entry.name}: {seconds:.1f} s, CPU host {row['cpu_host'] + row['cpu_host_child']:.1f} s, scheduler {row['cpu_scheduler']:.1f} s, "
                          f"workers {row['cpu_worker']:.1f} s, host {row['host_mb']:.0f} MB, worker {row['worker_mb']:.0f} MB", flush=True)
    finally:
        server.stop()


def stage_flow(stage: str, run: Path, address: str, config_path: Path | None) -> None:
    """One stage as one Prefect flow run on the cluster at `address`: the first builds the run directory."""
    from flows.prefect_env import apply_prefect_defaults

    apply_prefect_defaults()
    from flows.config import load_config
    from flows.pipeline import Runner, hymo_pipeline
    from flows.stage_flow import hymo_stage

    if config_path is not None:
        hymo_pipeline(config=load_config(config_path), out=str(run), until=stage, runner=Runner.dask, dask_address=address)
    else:
        hymo_stage(run=str(run), stage=stage, until=stage, runner=Runner.dask, dask_address=address)


def plot(results: dict[int, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(results)
    figure, axes = plt.subplots(1, 4, figsize=(20, 4))
    panels = (("cpu_seconds", 1, "CPU seconds (process tree)"), ("host_mb", 1, "flow host peak MB"),
              ("worker_mb", 1, "largest worker peak MB"), ("bytes", 2**-20, "MB on disk"))
    for stage in [row["stage"] for row in results[sizes[0]]]:
        for axis, (key, scale, _) in zip(axes, panels):
            axis.plot(sizes, [next(r.get(key, float("nan")) for r in results[n] if r["stage"] == stage) * scale for n in sizes],
                      marker="o", label=stage)
    for axis, (_, _, label) in zip(axes, panels):
        axis.set_xlabel("documents")
        axis.set_ylabel(label)
        axis.set_xscale("log")
        axis.set_yscale("log")
    axes[3].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def run_size(args, count: int, commit: str, bytes_per_shard: int | None = None) -> tuple[dict, list[dict]]:
    """One size in a fresh child process, or its stored result under --reuse: (run facts, per-stage rows)."""
    root = WORK / args.path / (f"{count}" if bytes_per_shard is None else f"{count}-shard-{bytes_per_shard}")
    meta = {"docs": count, "length_scale": args.length_scale, "workers": args.workers, "word_source": str(args.word_source),
            "commit": commit, "path": args.path, **({"bytes_per_shard": bytes_per_shard} if bytes_per_shard else {})}
    if args.reuse and (root / "run.json").exists() and json.loads((root / "run.json").read_text())["meta"] == meta:
        run = json.loads((root / "run.json").read_text())
        print(f"{count} documents: reused the run of {run['date']} on {commit}", flush=True)
        return run, json.loads((root / "result.json").read_text())
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    corpus = root / "synthetic.jsonl"
    write_corpus(corpus, count, args.word_source, length_scale=args.length_scale)
    config = write_config(root, corpus, args.workers, bytes_per_shard)
    result = root / "result.json"
    load_start, started = os.getloadavg()[0], time.perf_counter()
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    subprocess.run([sys.executable, __file__, "--child", str(config), "--run", str(root / "run"), "--result", str(result),
                    "--path", args.path, "--workers", str(args.workers), *(["--profile", str(args.profile / str(count))] if args.profile else [])],
                   check=True)
    rows = json.loads(result.read_text())
    run = {"meta": meta, "date": date, "load_start": load_start, "load_end": os.getloadavg()[0],
           "seconds": time.perf_counter() - started, "corpus_bytes": corpus.stat().st_size}
    (root / "run.json").write_text(json.dumps(run))
    print(f"{count} documents: {run['seconds']:.0f} s, load {load_start:.1f} -> {run['load_end']:.1f}", flush=True)
    if args.keep_run:  # e.g. for bench/report_page.py --run, which measures the data report page of this run
        print(f"{count} documents: run directory kept at {root / 'run'}", flush=True)
    else:
        shutil.rmtree(root / "run", ignore_errors=True)
    corpus.unlink()
    return run, rows


SWEEP_TITLE = "Flow host memory against the number of shards (`python bench/scale.py --shard-sweep`)"


def ingest_shards_at(n: int, text_bytes_per_doc: float) -> int:
    """Shards ingest cuts from `n` documents under the default config: a shard closes at its byte or document cap."""
    import math

    from tasks.ingest.ingest import IngestConfig

    default = IngestConfig()
    return max(math.ceil(n / default.docs_per_shard), math.ceil(n * text_bytes_per_doc / default.bytes_per_shard))


def shard_sweep(args, commit: str) -> int:
    """One size at several shard sizes: each stage's flow-host peak RSS fitted as fixed + MB per ingest shard.

    The flow host plans and records shards; documents stay on the workers. Its
    memory should therefore grow with the number of shards, not with N. Cutting
    one corpus into 1, tens and hundreds of shards measures that per-shard term
    directly, which the size runs can't (they add 5 shards between 100k and 1M).
    The prediction for 100M and 1B documents then needs only the number of
    shards the default config would cut there.
    """
    from bench.report import markdown_table, write_section

    from tasks.ingest.ingest import IngestConfig

    default_bytes = IngestConfig().bytes_per_shard
    count = args.docs[0]
    measured = []
    for size in sorted(args.shard_sweep, key=lambda b: -(b or default_bytes)):
        run, rows = run_size(args, count, commit, size or None)
        measured.append((size, run, rows))
    ingest = [next(r for r in rows if r["stage"] == "ingest")["shards"] for _, _, rows in measured]
    smallest_size, _, _ = measured[-1]
    # Shards at the smallest size are full, so they give the text per document the default config will cut by.
    text_bytes_per_doc = (smallest_size or default_bytes) * ingest[-1] / count
    targets = [(n, ingest_shards_at(n, text_bytes_per_doc)) for n in (100_000_000, 1_000_000_000)]
    table, predicted = [], {n: [] for n, _ in targets}
    for stage in [row["stage"] for row in measured[0][2]]:
        host = [next(r for r in rows if r["stage"] == stage)["host_mb"] for _, _, rows in measured]
        fixed, per_shard = tail_fit(ingest, host)
        for n, shards in targets:
            predicted[n].append((fixed + per_shard * shards, stage))
        table.append((stage, *(f"{mb:.0f}" for mb in host), f"{fixed:.0f} MB + {per_shard * 1024:.1f} KB x shards",
                      *(f"{fixed + per_shard * shards:,.0f} MB" for _, shards in targets)))
    worst = {n: max(values) for n, values in predicted.items()}
    table.append(("largest", *(f"{max(r['host_mb'] for r in rows):.0f}" for _, _, rows in measured), "",
                  *(f"**{worst[n][0] / 1024:.2f} GB** ({worst[n][1]})" for n, _ in targets)))
    header = ["stage", *(f"flow host MB, {shards:,} shards ({(size or default_bytes) / 1e6:g} MB each)" for (size, _, _), shards in zip(measured, ingest)),
              "fit (two largest shard counts)", *(f"predicted at {n:,} docs ({shards:,} shards)" for n, shards in targets)]
    body = markdown_table(header, table)
    loads = "; ".join(f"{(size or default_bytes) / 1e6:g} MB shards: {run['date']}, {run['seconds']:.0f} s, load {run['load_start']:.1f} -> {run['load_end']:.1f}"
                      for size, run, _ in measured)
    goal = worst[1_000_000_000][0] <= 2048
    note = (f"{count:,} synthetic documents (as in the section above) through the same "
            f"distributed path, once per ingest `bytes_per_shard` ({loads}). Every later stage keeps ingest's shards. Cells: peak RSS "
            f"of the stage's flow-host process. The fit is fixed + per-shard through the two largest shard counts (slope clamped at 0); "
            f"the predictions take the shards the default config cuts ({text_bytes_per_doc:.0f} bytes of text per document, measured at "
            f"the smallest shard size; a shard closes at 128 MB or 100,000 documents). Goal: the flow host predicted <= 2 GB at 1B "
            f"documents: **{'met' if goal else 'not met'}**.")
    print(f"\n{note}\n\n{body}")
    if not args.no_write:
        write_section(SWEEP_TITLE, body, note)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, nargs="*", default=[100_000, 300_000, 1_000_000],
                        help="sizes to run (none: only render the runs stored under --include)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--path", choices=["flow", "loop"], default="flow",
                        help="flow: Prefect flow runs on a Dask LocalCluster (default); loop: the stage functions with the process pool")
    parser.add_argument("--word-source", type=Path, default=DEFAULT_WORD_SOURCE)
    parser.add_argument("--length-scale", type=float, default=0.5, help="document length = a word-source page's length times this")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--keep-run", action="store_true", help="keep each size's run directory (WORK/PATH/N/run) instead of deleting it")
    parser.add_argument("--reuse", action="store_true", help="take a size's stored result when it ran on this same commit with the same settings")
    parser.add_argument("--include", action="append", default=[], type=Path,
                        help="also show every stored size under this work directory (e.g. a 1M run on an earlier commit)")
    parser.add_argument("--child", type=Path)
    parser.add_argument("--run", type=Path)
    parser.add_argument("--result", type=Path)
    parser.add_argument("--profile", type=Path, help="with --path flow: record each stage's flow host with py-spy (folded stacks) here")
    parser.add_argument("--shard-sweep", type=int, nargs="*", metavar="BYTES",
                        help="run the first --docs size once per ingest bytes_per_shard given, and fit each stage's flow-host "
                             "peak to the number of shards (the flow host holds shard lists, not documents)")
    parser.add_argument("--stage-flow", help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.stage_flow:
        stage_flow(args.stage_flow, args.run, args.address, args.child)
        return 0
    if args.child:
        if args.path == "flow":
            child_flow(args.child, args.run, args.result, args.workers, args.profile)
        else:
            child_loop(args.child, args.run, args.result)
        return 0
    from bench.report import write_section

    commit = code_commit()
    results: dict[int, list[dict]] = {}
    runs: dict[int, dict] = {}
    if args.shard_sweep:
        return shard_sweep(args, commit)
    for count in args.docs:
        runs[count], results[count] = run_size(args, count, commit)
    columns = [(runs[n]["meta"]["commit"], n, results[n], runs[n]) for n in sorted(results)]
    for directory in args.include:
        for root in sorted((p for p in Path(directory).iterdir() if p.name.isdigit()), key=lambda p: int(p.name)):
            if (root / "run.json").exists() and (root / "result.json").exists():
                stored = json.loads((root / "run.json").read_text())
                columns.append((stored["meta"]["commit"], stored["meta"]["docs"], json.loads((root / "result.json").read_text()), stored))
    if not columns:
        parser.error("no runs: give --docs, or --include a work directory with stored runs")
    table = scale_table(columns)
    # The cost model: the sizes of the code run at the most sizes (this invocation's, on a tie).
    by_code: dict[str, list[tuple[int, list[dict]]]] = {}
    for c, n, rows_of, _ in columns:
        by_code.setdefault(c, []).append((n, rows_of))
    model_code = max(by_code, key=lambda c: (len(by_code[c]), c == commit))
    same_code = by_code[model_code]
    model = f"On {model_code}. " + cost_model_tables(same_code) if len(same_code) >= 2 else ""
    loads = "; ".join(f"{n:,} at {c}: {r['date']}, load {r['load_start']:.1f} -> {r['load_end']:.1f}" for c, n, _, r in columns)
    path = ("one Prefect flow run per stage against a real Prefect server, on a Dask LocalCluster of "
            f"{args.workers} worker processes (one thread each, restarted before each stage), every per-shard pass a Dask task, each "
            "stage's flow in a fresh process (`hymo_stage(stage=S, until=S)`)" if args.path == "flow"
            else f"the stage functions in a plain loop with {args.workers} pool workers")
    note = (f"{path[0].upper()}{path[1:]}. Synthetic documents with the word statistics of "
            f"{args.word_source.name} (page lengths x {args.length_scale:g}, documentation profile, paragraphs), 10 % near copies. "
            f"Runs ({loads}). Cells: wall s / CPU s of the whole process tree (flow host + workers + Prefect server) / peak RSS of "
            f"the stage's flow-host process / of the largest worker process / files / bytes on disk; a column's "
            f"per-document cost is compared with the smallest size run on the same code. CPU seconds are the cost measure when "
            f"runs saw different loads (wall stretches with the load, CPU much less). Plot (the cost model's runs): docs/scale.png.")
    print(f"\n{note}\n\n{table}\n\n{model}")
    if not args.no_write:
        plot(dict(same_code), REPO / "docs" / "scale.png")
        write_section(TITLE, table + ("\n\n" + model if model else ""), note)
    return 0


def code_commit() -> str:
    """The checked-out commit, marked when the tree has local changes: a reused run must come from the same code."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    return head + ("+changes" if dirty else "")


def cell(row: dict | None) -> str:
    if row is None:
        return "-"
    host = row.get("host_mb", float("nan"))
    worker = row.get("worker_mb", row["largest_mb"])
    files = row.get("files")
    return (f"{row['seconds']:.1f} s / {row.get('cpu_seconds', float('nan')):.1f} s / {host:.0f} MB / {worker:.0f} MB / "
            f"{'-' if files is None else files} / {row['bytes'] / 2**20:.1f} MB")


def scale_table(columns: list[tuple[str, int, list[dict], dict]]) -> str:
    """Per stage and (code, size): wall / CPU / flow host / largest worker / files / on disk; totals; per-document cost
    against the smallest size run on the same code."""
    from bench.report import markdown_table

    rows = []
    for stage in [row["stage"] for row in columns[0][2]]:
        rows.append((stage, *(cell(next((r for r in rows_of if r["stage"] == stage), None)) for _, _, rows_of, _ in columns)))
    wall = [sum(r["seconds"] for r in rows_of) / n for _, n, rows_of, _ in columns]
    cpu = [sum(r.get("cpu_seconds", float("nan")) for r in rows_of) / n for _, n, rows_of, _ in columns]
    rows.append(("all stages", *(f"{w * n:.0f} s ({w * 1e6:.0f} µs/doc) / {c * n:.0f} s ({c * 1e6:.0f} µs/doc) / "
                                 f"{max(r.get('host_mb', float('nan')) for r in rows_of):.0f} MB host, "
                                 f"{max(r.get('worker_mb', r['largest_mb']) for r in rows_of):.0f} MB worker, "
                                 f"{max(r['tree_mb'] for r in rows_of):.0f} MB tree / {sum(r.get('files', 0) for r in rows_of):,} files / "
                                 f"{sum(r['bytes'] for r in rows_of) / 2**30:.2f} GB" for w, c, (_, n, rows_of, _) in zip(wall, cpu, columns))))
    ratios = []
    for commit, n, _, _ in columns:
        base = min(i for i, (other, m, _, _) in enumerate(columns) if other == commit and m == min(k for o, k, _, _ in columns if o == commit))
        i = next(i for i, (other, m, _, _) in enumerate(columns) if other == commit and m == n)
        ratios.append(f"wall {wall[i] / wall[base]:.2f}x, CPU {cpu[i] / cpu[base]:.2f}x vs {columns[base][1]:,}")
    rows.append(("per-document cost", *ratios))
    return markdown_table(["stage", *(f"{n:,} docs @{commit}: wall / CPU / flow host / largest worker / files / on disk"
                                      for commit, n, _, _ in columns)], rows)


TARGETS = ((100_000_000, 64), (100_000_000, 512), (1_000_000_000, 64), (1_000_000_000, 512))


def tail_fit(sizes: list[int], values: list[float]) -> tuple[float, float]:
    """(fixed, per-document) of the line through the two largest sizes, the slope clamped at 0.

    The two largest sizes, not a least-squares line over all of them: terms that are capped (the
    tokenizer's sample, a model load) are flat there, and it is the cost at large N that is extrapolated.
    """
    slope = max(0.0, (values[-1] - values[-2]) / (sizes[-1] - sizes[-2]))
    return values[-1] - slope * sizes[-1], slope


def marginal_growth(sizes: list[int], values: list[float]) -> float:
    """How the per-document cost grows with N: with three sizes or more, the marginal cost between the two largest
    over that between the two smallest (1.0: linear, > 1: superlinear); with two, the larger size's per-document
    cost over the smaller's (fixed costs spread make it < 1 for a linear stage)."""
    if len(sizes) < 3:
        return (values[-1] / sizes[-1]) / (values[0] / sizes[0]) if values[0] > 0 else float("nan")
    first = (values[1] - values[0]) / (sizes[1] - sizes[0])
    last = (values[-1] - values[-2]) / (sizes[-1] - sizes[-2])
    return last / first if first > 0 else float("nan")


def cost_model(same_code: list[tuple[int, list[dict]]]) -> list[dict]:
    """Per stage: fixed and per-document CPU on the flow host and on the workers, the cluster's overhead per wall
    second, their growth, and memory fits."""
    same_code = sorted(same_code)
    sizes = [n for n, _ in same_code]
    model = []
    for stage in [row["stage"] for row in same_code[0][1]]:
        rows = [next(r for r in rows_of if r["stage"] == stage) for _, rows_of in same_code]
        host_cpu = [r["cpu_host"] + r["cpu_host_child"] for r in rows]  # serial: the stage's flow-host process
        worker_cpu = [r["cpu_worker"] for r in rows]
        # The Dask scheduler and the Prefect server tick with wall time (heartbeats, polling, task-run states), not N.
        overhead = [(r["cpu_scheduler"] + r["cpu_server"]) / r["seconds"] for r in rows]
        model.append({
            "stage": stage, "host_cpu": tail_fit(sizes, host_cpu), "worker_cpu": tail_fit(sizes, worker_cpu),
            "growth": marginal_growth(sizes, [h + w for h, w in zip(host_cpu, worker_cpu)]), "overhead": overhead[-1],
            "host_mb": tail_fit(sizes, [r["host_mb"] for r in rows]), "host_mb_peak": max(r["host_mb"] for r in rows),
            "host_mb_rise": rows[-1]["host_mb"] - rows[-2]["host_mb"], "files": tail_fit(sizes, [r["files"] for r in rows]),
            # A task holds one shard or one partition, both capped in bytes: at the largest size the shards are full,
            # so its peak is the bound; it grows with N only until the first shard fills (tests count the rows held).
            "worker_mb": rows[-1]["worker_mb"], "worker_mb_growth": (rows[-1]["worker_mb"] - rows[-2]["worker_mb"]) / (sizes[-1] - sizes[-2]),
        })
    return model


def host_mb_at(m: dict, n: int) -> float:
    """A stage's flow-host peak at n documents: its fit where the rise between the two largest sizes is one RSS can
    resolve, else its largest measured peak (a smaller rise is no evidence of a per-document term)."""
    if m["host_mb_rise"] < RSS_RESOLUTION_MB:
        return m["host_mb_peak"]
    return m["host_mb"][0] + m["host_mb"][1] * n


def host_mb_cell(m: dict) -> str:
    mh0, mh1 = m["host_mb"]
    if m["host_mb_rise"] < RSS_RESOLUTION_MB:
        return f"{m['host_mb_peak']:.0f} MB (rise {m['host_mb_rise']:+.0f} MB: not resolved)"
    return f"{mh0:.0f} MB + {mh1 * 2**20:.0f} B·N"


def cost_model_tables(same_code: list[tuple[int, list[dict]]]) -> str:
    """The fitted terms per stage, and the extrapolation to 100M and 1B documents on 64 and 512 workers."""
    from bench.report import markdown_table

    model = cost_model(same_code)
    sizes = sorted(n for n, _ in same_code)
    bound = RSS_RESOLUTION_MB * 2**20 / (sizes[-1] - sizes[-2])
    terms = []
    for m in model:
        (h0, h1), (w0, w1) = m["host_cpu"], m["worker_cpu"]
        terms.append((m["stage"], f"{h0:.1f} s + {h1 * 1e6:.1f} µs·N", f"{w0:.1f} s + {w1 * 1e6:.1f} µs·N", f"{m['growth']:.2f}",
                      f"{m['overhead']:.2f}", host_mb_cell(m), f"{m['worker_mb']:.0f} MB",
                      f"{m['files'][1] * 1e6:.0f}"))
    growth = (f"marginal cost {sizes[-2]:,}→{sizes[-1]:,} / {sizes[0]:,}→{sizes[1]:,}" if len(sizes) >= 3
              else f"CPU per document, {sizes[-1]:,} / {sizes[0]:,}")
    fitted = markdown_table(["stage", "flow-host CPU (serial)", "worker CPU (parallel)", growth, "scheduler + server CPU per wall s",
                             "flow host peak RSS", f"largest worker peak RSS (shards full at {sizes[-1]:,})", "files per 1M docs"], terms)
    predicted = []
    for n, workers in TARGETS:
        host_s = sum(max(0.0, m["host_cpu"][0] + m["host_cpu"][1] * n) for m in model)
        worker_s = sum(max(0.0, m["worker_cpu"][0] + m["worker_cpu"][1] * n) for m in model)
        host_gb = max(host_mb_at(m, n) for m in model) / 1024
        worst = sorted(model, key=lambda m: -host_mb_at(m, n))[:3]
        worker_gb = max(m["worker_mb"] for m in model) / 1024
        files = sum(max(0.0, m["files"][0] + m["files"][1] * n) for m in model)
        predicted.append((f"{n:,}", workers, f"{(host_s + worker_s / workers) / 3600:.1f} h", f"{host_s / 3600:.1f} h",
                          f"{worker_s / 3600:,.0f} h", f"{host_gb:.1f} GB ({', '.join(m['stage'] for m in worst)})",
                          f"{worker_gb:.2f} GB", f"{files:,.0f}"))
    extrapolated = markdown_table(["documents", "workers", "predicted wall (host + workers' CPU / workers)", "of which serial on the flow host",
                                   "workers' CPU in all", "flow host peak (largest three stages)", "largest worker", "files (all stages)"], predicted)
    return ("Cost model, per stage, from the two largest sizes run on this code (fixed + per-document term through them, the "
            "per-document term clamped at 0). Serial: the stage's flow-host process. Parallel: every Dask worker process. The "
            "Dask scheduler and the Prefect server are given per second of wall time, which is what drives them. A worker's "
            "peak is taken at the largest size, where every shard is full (a task holds one shard or one byte-capped partition). "
            f"A flow-host rise under {RSS_RESOLUTION_MB:.0f} MB between the two largest sizes (here {bound:.0f} B a document) is below "
            "what peak RSS resolves: the shard sweep saw one stage's peak move by 49 MB with the shard layout alone at a fixed "
            "document count. Such a stage is extrapolated at its largest measured peak; its per-document bytes are bounded by "
            "the counting tests instead (docs/corpus.md):\n\n"
            + fitted + "\n\nExtrapolated (worker CPU assumed to divide perfectly over the workers, so the wall times are lower bounds; "
            "memory per process does not depend on the number of workers):\n\n" + extrapolated)


if __name__ == "__main__":
    sys.exit(main())
