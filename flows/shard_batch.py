"""The task a document stage maps over the task runner: one batch of shard jobs.

A module of its own, importing only Prefect and the stage plumbing: a process
or Dask worker unpickles this task by reference, so whatever this module
imports every worker imports too. Importing it from flows.pipeline would pull
in every stage and the training core (torch), seconds of start-up per worker.
"""
from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.runner.stage_runner import run_shard_jobs


class ShardBatchResults(list):
    """A batch's shard results, in a list that takes weak references. Prefect links a task's result to its run by
    id(), and a plain list's link outlives the list: a later object at its address would read as this batch's result
    (PrefectHQ/prefect#20558). A weakly referenced result's link is checked against the object itself."""


@task(task_run_name="{name}-shards-{first}", cache_policy=NO_CACHE)
def shard_batch(name: str, first: str, jobs: list[tuple], pool_workers: int = 1) -> ShardBatchResults:
    """`pool_workers` above 1: the jobs run on this process's worker pool of that many workers (the flow's, on the
    process runner); 1: they run here, one after another (a Dask worker, the thread runner)."""
    return ShardBatchResults(run_shard_jobs(jobs, pool_workers))
