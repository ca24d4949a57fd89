"""The `hymo-pipeline` flow: every stage in order over one run directory.

Between stages travel paths to stage directories, never documents. Each stage
is a task named after it; a stage whose published manifest already carries the
same stage-contract key (stage, version, config, input digests) and whose files
match their sha256 finishes in the state "Cached" without work. A deleted or
corrupted output fails that check, so it is recomputed, never served stale.
Document stages map their shards in batches over the task runner: worker
processes by default, or a Dask cluster (`runner="dask"`).

That stage-contract check is the cache, so the tasks use Prefect's NO_CACHE
policy: the default policy would hash every input (stage plans, shard job
lists) on every task run for a cache nobody reads.
"""
from __future__ import annotations

import json
import os
from contextlib import nullcontext
from enum import Enum
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.futures import as_completed
from prefect.states import Completed

from manifests.atomic import atomic_write_text
from manifests.run_lock import run_lock
from manifests.stage_manifest import StageManifest, read_manifest
from tasks.stage_runner import StagePlan, cluster_workers, default_workers, on_dask_cluster, plan_stage, publish_plan

from flows.artifacts import BackgroundPublisher, artifact_key, draw_funnel, publish_run_summary, publish_stage_artifacts
from flows.config import RUN_CONFIG, PipelineConfig, load_run_config  # noqa: F401 (load_run_config: re-exported)
from flows.shard_batch import shard_batch
from flows.stages import STAGE_BY_NAME, StageEntry, previous_stage_path, stage_entry, stage_path, stages_between

DOCS_PER_BATCH = 20_000  # a task run costs ~0.1-0.2 s of API round trips; a batch should be worth far more
MAX_BATCHES_PER_WORKER = 4
TRAINING_STAGE = "pretrain"  # no document decisions after it starts


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
    counts = manifest.counts
    get_run_logger().info(
        "%s %s: in=%s kept=%s removed=%s modified=%s (%s)", manifest.stage, how, counts.get("in"), counts.get("kept"),
        json.dumps(counts.get("removed", {})), json.dumps(counts.get("modified", {})), manifest.directory)


def stage_summary(manifest: StageManifest) -> dict[str, Any]:
    return {"stage": manifest.stage, "dir": str(manifest.directory), "digest": manifest.digest, "cache_key": manifest.cache_key, "counts": manifest.counts}


def cached(manifest: StageManifest) -> Completed:
    return Completed(name="Cached", message=f"{manifest.stage}: published under the same stage-contract key", data=stage_summary(manifest))


@task(task_run_name="{name}", cache_policy=NO_CACHE)
def whole_stage(name: str, config: PipelineConfig, run: str, previous: str | None, out: str) -> Any:
    """A stage run as one task (ingest, extraction, artifact stages)."""
    before = manifest_stamp(Path(out))
    manifest = stage_entry(config, name).run(config, Path(run), Path(previous) if previous else None, Path(out))
    if before is not None and manifest_stamp(Path(out)) == before:
        log_stage(manifest, "cached")
        return cached(manifest)
    log_stage(manifest, "computed")
    return stage_summary(manifest)


@task(task_run_name="{name}", cache_policy=NO_CACHE)
def plan_doc_stage(name: str, config: PipelineConfig, previous: str, out: str) -> Any:
    """Check the cache and run the stage's global pass; hand back the shard jobs to map."""
    stage, stage_config = stage_entry(config, name).doc_stage(config)
    planned = plan_stage(stage, stage_config, Path(previous), Path(out), config.workers)
    if isinstance(planned, StageManifest):
        log_stage(planned, "cached")
        return cached(planned)
    get_run_logger().info("%s: %d shards to process", name, len(planned.jobs))
    return planned


@task(task_run_name="{name}-publish", cache_policy=NO_CACHE)
def publish_doc_stage(name: str, plan: StagePlan, results: list) -> dict[str, Any]:
    manifest = publish_plan(plan, results)
    log_stage(manifest, "computed")
    return stage_summary(manifest)


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


def make_task_runner(runner: Runner, workers: int, dask_address: str | None):
    if runner == Runner.dask:
        from prefect_dask import DaskTaskRunner

        if dask_address:
            return DaskTaskRunner(address=dask_address)
        return DaskTaskRunner(cluster_kwargs={"n_workers": workers, "threads_per_worker": 1, "processes": True})
    if runner == Runner.thread:
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner(max_workers=workers)
    from prefect.task_runners import ProcessPoolTaskRunner

    return ProcessPoolTaskRunner(max_workers=workers)


def run_doc_stage(entry: StageEntry, config: PipelineConfig, previous: Path, out: Path, task_runner, workers: int) -> dict[str, Any]:
    state = plan_doc_stage(entry.name, config, str(previous), str(out), return_state=True)
    planned = state.result()
    if state.name == "Cached" or not isinstance(planned, StagePlan):
        return planned
    groups = batches(planned.jobs, planned.sizes, batch_count(sum(planned.sizes), workers))
    # Progress only means something when batches queue behind busy workers; one wave goes from 0 to done.
    progress = None
    if len(groups) > workers:
        progress = create_progress_artifact(0.0, key=artifact_key("hymo", entry.name, "progress"), description=f"{entry.name}: shard batches done")
    try:
        futures = [task_runner.submit(shard_batch, {"name": entry.name, "first": group[0][4], "jobs": group}) for group in groups]
        results, done = [], 0
        for future in as_completed(futures):
            results.extend(future.result())
            done += 1
            if progress is not None:
                update_progress_artifact(progress, 100.0 * done / len(groups))
    except BaseException:
        planned.writer.abandon()
        raise
    return publish_doc_stage(entry.name, planned, results)


def export_api_url() -> None:
    """Worker processes (process pool, Dask) must report to the same Prefect API as this flow."""
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    if url:
        os.environ["PREFECT_API_URL"] = str(url)


def run_stages(config: PipelineConfig, run: Path, start: str | None, until: str | None, runner: Runner, dask_address: str | None) -> dict[str, Any]:
    workers = config.workers or default_workers()
    export_api_url()
    summary: dict[str, Any] = {"run": str(run.resolve()), "stages": []}
    funnel_drawn = False
    entries = stages_between(start, until, config)
    needs_runner = any(e.doc_stage for e in entries)
    task_runner = make_task_runner(runner, workers, dask_address) if needs_runner else None
    environ_before = dict(os.environ)  # a Dask LocalCluster sets OMP_NUM_THREADS=1 & co. for its workers
    if task_runner is not None:
        task_runner.__enter__()
    try:
        # On Dask, the global passes' per-shard work runs on the cluster too, and batches follow its worker count.
        on_dask = runner == Runner.dask and task_runner is not None
        cluster = on_dask_cluster(task_runner.client) if on_dask else nullcontext()
        with cluster, BackgroundPublisher() as artifacts:
            if on_dask:
                workers = cluster_workers(task_runner.client)
            for entry in entries:
                if entry.name == TRAINING_STAGE:  # the funnel is final: draw it while the model trains
                    artifacts.submit(draw_funnel, run)
                    funnel_drawn = True
                out = stage_path(run, entry.name, config)
                previous = previous_stage_path(run, entry.name, config)
                if entry.doc_stage is not None:
                    run_doc_stage(entry, config, previous, out, task_runner, workers)
                else:
                    whole_stage(entry.name, config, str(run), str(previous) if previous else None, str(out))
                manifest = read_manifest(out, verify=False)
                artifacts.submit(publish_stage_artifacts, run, entry.name, manifest)
                summary["stages"].append({"stage": entry.name, "dir": str(out), "digest": manifest.digest, "counts": manifest.counts})
    finally:
        if task_runner is not None:
            task_runner.__exit__(None, None, None)
        if os.environ != environ_before:
            os.environ.clear()
            os.environ.update(environ_before)
    extra_images = [p for p in [stage_path(run, "pretrain", config) / "loss.png"] if p.exists()] if "pretrain" in STAGE_BY_NAME else []
    publish_run_summary(run, extra_images, drawn=funnel_drawn)
    return summary


@flow(name="hymo-pipeline", log_prints=True)
def hymo_pipeline(
    config: PipelineConfig = PipelineConfig(),
    out: str = "runs/sample",
    until: str | None = None,
    runner: Runner = Runner.process,
    dask_address: str | None = None,
) -> dict[str, Any]:
    """The whole DAG, from sources to a trained checkpoint; the defaults run the bundled real sample."""
    run = Path(out)
    with run_lock(run):  # one writer per run directory: a second run fails naming this one
        atomic_write_text(run / RUN_CONFIG, json.dumps({"config": config.model_dump(mode="json"), "runner": runner.value}, indent=2) + "\n")
        return run_stages(config, run, None, until, runner, dask_address)
