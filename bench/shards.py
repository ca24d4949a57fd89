"""Benchmark the data half's tokenisation (mixture + shards stages) and the token loader.

  /work/venv/bin/python bench/shards.py --run RUN [--rounds 5] [--no-write]

RUN is a run directory that reached the shards stage (`hymo run`). The sample
is small (a ~1 s stage), so the bench first scales it: a temporary copy of RUN
whose split holds every document several times under fresh ids (same source,
same side), until `--min-chars`. Every document is tokenised exactly once
between the two stages (mixture: the training side, whose token counts it
needs; shards: the validation side), so on exactly those documents, with the
tokenizer freshly loaded each round as the stages load it:

* baseline: one process, `tokenizer.encode(text)` per document, ids to numpy
  with EOS appended;
* ours: the mixture stage then the shards stage (read, tokenise, plan, order,
  write, hash) into a temporary directory.

Also the loader: `TokenLoader.next_batch()` from RUN's memory-mapped shards.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hashlib  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from bench.report import markdown_table, write_section  # noqa: E402
from hymo_core.train.data import CorpusReader, EndOfEpoch, TokenLoader  # noqa: E402
from manifests.corpus import source_of_id  # noqa: E402
from manifests.run_dir import find_stage  # noqa: E402
from manifests.stage_manifest import read_manifest  # noqa: E402
from tasks.corpus.mixture import MixtureConfig, plan_parts, run_mixture  # noqa: E402
from tasks.corpus.shards import ShardsConfig, build_shards, token_dtype  # noqa: E402
from tasks.corpus.split import VALIDATION, iter_split_docs  # noqa: E402
from tasks.runner.stage_runner import StageWriter  # noqa: E402
from tasks.corpus.tokenizer import EOS_TOKEN, TOKENIZER_FILE, load_tokenizer, vocab_size_of  # noqa: E402

TITLE = "Shards stage: tokenisation and token loader (bench/shards.py)"
GOAL = 1.8  # issue 5: shards-stage tokens/s vs a single-process encode loop, on 2 cores


def timed_cpu(fn):
    """(result, wall seconds, CPU seconds of this process): CPU/wall = cores actually obtained."""
    cpu, wall = time.process_time(), time.perf_counter()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def loop_encode(tokenizer_path: Path, texts: list[str]) -> list[np.ndarray]:
    """The baseline: what a plain script does, one document at a time on one core."""
    tokenizer = load_tokenizer(tokenizer_path)
    eos, dtype = tokenizer.token_to_id(EOS_TOKEN), token_dtype(vocab_size_of(tokenizer))
    return [np.append(np.asarray(tokenizer.encode(t, add_special_tokens=False).ids, dtype=dtype), np.array([eos], dtype=dtype)) for t in texts]


def stage_texts(split_dir: Path) -> list[str]:
    """The texts mixture and shards tokenise between them: every training document, then every validation document."""
    return [t for side in ("train", VALIDATION) for table in iter_split_docs(split_dir, side, ["text"]) for t in table.column("text").to_pylist()]


def replica_ids(ids: pa.ChunkedArray, k: int) -> pa.Array:
    """Fresh ids for the k-th copy, keeping the `<source>-` prefix the corpus manifest groups by."""
    if k == 0:
        return ids.combine_chunks()
    return pa.array([f"{source_of_id(i)}-{hashlib.blake2b(f'{i}#{k}'.encode(), digest_size=8).hexdigest()}" for i in ids.to_pylist()])


def with_ids(table: pa.Table, k: int) -> pa.Table:
    return table.set_column(table.schema.get_field_index("id"), "id", replica_ids(table.column("id"), k))


def scaled_run(run: Path, factor: int, root: Path) -> Path:
    """RUN with its split holding every document `factor` times; the stages before it linked."""
    split_dir = find_stage(run, "split")[0].path
    out = root / "run"
    out.mkdir()
    for entry in run.iterdir():
        if entry.is_dir() and entry.name < split_dir.name:
            (out / entry.name).symlink_to(entry.resolve())
    (out / find_stage(run, "tokenizer")[0].path.name).symlink_to(find_stage(run, "tokenizer")[0].path.resolve())
    split = StageWriter("split", "bench", {}, f"bench-x{factor}", [], out / split_dir.name)
    manifest = read_manifest(split_dir)
    for n, data_file in enumerate(manifest.files("data")):
        table = pq.read_table(manifest.path_of(data_file))
        for k in range(factor):
            split.write_shard(n * factor + k, with_ids(table, k), [])
    split.publish()
    return out


def best_of(rounds: int, *fns):
    """Interleaved rounds, fastest wall time of each: other jobs on a shared machine only slow a round down."""
    results = [[] for _ in fns]
    for _ in range(rounds):
        for slot, fn in zip(results, fns):
            slot.append(timed_cpu(fn))
    return [min(slot, key=lambda r: r[1]) for slot in results]


def rate(tokens: int, wall: float, cpu: float) -> str:
    return f"{tokens / wall:,.0f} tokens/s ({wall:.2f} s wall, {cpu / wall:.2f} cores busy)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True)
    parser.add_argument("--min-chars", type=int, default=8_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--loader-batches", type=int, default=2000)
    parser.add_argument("--no-write", action="store_true", help="print only; do not update docs/benchmarks.md")
    args = parser.parse_args()
    run = Path(args.run)
    load_at_start = os.getloadavg()[0]
    cores = len(os.sched_getaffinity(0))

    one_copy = sum(map(len, stage_texts(find_stage(run, "split")[0].path)))
    mixture_config = MixtureConfig(**read_manifest(find_stage(run, "mixture")[0].path).config)
    factor = max(1, -(-args.min_chars // one_copy))
    with tempfile.TemporaryDirectory() as scratch:
        big = scaled_run(run, factor, Path(scratch))
        split_dir, tokenizer_dir = (find_stage(big, name)[0].path for name in ("split", "tokenizer"))
        tokenizer_path = tokenizer_dir / TOKENIZER_FILE
        texts = stage_texts(split_dir)

        def whole_stage():
            with tempfile.TemporaryDirectory() as tmp:
                mixture = run_mixture(mixture_config, split_dir, tokenizer_dir, Path(tmp) / "mixture")
                (Path(tmp) / "shards").mkdir()
                _, extra = build_shards(split_dir, tokenizer_dir, Path(tmp) / "mixture", ShardsConfig(), Path(tmp) / "shards")
                train_unique = sum(pq.read_table(part, columns=["tokens"]).column("tokens").to_numpy().sum() for part in plan_parts(mixture))
            return int(train_unique) + extra["validation_tokens"]

        (loop_ids, loop_s, loop_cpu), (written, stage_s, stage_cpu) = best_of(args.rounds, lambda: loop_encode(tokenizer_path, texts), whole_stage)
    tokens = sum(map(len, loop_ids))
    assert written == tokens, f"the stages tokenised {written} tokens, the loop made {tokens}"

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

    speedup = loop_s / stage_s
    rows = [
        ("documents mixture + shards tokenise (each once)", f"{len(texts):,} = the run's {len(texts) // factor:,} x {factor} ({sum(map(len, texts)):,} characters, {tokens:,} tokens)"),
        (f"single-process encode loop (best of {args.rounds})", rate(tokens, loop_s, loop_cpu)),
        (f"mixture + shards stages: read, tokenise, plan, write, hash (best of {args.rounds})", rate(tokens, stage_s, stage_cpu)),
        ("**speed-up, both stages vs loop**", f"**{speedup:.2f}x** on {cores} cores (goal >= {GOAL}x)"),
        ("tokens per CPU-second, loop / stage", f"{tokens / loop_cpu:,.0f} / {tokens / stage_cpu:,.0f}"),
        ("load average at start (1 min)", f"{load_at_start:.2f}"),
        (f"loader next_batch B={args.batch_size} T={args.seq_len}", f"{served / loader_s:,.0f} batches/s ({served * args.batch_size * args.seq_len / loader_s:,.0f} tokens/s)"),
    ]
    table = markdown_table(["measure", "result"], rows)
    print(table)
    if not args.no_write:
        verdict = "reaches" if speedup >= GOAL else "does NOT reach"
        reading = (f"Machine: {cores}-core x86_64 CPU, 1-min load average {load_at_start:.1f} at start; run `{run}`, tokenizer vocab "
                   f"{corpus.vocab_size}. Fastest of {args.rounds} interleaved rounds per path (this machine's speed varies "
                   f"by up to 2x between identical rounds). Mixture + shards together {verdict} the >= {GOAL}x goal: {speedup:.2f}x; "
                   f"each document is tokenised once (the mixture stage writes the training side's tokens, shards lays them out). "
                   f"Why it is faster than a loop on 2 cores: tasks/corpus/encoding.py encodes with `encode_batch_fast` on the Rust "
                   f"thread pool (no character offsets), in batches cut by characters with long documents cut at exact "
                   f"pre-token boundaries, and encodes the next batch while Python writes the previous one.")
        write_section(TITLE, table, reading)
    return 0


if __name__ == "__main__":
    sys.exit(main())
