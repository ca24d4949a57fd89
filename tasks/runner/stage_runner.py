"""The plumbing every stage shares: read shards, apply the stage's logic, write, count, publish.

Stages contain only their logic (`process_shard`, optionally a global
`prepare` pass). Everything else lives here and is written once:

* the cache key (with a digest of the stage's rule code) and the no-op re-run,
* per-shard accounting (documents in = kept + removed, by id),
* atomic writes into a hidden work directory, published by rename after the
  manifest (with `complete: true`) is written,
* process parallelism over shards and a progress bar; under a Dask cluster
  (`on_dask_cluster`) every map, the global passes' per-shard work included,
  runs as Dask tasks and worker counts come from the scheduler.
"""
from __future__ import annotations

import atexit
import inspect
import json
import os
import shutil
import sys
import threading
import time
from collections import Counter
from contextlib import contextmanager
from contextvars import ContextVar
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field, is_dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from manifests.atomic import atomic_write_parquet
from manifests.digest import cache_key as make_cache_key
from manifests.digest import config_hash, sha256_file
from manifests.file_stats import write_stats
from manifests.schema import AUDIT_SCHEMA, DOC_SCHEMA, audit_table
from manifests.stage_manifest import DigestMismatch, OutputFile, StageManifest, StageNotComplete, is_complete, read_manifest, write_manifest
from tasks.runner import host_traffic
from tasks.runner.code_version import code_version
from tasks.runner.rule_digest import rule_digest
from tasks.runner.rule_stats import ShardStats
from tasks.runner.worker_threads import PARALLELISM, apply_worker_environment, worker_choice, worker_environment


class AccountingError(RuntimeError):
    """A stage lost or invented documents: in != kept + removed for some shard."""


@dataclass
class ShardOutcome:
    """What a stage decided for one shard: surviving documents and the audit rows."""

    kept: pa.Table
    audit: list[dict[str, Any]] | pa.Table = field(default_factory=list)
    # Rows of rule_stats.STATS_SCHEMA (without `reached`): each rule's statistic on every document that reached
    # it; the runner keeps a bounded sample of them per shard in stats/part-XXXXX.parquet (tasks.runner.rule_stats).
    stats: pa.Table | None = None


@dataclass(frozen=True)
class StageDef:
    """A document-to-document stage: its identity and its logic, nothing else."""

    name: str
    version: str
    process_shard: Callable[[pa.Table, Any, Any], ShardOutcome]
    prepare: Callable[[StageManifest, Any, Path], Any] | None = None
    # Inputs other than the upstream stage (e.g. benchmark files): (name, sha256) pairs in the cache key,
    # so changing such a file recomputes the stage instead of serving the old result.
    external_inputs: Callable[[Any], list[tuple[str, str]]] | None = None


@dataclass
class ShardResult:
    shard: str
    outputs: list[OutputFile]
    docs_in: int
    kept: int
    actions: dict[str, dict[str, int]]  # action -> rule -> count


def config_dict(config: Any) -> dict[str, Any]:
    if config is None:
        return {}
    if is_dataclass(config):
        return asdict(config)
    if hasattr(config, "model_dump"):
        return config.model_dump(mode="json")
    return dict(config)


def shard_name(index: int) -> str:
    return f"part-{index:05d}"


def duplicate_described(kept: pa.Table) -> str:
    """The first id held twice, with the URLs and origin files of its rows (what a user needs to find them)."""
    counts = pc.value_counts(kept.column("id"))
    doc_id = counts.filter(pc.greater(counts.field("counts"), 1))[0]["values"].as_py()
    rows = kept.filter(pc.equal(kept.column("id"), doc_id)).to_pylist()
    where = []
    for row in rows:
        try:
            origin = json.loads(row.get("meta") or "{}").get("origin_file")
        except ValueError:
            origin = None
        where.append(f"{row.get('url') or '?'}" + (f" in {origin}" if origin else ""))
    return f"{doc_id} ({'; '.join(where)})"


def check_accounting(shard: str, ids_in: pa.Array | None, kept: pa.Table, audit: pa.Table) -> None:
    """Enforce: every input id is kept or removed, exactly once; nothing appears from nowhere."""
    kept_ids = kept.column("id")
    removed_ids = pc.filter(audit.column("id"), pc.equal(audit.column("action"), "removed"))
    if pc.count_distinct(kept_ids).as_py() != len(kept_ids):
        raise AccountingError(f"{shard}: duplicate ids among kept documents: {duplicate_described(kept)}")
    if pc.count_distinct(removed_ids).as_py() != len(removed_ids):
        raise AccountingError(f"{shard}: a document was removed twice")
    if pc.any(pc.is_in(removed_ids, value_set=kept_ids)).as_py():
        raise AccountingError(f"{shard}: a document is both kept and removed")
    touched = pc.filter(audit.column("id"), pc.not_equal(audit.column("action"), "removed"))
    if len(touched) and not pc.all(pc.is_in(touched, value_set=kept_ids)).as_py():
        raise AccountingError(f"{shard}: a modified/routed document is not among the kept ones")
    if ids_in is None or (len(ids_in) == 0 and len(kept_ids) == 0 and len(audit) == 0):
        return  # an empty shard (every document removed upstream) is consistent; pc.all([]) is null, not true
    out_ids = pa.concat_arrays([kept_ids.combine_chunks(), removed_ids.combine_chunks()])
    if len(out_ids) != len(ids_in) or not pc.all(pc.is_in(out_ids, value_set=ids_in)).as_py():
        lost = pc.filter(ids_in, pc.invert(pc.is_in(ids_in, value_set=out_ids)))
        raise AccountingError(
            f"{shard}: {len(ids_in)} documents in, {len(kept_ids)} kept + {len(removed_ids)} removed; "
            f"lost e.g. {lost[:3].to_pylist()}"
        )


class StageWriter:
    """Writes one stage's shards into a hidden work directory and publishes it atomically."""

    def __init__(self, stage: str, version: str, config: dict[str, Any], key: str, inputs: list[dict[str, str]], out_dir: Path):
        self.stage, self.version, self.config, self.key, self.inputs = stage, version, config, key, inputs
        self.out_dir = Path(out_dir)
        self.work_dir = self.out_dir.parent / f".{self.out_dir.name}.partial"
        self.results: list[ShardResult] = []
        self.artifacts: list[OutputFile] = []
        self.started = time.perf_counter()
        if self.work_dir.exists():
            shutil.rmtree(self.work_dir)
        (self.work_dir / "data").mkdir(parents=True)
        (self.work_dir / "audit").mkdir(parents=True)

    def write_shard(self, index: int, kept: pa.Table, audit: list[dict[str, Any]] | pa.Table, ids_in: pa.Array | None = None) -> ShardResult:
        result = write_shard_files(self.work_dir, self.stage, shard_name(index), kept, audit, ids_in)
        self.results.append(result)
        return result

    def add_result(self, result: ShardResult) -> None:
        self.results.append(result)

    def add_artifact(self, relpath: str, rows: int | None = None, sha256: str | None = None) -> None:
        """Register an extra file the stage wrote under its work directory (e.g. a removal list).

        `sha256`: the digest the task that wrote the file computed from the bytes it wrote; given, the file is
        not read again here (the flow host would hash every token file serially), and `manifest show --verify`
        still hashes it."""
        path = self.work_dir / relpath
        self.artifacts.append(OutputFile(relpath, sha256 or sha256_file(path), rows, "artifact"))

    def counts(self) -> dict[str, Any]:
        actions: dict[str, Counter] = {"removed": Counter(), "modified": Counter(), "routed": Counter()}
        for result in self.results:
            for action, rules in result.actions.items():
                actions[action].update(rules)
        docs_in = sum(r.docs_in for r in self.results)
        kept = sum(r.kept for r in self.results)
        return {
            "in": docs_in,
            "kept": kept,
            "removed": dict(sorted(actions["removed"].items())),
            "modified": dict(sorted(actions["modified"].items())),
            "routed": dict(sorted(actions["routed"].items())),
        }

    def publish(self, extra: dict[str, Any] | None = None, input_stats: dict[str, Any] | None = None) -> StageManifest:
        """Manifest (and the outputs' stats, for cheap cache checks) into the work directory, then swap it in.

        `input_stats`: stat fingerprints of source files, so the next run can trust their recorded sha256."""
        results = sorted(self.results, key=lambda r: r.shard)
        outputs = [o for r in results for o in r.outputs] + sorted(self.artifacts, key=lambda o: o.path)
        counts = self.counts()
        removed = sum(counts["removed"].values())
        if counts["in"] and counts["in"] != counts["kept"] + removed:
            raise AccountingError(f"{self.stage}: {counts['in']} in != {counts['kept']} kept + {removed} removed")
        manifest = StageManifest(
            stage=self.stage,
            stage_version=self.version,
            config=self.config,
            config_hash=config_hash(self.config),
            cache_key=self.key,
            code_version=code_version(),
            inputs=self.inputs,
            outputs=outputs,
            shards=[r.shard for r in results],
            counts=counts,
            wall_time_s=time.perf_counter() - self.started,
            extra=with_parallelism(extra),
        )
        write_stats(self.work_dir, [o.path for o in outputs], input_stats)  # renames keep inode and mtime
        write_manifest(self.work_dir, manifest)
        swap_into_place(self.work_dir, self.out_dir)
        manifest.directory = self.out_dir
        return manifest

    def abandon(self) -> None:
        shutil.rmtree(self.work_dir, ignore_errors=True)


def with_parallelism(extra: dict[str, Any] | None) -> dict[str, Any]:
    """The stage's own extra, plus how the run ran it (workers, threads per worker) when a flow set that."""
    extra = dict(extra or {})
    parallelism = PARALLELISM.get()
    if parallelism is not None:
        extra["parallelism"] = parallelism
    return extra


def swap_into_place(work_dir: Path, out_dir: Path) -> None:
    """Replace `out_dir` by `work_dir` with renames; a crash in between leaves no complete stage."""
    old = out_dir.parent / f".{out_dir.name}.old"
    if old.exists():
        shutil.rmtree(old)
    if out_dir.exists():
        os.replace(out_dir, old)
    os.replace(work_dir, out_dir)
    if old.exists():
        shutil.rmtree(old)


def write_shard_files(work_dir: Path, stage: str, shard: str, kept: pa.Table, audit: list[dict[str, Any]] | pa.Table, ids_in: pa.Array | None,
                      stats: pa.Table | None = None) -> ShardResult:
    kept = kept.cast(DOC_SCHEMA) if kept.schema != DOC_SCHEMA else kept
    if not isinstance(audit, pa.Table):
        audit = audit_table([{**row, "stage": stage} for row in audit])
    elif audit.schema != AUDIT_SCHEMA:
        audit = audit.cast(AUDIT_SCHEMA)
    check_accounting(shard, ids_in, kept, audit)
    data_path = work_dir / "data" / f"{shard}.parquet"
    audit_path = work_dir / "audit" / f"{shard}.parquet"
    atomic_write_parquet(data_path, kept)
    atomic_write_parquet(audit_path, audit)
    actions: dict[str, dict[str, int]] = {}
    for action, rule in zip(audit.column("action").to_pylist(), audit.column("rule").to_pylist()):
        bucket = actions.setdefault(action, {})
        bucket[rule] = bucket.get(rule, 0) + 1
    outputs = [
        OutputFile(f"data/{shard}.parquet", sha256_file(data_path), kept.num_rows, "data"),
        OutputFile(f"audit/{shard}.parquet", sha256_file(audit_path), audit.num_rows, "audit"),
    ]
    if stats is not None:
        stats_path = work_dir / "stats" / f"{shard}.parquet"
        stats_path.parent.mkdir(exist_ok=True)
        atomic_write_parquet(stats_path, stats)
        outputs.append(OutputFile(f"stats/{shard}.parquet", sha256_file(stats_path), stats.num_rows, "stats"))
    return ShardResult(
        shard=shard,
        outputs=outputs,
        docs_in=kept.num_rows + sum(actions.get("removed", {}).values()),
        kept=kept.num_rows,
        actions=actions,
    )


SHARD_BATCH_DOCS = 2048  # documents a stage function sees at once: its per-document Python objects stay bounded


def _run_one_shard(stage: StageDef, config: Any, context: Any, in_path: str, shard: str, work_dir: str) -> ShardResult:
    """One input shard through `stage.process_shard`, SHARD_BATCH_DOCS documents at a time.

    A stage function turns its documents into Python objects (texts, rows), so
    it is fed bounded batches, never a whole shard; the results are Arrow
    tables, concatenated and written once (the same bytes as one call would give).
    """
    kept, audits, ids = [], [], []
    stats = ShardStats()
    for batch in pq.ParquetFile(in_path).iter_batches(batch_size=SHARD_BATCH_DOCS):
        docs = pa.Table.from_batches([batch])
        docs = docs.cast(DOC_SCHEMA) if docs.schema != DOC_SCHEMA else docs
        outcome = stage.process_shard(docs, config, context)
        audit = outcome.audit if isinstance(outcome.audit, pa.Table) else audit_table([{**row, "stage": stage.name} for row in outcome.audit])
        kept.append(outcome.kept.cast(DOC_SCHEMA) if outcome.kept.schema != DOC_SCHEMA else outcome.kept)
        audits.append(audit.cast(AUDIT_SCHEMA) if audit.schema != AUDIT_SCHEMA else audit)
        ids.append(docs.column("id").combine_chunks())
        if outcome.stats is not None:
            stats.add(outcome.stats)
    kept_table = pa.concat_tables([DOC_SCHEMA.empty_table(), *kept]).combine_chunks()
    audit_rows = pa.concat_tables([AUDIT_SCHEMA.empty_table(), *audits]).combine_chunks()
    ids_in = pa.concat_arrays(ids) if ids else pa.array([], pa.string())
    return write_shard_files(Path(work_dir), stage.name, shard, kept_table, audit_rows, ids_in, stats.table())


_DASK_CLIENT: list[Any] = []  # the cluster this process maps onto while a flow runs with the Dask runner


@contextmanager
def on_dask_cluster(client: Any) -> Iterator[None]:
    """Within this block every `map_shards` of this process runs on the Dask cluster behind `client`."""
    _DASK_CLIENT.append(client)
    try:
        yield
    finally:
        _DASK_CLIENT.remove(client)


def dask_client() -> Any | None:
    return _DASK_CLIENT[-1] if _DASK_CLIENT else None


def cluster_workers(client: Any) -> int:
    """Workers the scheduler knows now (what batch counts should follow, not this machine's cores)."""
    return max(1, len(client.scheduler_info(n_workers=-1)["workers"]))


def runner_workers(workers: int) -> int:
    """Workers the runner really has: on a Dask cluster the scheduler's count, else `workers` (partition counts follow it)."""
    client = dask_client()
    return cluster_workers(client) if client is not None else max(1, workers)


PARTITIONS_PER_WORKER = 2  # a global pass's ranges per worker: a slow range does not leave the other workers idle
PARTITION_BYTES = 256 << 20  # ... and at most about this much shuffled data per range, whatever the worker count


def partition_count(workers: int, data_bytes: int) -> int:
    """Ranges of a global pass's shuffle: enough to keep every worker busy, and more as the data grows, so a
    range's task holds about PARTITION_BYTES whether the corpus has a million documents or a billion."""
    return max(PARTITIONS_PER_WORKER * runner_workers(workers), -(-int(data_bytes) // PARTITION_BYTES))


def default_workers() -> int:
    client = dask_client()
    if client is not None:
        return cluster_workers(client)
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


_POOLS: dict[int, ProcessPoolExecutor] = {}
_LENT: dict[int, ProcessPoolExecutor] = {}  # pools someone else owns (the flow's task runner), used while lent


def worker_pool(workers: int) -> ProcessPoolExecutor:
    """One pool of spawned workers per process, reused by every map of every stage.

    Spawn, not fork: the parent may hold Prefect/event-loop threads. Reuse:
    a spawned worker pays ~1-3 s of imports (numpy, pyarrow, the stage
    module); a run of many stages, some with a global pass and a shard pass,
    would otherwise pay it at every map. A pool lent by `lend_pool` (the
    flow's process task runner) is that pool: one set of workers per run.
    """
    if workers in _LENT:
        return _LENT[workers]
    if workers not in _POOLS:
        env = worker_environment(worker_choice(workers))
        _POOLS[workers] = ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"),
                                              initializer=start_worker, initargs=(os.getpid(), env))
    return _POOLS[workers]


def start_worker(parent_pid: int, env: dict[str, str]) -> None:
    """A pool worker's initializer: its share of the cores (worker_threads), an exit when its parent is gone, and
    an exit without the interpreter's teardown when its pool shuts it down."""
    apply_worker_environment(env)
    exit_with_parent(parent_pid)
    atexit.register(exit_without_teardown)


def exit_without_teardown() -> None:
    """A pool worker's last atexit call (registered last, so run first): its log handlers flushed and any pool of
    its own shut down, it ends before Python tears its modules down. A worker that imported Prefect, pyarrow and
    a stage module spends ~0.5 s of CPU on that teardown, and the flow waits for its workers at the end of a run;
    nothing is lost: multiprocessing already flushed its queues and joined the worker's threads before exit, and
    every file a task wrote was closed before its result was sent."""
    import logging

    shutdown_worker_pools()
    logging.shutdown()
    os._exit(0)


def exit_with_parent(parent_pid: int) -> None:
    """In a pool worker: end this process once its parent is gone, even SIGKILLed (an idle worker would wait forever).

    A polling thread rather than PR_SET_PDEATHSIG: that signal follows the
    parent *thread*, and pools are created from short-lived task threads.
    """
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


@contextmanager
def lend_pool(workers: int, pool: ProcessPoolExecutor) -> Iterator[None]:
    """Within this block, maps of `workers` workers in this process run on `pool` (spawned workers started with
    `start_worker`), not on a second pool of their own: the flow's task runner lends its pool, so a run starts
    one set of workers, and those its warm-up started, whatever stage or global pass maps first. The owner shuts it down."""
    _LENT[workers] = pool
    try:
        yield
    finally:
        if _LENT.get(workers) is pool:
            del _LENT[workers]


def shutdown_worker_pools() -> None:
    for pool in _POOLS.values():
        pool.shutdown(cancel_futures=True)
    _POOLS.clear()


atexit.register(shutdown_worker_pools)


def map_shards(fn: Callable[..., ShardResult], jobs: list[tuple], workers: int, label: str, sizes: list[int]) -> Iterable[ShardResult]:
    """Run `fn(*job)` for every job, in worker processes when `workers > 1`; yield results as they finish.

    On a Dask cluster every job is a task (whatever `workers` says): a worker
    that dies mid-task has its tasks rerun elsewhere, so `fn` must write its
    files atomically and deterministically (same bytes on a rerun).
    """
    traffic = host_traffic.ACTIVE.get()
    if traffic is not None:
        yield from traffic_counted(traffic, label, jobs, map_shards_uncounted(fn, jobs, workers, label, sizes))
        return
    yield from map_shards_uncounted(fn, jobs, workers, label, sizes)


def traffic_counted(traffic: "host_traffic.HostTraffic", label: str, jobs: list[tuple], results: Iterable[Any]) -> Iterable[Any]:
    for job in jobs:
        traffic.add_job(label, job)
    for result in results:
        traffic.add_result(label, result)
        yield result


def map_shards_uncounted(fn: Callable[..., ShardResult], jobs: list[tuple], workers: int, label: str, sizes: list[int]) -> Iterable[ShardResult]:
    client = dask_client()
    if client is not None:
        yield from map_on_dask(client, fn, jobs, label, sizes)
        return
    with progress_bar(label, sum(sizes)) as advance:
        if workers <= 1 or len(jobs) <= 1:
            for job, size in zip(jobs, sizes):
                token = JOB_PROGRESS.set(advance.within)  # a job run here may report how far into it it is
                try:
                    result = fn(*job)
                finally:
                    JOB_PROGRESS.reset(token)
                advance(size)
                yield result
            return
        pool, futures = worker_pool(workers), {}
        try:  # a pool that broke while idle refuses the first submit: it is forgotten all the same
            for job, size in zip(jobs, sizes):
                futures[pool.submit(fn, *job)] = size
            for future in as_completed(futures):
                result = future.result()
                advance(futures[future])
                yield result
        except BaseException:
            abandon_pool_calls(futures, workers)
            raise


def abandon_pool_calls(futures: Iterable[Future], workers: int) -> None:
    """On a failed call: cancel the calls not started; a broken pool is forgotten, lent or not, so the next map
    starts a pool of its own (call from the `except` block: it looks at the exception being handled)."""
    for future in futures:
        future.cancel()
    if isinstance(sys.exc_info()[1], BrokenProcessPool):
        _POOLS.pop(workers, None)
        _LENT.pop(workers, None)


def map_on_dask(client: Any, fn: Callable[..., Any], jobs: list[tuple], label: str, sizes: list[int]) -> Iterable[Any]:
    from distributed import as_completed as dask_as_completed

    with progress_bar(label, sum(sizes)) as advance:
        futures = [client.submit(fn, *job, pure=False, key=f"{label}-{index}-{os.urandom(4).hex()}") for index, job in enumerate(jobs)]
        size_of = {future.key: size for future, size in zip(futures, sizes)}
        try:
            for future in dask_as_completed(futures, loop=client.loop):
                result = future.result()
                advance(size_of[future.key])
                yield result
        finally:
            client.cancel(futures)


# Where long work also reports how far it is, besides the terminal bar: (label, done, total). The flow
# sets it to a Prefect progress artifact; stage code stays free of Prefect.
PROGRESS_SINK: ContextVar[Callable[[str, int, int], None] | None] = ContextVar("hymo_progress_sink", default=None)


class progress_bar:
    """A per-stage progress bar on a terminal (silent elsewhere: CI logs, tests), and the PROGRESS_SINK if set.

    `with progress_bar(label, total) as advance`: `advance(n)` after n items are done; `advance.within(n)`
    while the job that runs now has done n of its items (extraction's pages inside a shard).
    """

    def __init__(self, label: str, total: int):
        self.label, self.total = label, total
        self.enabled = sys.stderr.isatty() or os.environ.get("HYMO_PROGRESS") == "1"
        self.progress = None
        self.sink = PROGRESS_SINK.get()
        self.done = 0
        self.show: Callable[[int], None] = lambda done: None

    def __enter__(self) -> "progress_bar":
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(TextColumn("{task.description:<12}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), transient=False)
            self.progress.start()
            task_id = self.progress.add_task(self.label, total=self.total)
            self.show = lambda done: self.progress.update(task_id, completed=done)
        return self

    def __call__(self, n: int) -> None:
        self.done += n
        self.report(self.done)

    def within(self, n: int) -> None:
        self.report(self.done + n)

    def report(self, done: int) -> None:
        self.show(done)
        if self.sink is not None:
            self.sink(self.label, done, self.total)

    def __exit__(self, *exc: Any) -> None:
        if self.progress is not None:
            self.progress.stop()


# Set while map_shards runs one job in its own thread: how that job reports n of its own items done.
JOB_PROGRESS: ContextVar[Callable[[int], None] | None] = ContextVar("hymo_job_progress", default=None)


def job_progress() -> Callable[[int], None]:
    """The running job's within-job progress callback (a no-op where nothing listens: worker processes, Dask)."""
    return JOB_PROGRESS.get() or (lambda n: None)


def report_progress(label: str, done: int = 0, total: int = 0) -> None:
    """A global pass says which phase it is in (and how far, when countable); free without a sink."""
    sink = PROGRESS_SINK.get()
    if sink is not None:
        sink(label, done, total)


def counted(label: str, items: Iterable[Any], total: int, size: Callable[[Any], int] = lambda item: 1) -> Iterator[Any]:
    """`items` unchanged, with (label, done so far, total) reported as each is taken; an item counts `size(item)`."""
    sink = PROGRESS_SINK.get()
    done = 0
    for item in items:
        if sink is not None:
            sink(label, done, total)
        yield item
        done += size(item)
    if sink is not None:
        sink(label, done, total)


def stage_cache_key(stage: str, version: str, config: Any, input_digests: list[str]) -> str:
    """The stage contract: name, version and rule-code digest (tasks/runner/rule_digest.py), config, input digests."""
    rules = rule_digest(stage)
    return make_cache_key(stage, f"{version}+rules.{rules}" if rules else version, config_dict(config), input_digests)


class StageWouldRun(Exception):
    """Raised under `probing()` where a stage would compute: it is not published under `key` with intact files
    (`key` None: the key cannot be known without reading the inputs, e.g. remote files not hashed yet)."""

    def __init__(self, key: str | None, published_key: str | None):
        super().__init__(f"stage not published under {key[:12]}…" if key else "stage key known only after reading its inputs")
        self.key, self.published_key = key, published_key


_PROBING: ContextVar[bool] = ContextVar("hymo_probing", default=False)


@contextmanager
def probing() -> Iterator[None]:
    """Run a stage function only up to its cache check: it returns the published manifest or raises StageWouldRun.
    The orchestrator learns the stage-contract key this way, from the stage's own key computation."""
    token = _PROBING.set(True)
    try:
        yield
    finally:
        _PROBING.reset(token)


def key_needs_reading() -> None:
    """A stage whose key needs bytes it has not read yet: under `probing()` it would run (the probe reads nothing)."""
    if _PROBING.get():
        raise StageWouldRun(None, None)


def published_under(out_dir: Path, key: str) -> StageManifest | None:
    """The published manifest when `out_dir` holds this key with intact files, else None (the stage computes)."""
    if is_complete(out_dir, key):
        return read_manifest(out_dir, verify=False)
    if _PROBING.get():
        try:
            published_key = read_manifest(out_dir, verify=False).cache_key
        except (StageNotComplete, DigestMismatch):
            published_key = None
        raise StageWouldRun(key, published_key)
    return None


def run_prepare(stage: StageDef, upstream: StageManifest, config: Any, work_dir: Path, workers: int) -> Any:
    """The stage's global pass, if any; it is given the worker count when its signature asks for `workers`."""
    if stage.prepare is None:
        return None
    if "workers" in inspect.signature(stage.prepare).parameters:
        return stage.prepare(upstream, config, work_dir, workers=workers)
    return stage.prepare(upstream, config, work_dir)


@dataclass
class StagePlan:
    """A stage that must run: its shard jobs, and the writer that will publish their results."""

    stage: StageDef
    jobs: list[tuple]  # arguments of `_run_one_shard`, one tuple per input shard
    sizes: list[int]  # documents per job, for progress
    writer: StageWriter
    context: Any


def plan_stage(stage: StageDef, config: Any, input_dir: Path, out_dir: Path, workers: int | None = None) -> StageManifest | StagePlan:
    """The published manifest when the stage is already done under this key; otherwise a plan whose
    global pass (`prepare`) has run and whose shard jobs are ready to map anywhere."""
    upstream = read_manifest(input_dir)
    external = stage.external_inputs(config) if stage.external_inputs else []
    key = stage_cache_key(stage.name, stage.version, config, [upstream.digest] + [digest for _, digest in external])
    out_dir = Path(out_dir)
    if (published := published_under(out_dir, key)) is not None:
        return published
    inputs = [{"stage_dir": str(Path(input_dir).name), "digest": upstream.digest}] + [{"file": name, "digest": digest} for name, digest in external]
    writer = StageWriter(stage.name, stage.version, config_dict(config), key, inputs, out_dir)
    try:
        context = run_prepare(stage, upstream, config, writer.work_dir, workers or default_workers())
    except BaseException:
        writer.abandon()
        raise
    data_files = upstream.files("data")
    jobs = [(stage, config, context_for_shard(context, Path(f.path).stem), str(upstream.path_of(f)), Path(f.path).stem, str(writer.work_dir))
            for f in data_files]
    return StagePlan(stage, jobs, [f.rows or 0 for f in data_files], writer, context)


def context_for_shard(context: Any, shard: str) -> Any:
    """What one shard job gets of the global pass's result: its own part when the context is partitioned by
    shard (`for_shard`), so a job's size and reads do not grow with the corpus; else the context itself."""
    return context.for_shard(shard) if hasattr(context, "for_shard") else context


def run_shard_jobs(jobs: list[tuple], pool_workers: int = 1) -> list[ShardResult]:
    """A batch of shard jobs (the unit a task runner maps), results in job order: with `pool_workers` above 1 as calls
    on this process's pool of that many workers (the lent one, or a fresh one once a worker died: worker_pool), else
    one after another in this process."""
    if pool_workers <= 1:
        return [_run_one_shard(*job) for job in jobs]
    pool, futures = worker_pool(pool_workers), []
    try:
        for job in jobs:
            futures.append(pool.submit(_run_one_shard, *job))
        return [future.result() for future in futures]
    except BaseException:
        abandon_pool_calls(futures, pool_workers)
        raise


def publish_plan(plan: StagePlan, results: Iterable[ShardResult]) -> StageManifest:
    """Collect every shard's result and publish the stage atomically; nothing is published on error."""
    try:
        for result in results:
            plan.writer.add_result(result)
        if len(plan.writer.results) != len(plan.jobs):
            raise AccountingError(f"{plan.stage.name}: {len(plan.writer.results)} shard results for {len(plan.jobs)} input shards")
        for relpath, rows in plan.context.artifacts() if hasattr(plan.context, "artifacts") else []:
            plan.writer.add_artifact(relpath, rows)  # files the global pass wrote into the stage directory
        extra = {"context": plan.context.summary()} if hasattr(plan.context, "summary") else {}
        return plan.writer.publish(extra)
    except BaseException:
        plan.writer.abandon()
        raise


def run_stage(stage: StageDef, config: Any, input_dir: Path, out_dir: Path, workers: int | None = None) -> StageManifest:
    """Run a document stage over every shard of `input_dir`'s output; a no-op when already published under this key."""
    plan = plan_stage(stage, config, input_dir, out_dir, workers)
    if isinstance(plan, StageManifest):
        return plan
    try:
        results = list(map_shards(_run_one_shard, plan.jobs, workers or default_workers(), stage.name, plan.sizes))
    except BaseException:
        plan.writer.abandon()
        raise
    return publish_plan(plan, results)


def read_stage_docs(stage_dir: Path, columns: list[str] | None = None) -> pa.Table:
    """All published documents of a stage, in shard order (for small runs, tests and tools)."""
    manifest = read_manifest(stage_dir)
    tables = [pq.read_table(manifest.path_of(f), columns=columns) for f in manifest.files("data")]
    return pa.concat_tables(tables) if tables else DOC_SCHEMA.empty_table()


def read_stage_audit(stage_dir: Path) -> pa.Table:
    manifest = read_manifest(stage_dir, verify=False)
    tables = [pq.read_table(manifest.path_of(f)) for f in manifest.files("audit")]
    return pa.concat_tables(tables) if tables else AUDIT_SCHEMA.empty_table()




def run_artifact_stage(
    name: str,
    version: str,
    config: Any,
    input_dirs: list[Path],
    out_dir: Path,
    build: Callable[[Path], tuple[list[tuple[str, int | None]], dict[str, Any]]],
) -> StageManifest:
    """Run a stage that publishes artifacts (a tokenizer, tables, token files) instead of document shards.

    `build(work_dir)` writes its files under `work_dir` and returns
    ([(relative path, rows or None[, sha256 its writer computed])], manifest extra). Same contract as
    `run_stage`: cache key over the inputs' digests, a no-op when published
    under that key, atomic publish with every file's sha256.
    """
    upstreams = [read_manifest(Path(d)) for d in input_dirs]
    key = stage_cache_key(name, version, config, [m.digest for m in upstreams])
    out_dir = Path(out_dir)
    if (published := published_under(out_dir, key)) is not None:
        return published
    inputs = [{"stage_dir": Path(d).name, "digest": m.digest} for d, m in zip(input_dirs, upstreams)]
    writer = StageWriter(name, version, config_dict(config), key, inputs, out_dir)
    try:
        artifacts, extra = build(writer.work_dir)
        for artifact in artifacts:
            writer.add_artifact(*artifact)
        return writer.publish(extra)
    except BaseException:
        writer.abandon()
        raise
