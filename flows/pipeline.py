"""The `hymo-pipeline` flow: every stage in order over one run directory.

Between stages travel paths to stage directories, never documents. Each stage
is one task run named after it, started once the previous stage's run has
finished (`wait_for`: the chain the UI draws). Its Prefect cache key is the
stage-contract key (flows.stage_cache): a stage published under the same key
with intact files ends "Cached" without work; a deleted or corrupted output is
recomputed, never served stale; `refresh_cache` recomputes it. Document stages
map their shards in batches over the task runner (worker processes by default,
or a Dask cluster with `runner="dask"`); the batches are task runs nested under
their stage, named `STAGE-shards-FIRSTSHARD`.
"""
from __future__ import annotations

import gc
import json
import os
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from enum import Enum
from pathlib import Path
from typing import Any, Iterator

from prefect import flow, get_run_logger, task
from prefect.context import TaskRunContext
from prefect.futures import PrefectConcurrentFuture, as_completed

from manifests.run_lock import run_lock
from manifests.stage_manifest import StageManifest, read_manifest
from tasks.runner.shared_paths import check_shared_paths
from tasks.runner.stage_runner import PROGRESS_SINK, cluster_workers, default_workers, lend_pool, on_dask_cluster, plan_stage, publish_plan, start_worker
from tasks.runner.worker_threads import PARALLELISM, parallelism_record, worker_choice, worker_environment

from flows.artifacts import BackgroundPublisher, draw_funnel, made_line, publish_data_report, publish_run_summary, publish_stage_artifacts
from flows.cluster import require_api_for_workers, worker_paths
from flows.config import RUN_CONFIG, PipelineConfig, default_run, load_config, load_run_config  # noqa: F401 (RUN_CONFIG, load_run_config: re-exported)
from flows.errors import may_pass_on_retry
from flows.run_config import claim_run_dir
from flows.run_report import StageProgress
from flows.shard_batch import shard_batch
from flows.stage_cache import STAGE_CONTRACT, drop_failure_record, record_dir
from flows.stages import STAGE_BY_NAME, StageEntry, previous_stage_path, stage_entry, stage_path, stages_between
from flows.warm_workers import stage_modules, warm_process_pool

DOCS_PER_BATCH = 20_000  # a task run costs ~0.1-0.2 s of API round trips; a batch should be worth far more
MAX_BATCHES_PER_WORKER = 4
TRAINING_STAGE = "pretrain"  # no document decisions after it starts
# Stages that publish artifacts, not documents: once only these are left, the funnel (documents per stage) is final.
ARTIFACT_STAGES = frozenset({"tokenizer", "mixture", "shards", TRAINING_STAGE})
# ... and once only these are left, so is the data report page (its tokens out are the mixture's): it is built on the
# publisher's thread while they run, not after the flow's last stage.
AFTER_DATA_REPORT = frozenset({"shards", TRAINING_STAGE})


class Runner(str, Enum):
    process = "process"
    thread = "thread"
    dask = "dask"


def manifest_stamp(out: Path) -> tuple[int, int] | None:
    """Identity of the published manifest file: unchanged stamp = the stage did no work."""
    path = Path(out) / "manifest.json"
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_ino, stat.st_mtime_ns


def log_stage(manifest: StageManifest, how: str) -> None:
    made = made_line(manifest)
    if made is not None:  # a stage that makes files: what it made, not "in=0 kept=0"
        get_run_logger().info("%s %s: %s (%s)", manifest.stage, how, made, manifest.directory)
        return
    counts = manifest.counts
    get_run_logger().info(
        "%s %s: in=%s kept=%s removed=%s modified=%s (%s)", manifest.stage, how, counts.get("in"), counts.get("kept"),
        json.dumps(counts.get("removed", {})), json.dumps(counts.get("modified", {})), manifest.directory)


def stage_summary(manifest: StageManifest, run: Path) -> dict[str, Any]:
    """The stage task's result (kept by Prefect as the cache record): paths relative to the run directory."""
    return {"stage": manifest.stage, "dir": Path(manifest.directory).name if manifest.directory else None, "run": str(run),
            "digest": manifest.digest, "cache_key": manifest.cache_key, "counts": manifest.counts}


def forget_stage(run: Path, stage: str, config: PipelineConfig | None = None) -> None:
    """Drop the stage's manifest so the contract check fails and the stage recomputes."""
    (stage_path(run, stage, config) / "manifest.json").unlink(missing_ok=True)


# (task runner, workers, pool workers) the document stages map their shard batches over; set by the flow for its
# stages. Pool workers above 1: a batch sends its shard jobs to this process's worker pool of that many workers.
SHARD_RUNNER: ContextVar[tuple[Any, int, int] | None] = ContextVar("hymo_shard_runner", default=None)


@task(task_run_name="{name}", cache_policy=STAGE_CONTRACT, result_serializer="json")
def stage_task(name: str, config: PipelineConfig, run: str) -> dict[str, Any]:
    """One stage of the DAG over the run directory `run`. With `refresh_cache` it recomputes even an intact stage."""
    # Only a call here: shard batches submitted inside this task carry its context, and with it this
    # function pickled by value; run_stage_in_task is pickled by reference.
    return run_stage_in_task(name, config, Path(run))


def retry_if_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect's retry condition for stage tasks: only a fault a second attempt may clear (flows.errors.may_pass_on_retry).
    A retry is safe: the failed attempt published nothing, and the stage recomputes into a fresh work directory."""
    exc = state.data if isinstance(state.data, BaseException) else None
    if exc is None:
        return False
    if may_pass_on_retry(exc):
        get_run_logger().warning("%s failed with %s: %s; Prefect retries it", task_run.name, type(exc).__name__, exc)
        return True
    return False


def run_stage_in_task(name: str, config: PipelineConfig, run_dir: Path) -> dict[str, Any]:
    out, previous = stage_path(run_dir, name, config), previous_stage_path(run_dir, name, config)
    context = TaskRunContext.get()
    if context is not None and context.task.refresh_cache:
        forget_stage(run_dir, name, config)
    before = manifest_stamp(out)
    entry, shard_runner = stage_entry(config, name), SHARD_RUNNER.get()
    with StageProgress(name) as progress:
        token = PROGRESS_SINK.set(progress)
        try:
            if entry.doc_stage is not None and shard_runner is not None:
                manifest = run_doc_stage(entry, config, previous, out, *shard_runner, progress)
            else:
                manifest = entry.run(config, run_dir, previous, out)
        finally:
            PROGRESS_SINK.reset(token)
    log_stage(manifest, "already published" if before is not None and manifest_stamp(out) == before else "computed")
    return stage_summary(manifest, run_dir)


def batch_count(documents: int, workers: int) -> int:
    """One batch per worker for a small stage (each task run costs API round trips), up to four per
    worker as the stage grows (balance when shards differ in cost, finer progress)."""
    return max(1, min(workers * MAX_BATCHES_PER_WORKER, max(workers, documents // DOCS_PER_BATCH)))


def batches(jobs: list[tuple], sizes: list[int], count: int) -> list[list[tuple]]:
    """About `count` batches of consecutive shards with similar document totals."""
    total = max(1, sum(sizes))
    out: list[list[tuple]] = [[]]
    filled = 0
    for job, size in zip(jobs, sizes):
        if out[-1] and filled >= total * len(out) / count:
            out.append([])
        out[-1].append(job)
        filled += size
    return [b for b in out if b]


def needs_task_runner(entries: list[StageEntry], runner: Runner) -> bool:
    """Whether these stages need the task runner: a document stage maps its shard batches over it; on Dask every data
    stage does, since its per-shard passes (ingest's byte ranges, extraction, the global passes, tokenizer sampling,
    mixture, shards) run on the cluster only through the runner's client. Re-running one of those alone with
    `--runner dask` must not run it on the flow host."""
    if runner == Runner.dask:
        return any(e.name != TRAINING_STAGE for e in entries)
    return any(e.doc_stage for e in entries)


def make_task_runner(runner: Runner, workers: int, dask_address: str | None):
    """The runner the shard batches go to; a local pool's or cluster's workers start with their share of the cores
    (tasks/runner/worker_threads.py). A remote Dask cluster's workers keep what their own nannies set."""
    if runner == Runner.dask:
        from prefect_dask import DaskTaskRunner

        if dask_address:
            return DaskTaskRunner(address=dask_address)
        return DaskTaskRunner(cluster_kwargs={"n_workers": workers, "threads_per_worker": 1, "processes": True})
    if runner == Runner.thread:
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner(max_workers=workers)
    from prefect.task_runners import ProcessPoolTaskRunner

    # Its workers start early (warm_process_pool) and must not outlive a SIGKILLed flow process.
    env = worker_environment(worker_choice(workers))
    return ProcessPoolTaskRunner(max_workers=workers, initializer=start_worker, initargs=(os.getpid(), env))


def start_task_runner(task_runner, runner: Runner, workers: int, dask_address: str | None) -> None:
    """Enter the runner; a local Dask cluster's nannies spawn their workers with the policy's threads. A nanny also
    writes those pre-spawn variables into this process's os.environ, where the training stage on this host would
    take them for the user's choice: run_stages puts its own environment back before every stage."""
    if runner != Runner.dask or dask_address:
        task_runner.__enter__()
        return
    import dask

    pre_spawn = {**dask.config.get("distributed.nanny.pre-spawn-environ", {}), **worker_environment(worker_choice(workers))}
    with dask.config.set({"distributed.nanny.pre-spawn-environ": pre_spawn}):
        task_runner.__enter__()


def finished_upstream(state: Any) -> PrefectConcurrentFuture:
    """The finished previous stage as a `wait_for` entry: a done future, which Prefect records by its task-run id alone.
    Given the State itself, Prefect also walks its data and looks up every object's id() in the flow's result links,
    which keep the ids of freed results of built-in types (PrefectHQ/prefect#20558): a recycled address once put an
    earlier task run into a stage's wait_for."""
    done: Future = Future()
    done.set_result(state)
    return PrefectConcurrentFuture(state.state_details.task_run_id, done)


def restore_environ(environ: dict[str, str]) -> None:
    if os.environ != environ:
        os.environ.clear()
        os.environ.update(environ)


def run_doc_stage(entry: StageEntry, config: PipelineConfig, previous: Path, out: Path, task_runner, workers: int, pool_workers: int,
                  progress: StageProgress) -> StageManifest:
    """Global pass here, then the shard batches as task runs nested under this stage's run, then publish."""
    stage, stage_config = entry.doc_stage(config)
    planned = plan_stage(stage, stage_config, previous, out, config.workers)
    if isinstance(planned, StageManifest):
        return planned
    get_run_logger().info("%s: %d shards to process", entry.name, len(planned.jobs))
    groups = batches(planned.jobs, planned.sizes, batch_count(sum(planned.sizes), workers))
    try:
        futures = [task_runner.submit(shard_batch, {"name": entry.name, "first": group[0][4], "jobs": group, "pool_workers": pool_workers})
                   for group in groups]
        results = []
        for done, future in enumerate(as_completed(futures), start=1):
            results.extend(future.result())
            progress("shard batches", done, len(groups))
    except BaseException:
        planned.writer.abandon()
        raise
    return publish_plan(planned, results)


def batch_task_runner(task_runner: Any, runner: Runner, workers: int) -> tuple[Any, int]:
    """Where a document stage's shard batches become task runs, and the worker count of the pool their shard jobs go
    to (1: they run where the batch runs). On the process runner: threads of this flow, each batch's shard jobs sent
    to this process's worker pool (the runner's, lent; a fresh one after a worker died) as plain calls. A batch submitted to the process pool
    as a Prefect task run carries the whole run context (every Prefect setting: ~20 ms to serialize here, ~30 ms to
    validate again there, plus a client of its own), 0.1-0.3 s of every stage on a small corpus; a thread's task run
    shares this process's context. The batches stay task runs nested under their stage, and their shards run in the
    same warm workers. Elsewhere: the runner itself (Dask's workers need the context; threads have it)."""
    if runner != Runner.process or task_runner is None:
        return task_runner, 1
    from prefect.task_runners import ThreadPoolTaskRunner

    return ThreadPoolTaskRunner(max_workers=workers).__enter__(), workers


def lend_runner_pool(task_runner: Any, workers: int):
    """The process runner's pool also runs the stages' own maps (ingest's reads, the global passes' per-shard work):
    one set of warm workers per run instead of a second pool that starts and imports again; nothing where the
    runner holds no process pool."""
    executor = getattr(task_runner, "_executor", None)
    return lend_pool(workers, executor) if isinstance(executor, ProcessPoolExecutor) else nullcontext()


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Within this block the objects that exist on entry are left out of the cyclic collector's passes, and given back
    on exit: the flow host's imports, Prefect's client and settings, and the run's context are walked by no full
    collection while its stages run (one such pass cost the flow host ~0.1 s, on the critical path between a global
    pass's rounds). Objects made inside the block are collected as usual; an object frozen here that becomes cyclic
    garbage waits for the exit, so the block spans one flow run, never a process's whole life."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def export_api_url() -> None:
    """Worker processes (process pool, Dask) must report to the same Prefect API as this flow."""
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    if url:
        os.environ["PREFECT_API_URL"] = str(url)


def run_stages(config: PipelineConfig, run: Path, start: str | None, until: str | None, runner: Runner, dask_address: str | None,
               refresh: str | None = None) -> dict[str, Any]:
    """Run `start`..`until` as a chain of stage tasks; `refresh`: that stage ignores its cache and recomputes."""
    workers = config.workers or default_workers()
    export_api_url()
    summary: dict[str, Any] = {"run": str(run.resolve()), "stages": []}
    funnel_drawn = False
    entries = stages_between(start, until, config)
    task_runner = make_task_runner(runner, workers, dask_address) if needs_task_runner(entries, runner) else None
    environ_before = dict(os.environ)  # a local Dask cluster's nannies write their workers' variables here
    pool_lent = nullcontext()
    if task_runner is not None:
        start_task_runner(task_runner, runner, workers, dask_address)
        if runner == Runner.process:  # the workers start (and import) while the stages before the first batch run
            warm_process_pool(task_runner, workers, stage_modules(entries, config))
            pool_lent = lend_runner_pool(task_runner, workers)
    batch_runner, pool_workers = batch_task_runner(task_runner, runner, workers)
    shard_runner = SHARD_RUNNER.set((batch_runner, workers, pool_workers))
    parallelism = PARALLELISM.set(None)
    try:
        # On Dask, the global passes' per-shard work runs on the cluster too, and batches follow its worker count.
        on_dask = runner == Runner.dask and task_runner is not None
        cluster = on_dask_cluster(task_runner.client) if on_dask else nullcontext()
        with frozen_heap(), cluster, pool_lent, BackgroundPublisher() as artifacts:
            if on_dask:
                require_api_for_workers(dask_address, None)  # the flow's API, now in the environment
                check_shared_paths(task_runner.client, run, worker_paths(config))
                workers = cluster_workers(task_runner.client)
                SHARD_RUNNER.set((task_runner, workers, 1))  # the finally's reset still restores the value before run_stages
            remote = on_dask and bool(dask_address)
            PARALLELISM.set(parallelism_record(runner.value, workers, None if remote else worker_choice(workers, environ_before)))
            previous_state = None
            report_started = False
            run_arg = str(run)  # made before any task ran: Prefect links parameters by id(), and no freed result held this one's address
            for position, entry in enumerate(entries):
                restore_environ(environ_before)  # what a restarted Dask worker's nanny wrote is not the trainer's choice
                if not funnel_drawn and all(e.name in ARTIFACT_STAGES for e in entries[position:]):
                    artifacts.submit(draw_funnel, run)  # the funnel is final: draw it while the tokenizer trains, the model too
                    funnel_drawn = True
                if not report_started and all(e.name in AFTER_DATA_REPORT for e in entries[position:]):
                    artifacts.submit(publish_data_report, run, AFTER_DATA_REPORT)
                    report_started = True
                out = stage_path(run, entry.name, config)
                options: dict[str, Any] = {"result_storage": record_dir(run, entry.name, config), "retries": config.task_retries,
                                           "retry_delay_seconds": config.task_retry_delay_s, "retry_condition_fn": retry_if_transient}
                if entry.name == refresh:
                    options["refresh_cache"] = True
                state = stage_task.with_options(**options)(
                    entry.name, config, run_arg, wait_for=[finished_upstream(previous_state)] if previous_state else None, return_state=True)
                try:
                    state.result()  # a failed stage fails the flow here
                except BaseException:
                    drop_failure_record(out)
                    raise
                previous_state = state
                manifest = read_manifest(out, verify=False)
                if state.name != "Cached":  # a cached task run does no work: its artifacts are those of the run that did
                    artifacts.submit(publish_stage_artifacts, run, entry.name, manifest, state.state_details.task_run_id)
                summary["stages"].append({"stage": entry.name, "dir": str(out), "digest": manifest.digest, "counts": manifest.counts,
                                              "state": state.name})  # "Cached": Prefect found the stage's contract key
            if not report_started:
                artifacts.submit(publish_data_report, run, AFTER_DATA_REPORT)
    finally:
        SHARD_RUNNER.reset(shard_runner)
        PARALLELISM.reset(parallelism)
        if batch_runner is not task_runner:
            batch_runner.__exit__(None, None, None)
        if task_runner is not None:
            task_runner.__exit__(None, None, None)
        restore_environ(environ_before)
    extra_images = [p for p in [stage_path(run, "pretrain", config) / "loss.png"] if p.exists()] if "pretrain" in STAGE_BY_NAME else []
    publish_run_summary(run, extra_images, drawn=funnel_drawn)
    return summary


def log_lines(lines: list[str]) -> None:
    for line in lines:
        get_run_logger().info("%s", line)


# `hymo run`'s config without --config: the flow's default, hence the form's under any deployment of it.
SAMPLE_DEFAULTS = load_config()


@flow(name="hymo-pipeline", log_prints=True)
def hymo_pipeline(
    config: PipelineConfig = SAMPLE_DEFAULTS,
    out: str | None = None,
    until: str | None = None,
    runner: Runner = Runner.process,
    dask_address: str | None = None,
    change_stages: bool = False,
) -> dict[str, Any]:
    """The whole DAG, from sources to a trained checkpoint; the defaults are `hymo run`'s: the bundled sample config
    into $HYMO_HOME/runs/sample (`out` empty; HYMO_HOME defaults to the working directory). A run directory holds one
    pipeline: a config whose stage list differs from the directory's fails at once, unless `change_stages` moves the
    other list's stage directories aside (beside the run, as RUN.replaced-TIME)."""
    run = Path(out).resolve() if out else default_run()
    with run_lock(run):  # one writer per run directory: a second run fails naming this one
        log_lines(claim_run_dir(run, config, runner.value, change_stages))
        return run_stages(config, run, None, until, runner, dask_address)
