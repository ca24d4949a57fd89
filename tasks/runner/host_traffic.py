"""What a global pass moves between the flow host and its tasks, counted, so host memory is testable without timing.

A planning process that receives a per-document array from every task holds
O(N) bytes however it frees them later; one that only exchanges file paths,
digests and per-partition counts holds O(shards × partitions). The stage
runner reports every job it sends and every result it gets back to the
counter that is active (none by default: nothing is pickled twice in a real
run). Tests run a pass on corpora of growing size at one shard size and check
that the bytes per shard do not grow.
"""
from __future__ import annotations

import pickle
from collections import defaultdict
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Iterator


@dataclass
class HostTraffic:
    """Pickled bytes of the jobs sent and the results received, per map label."""

    job_bytes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    result_bytes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    jobs: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    largest_result: int = 0
    largest_job: int = 0

    def add_job(self, label: str, job: tuple) -> None:
        size = len(pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL))
        self.jobs[label] += 1
        self.job_bytes[label] += size
        self.largest_job = max(self.largest_job, size)

    def add_result(self, label: str, result: Any) -> None:
        size = len(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
        self.result_bytes[label] += size
        self.largest_result = max(self.largest_result, size)

    def total(self) -> int:
        return sum(self.job_bytes.values()) + sum(self.result_bytes.values())


ACTIVE: ContextVar[HostTraffic | None] = ContextVar("hymo_host_traffic", default=None)


@contextmanager
def count_host_traffic() -> Iterator[HostTraffic]:
    """Count every job and result of the runner's maps inside the block (process pool, inline or Dask alike)."""
    traffic = HostTraffic()
    token = ACTIVE.set(traffic)
    try:
        yield traffic
    finally:
        ACTIVE.reset(token)
