"""Benchmark the shards stage's tokenisation and the token loader.

  /work/venv/bin/python bench/shards.py --run RUN [--rounds 3] [--no-write]

RUN is a run directory that reached the shards stage (`hymo run`). Measured on
its own training documents (repeated until `--min-chars`) with its tokenizer:

* baseline: one process, `tokenizer.encode(text)` per document, ids to numpy;
* ours: what the shards stage does, `encode_documents` (encode_batch over
  ENCODE_BATCH_DOCS documents, Rust threads on every core, EOS appended);
* the whole shards stage (read, tokenise, order, write, hash) rebuilt into a
  temporary directory;
* the loader: `TokenLoader.next_batch()` from memory-mapped shards.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from bench.report import write_section  # noqa: E402
from hymo_core.data import CorpusReader, EndOfEpoch, TokenLoader  # noqa: E402
from manifests.run_dir import find_stage  # noqa: E402
from tasks.mixture import ENCODE_BATCH_DOCS  # noqa: E402
from tasks.shards import ShardsConfig, build_shards, encode_documents  # noqa: E402
from tasks.split import iter_split_docs  # noqa: E402
from tasks.tokenizer import EOS_TOKEN, load_tokenizer  # noqa: E402

TITLE = "Shards stage: tokenisation and token loader (bench/shards.py)"
GOAL = 1.8  # issue 5: shards-stage tokenisation vs a single-process encode loop, on 2 cores


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def thread_cpu_ticks() -> dict[str, int]:
    """CPU ticks (user + system) of every thread of this process, from /proc (Linux)."""
    ticks = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks[task.name] = int(fields[11]) + int(fields[12])
    return ticks


def threads_that_worked(fn) -> tuple[int, float]:
    """How many threads did >= 10% of the CPU work of `fn`, and the largest thread's share."""
    before = thread_cpu_ticks()
    fn()
    after = thread_cpu_ticks()
    spent = {t: after[t] - before.get(t, 0) for t in after}
    total = sum(spent.values()) or 1
    return sum(v >= 0.1 * total for v in spent.values()), max(spent.values()) / total


def timed_cpu(fn):
    """Wall seconds and CPU seconds of this process (all threads): CPU/wall shows the cores actually obtained."""
    cpu, wall = time.process_time(), time.perf_counter()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def reading(run: Path, vocab: int, speedup: float, cores_busy: float, threads: int, largest: float,
            loop_per_cpu_s: float, batch_per_cpu_s: float, load: float) -> str:
    """The paragraph under the table: what this particular measurement can and cannot show."""
    cores = len(os.sched_getaffinity(0))
    head = (f"Machine: {cores}-core x86_64 CPU shared with other jobs (1-min load average {load:.1f} at start); "
            f"run `{run}`, tokenizer vocab {vocab}; best of the interleaved rounds. ")
    if speedup >= GOAL:
        return head + f"The shards path reaches {speedup:.2f}x the single-process loop (goal >= {GOAL}x on 2 cores)."
    return head + (
        f"The >= {GOAL}x goal is NOT demonstrated by this run: this process obtained {cores_busy:.2f} cores "
        f"whichever path ran, so wall time cannot show a parallel gain. What it does show: encode_batch spread its "
        f"work over {threads} threads (largest {largest:.0%} of the CPU) where the loop uses one, at "
        f"{batch_per_cpu_s:,.0f} vs {loop_per_cpu_s:,.0f} tokens per CPU-second (no extra CPU per token). On {cores} idle "
        f"cores the wall speed-up should therefore approach {min(threads, cores)}x; that remains to be measured on an idle machine.")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True)
    parser.add_argument("--min-chars", type=int, default=4_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--loader-batches", type=int, default=2000)
    parser.add_argument("--no-write", action="store_true", help="print only; do not update docs/benchmarks.md")
    args = parser.parse_args()
    run = Path(args.run)
    load_at_start = os.getloadavg()[0]

    split_dir = find_stage(run, "split")[0].path
    tokenizer_dir = find_stage(run, "tokenizer")[0].path
    mixture_dir = find_stage(run, "mixture")[0].path
    tokenizer = load_tokenizer(tokenizer_dir / "tokenizer.json")
    eos = tokenizer.token_to_id(EOS_TOKEN)
    texts = [t for table in iter_split_docs(split_dir, "train", ["text"]) for t in table.column("text").to_pylist()]
    unique_docs = len(texts)
    while sum(map(len, texts)) < args.min_chars:
        texts = texts + texts
    chars = sum(map(len, texts))
    dtype = np.dtype("<u2")

    def baseline():
        return [np.append(np.asarray(tokenizer.encode(t, add_special_tokens=False).ids, dtype=dtype), eos) for t in texts]

    def ours():
        out = []
        for start in range(0, len(texts), ENCODE_BATCH_DOCS):
            out.extend(encode_documents(tokenizer, texts[start:start + ENCODE_BATCH_DOCS], eos, dtype))
        return out

    # interleaved, best of --rounds: other jobs on a shared machine only ever slow a round down
    base_rounds, our_rounds = [], []
    for _ in range(args.rounds):
        base_ids, *measured = timed_cpu(baseline)
        base_rounds.append(measured)
        our_ids, *measured = timed_cpu(ours)
        our_rounds.append(measured)
    base_s, base_cpu = min(base_rounds)
    our_s, our_cpu = min(our_rounds)
    busy_threads, largest_share = threads_that_worked(ours)
    assert all(np.array_equal(a, b) for a, b in zip(base_ids, our_ids)), "encode_batch and encode disagree"
    tokens = sum(len(a) for a in our_ids)

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (_, extra), stage_s = timed(lambda: build_shards(split_dir, tokenizer_dir, mixture_dir, ShardsConfig(), work))
    stage_tokens = extra["train_tokens"] + extra["validation_tokens"]

    corpus = CorpusReader(run)
    loader = TokenLoader(corpus, seq_len=args.seq_len, batch_size=args.batch_size, seed=0)
    served = 0
    start = time.perf_counter()
    while served < args.loader_batches:
        try:
            loader.next_batch()
        except EndOfEpoch:
            loader.start_next_epoch()
            continue
        served += 1
    loader_s = time.perf_counter() - start

    rows = [
        ("documents (unique, repeated to size)", f"{unique_docs} -> {len(texts)}"),
        ("characters / tokens", f"{chars:,} / {tokens:,}"),
        (f"single-process encode loop (best of {args.rounds})", f"{tokens / base_s:,.0f} tokens/s ({base_s:.2f} s wall, {base_cpu / base_s:.2f} cores busy)"),
        (f"encode_batch x{ENCODE_BATCH_DOCS}, shards path (best of {args.rounds})", f"{tokens / our_s:,.0f} tokens/s ({our_s:.2f} s wall, {our_cpu / our_s:.2f} cores busy)"),
        ("speed-up (wall)", f"{base_s / our_s:.2f}x on {len(os.sched_getaffinity(0))} cores (goal >= 1.8x on 2 idle cores)"),
        ("tokens per CPU-second, loop / batch", f"{tokens / base_cpu:,.0f} / {tokens / our_cpu:,.0f}"),
        ("threads doing >= 10% of encode_batch's CPU", f"{busy_threads} (largest share {largest_share:.0%})"),
        ("load average at start (1 min)", f"{load_at_start:.2f}"),
        ("whole shards stage on the run", f"{stage_tokens / stage_s:,.0f} tokens/s ({stage_tokens:,} tokens incl. repeats, {stage_s:.2f} s)"),
        (f"loader next_batch B={args.batch_size} T={args.seq_len}", f"{served / loader_s:,.0f} batches/s ({served * args.batch_size * args.seq_len / loader_s:,.0f} tokens/s)"),
    ]
    width = max(len(r[0]) for r in rows)
    table = "\n".join([f"| {'measure':<{width}} | result |", f"|{'-' * (width + 2)}|--------|"] + [f"| {a:<{width}} | {b} |" for a, b in rows])
    print(table)
    if not args.no_write:
        write_section(TITLE, table, reading(run, corpus.vocab_size, base_s / our_s, our_cpu / our_s, busy_threads, largest_share,
                                            tokens / base_cpu, tokens / our_cpu, load_at_start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
