"""A stage's upstream in the UI is exactly the stage before it, whatever addresses the flow's freed results left.

Prefect links a task's inputs to upstream runs by the `id()` of objects it walks (`FlowRunContext.run_results`),
and keeps those ids after a result of a built-in type (list, dict, str) is freed (PrefectHQ/prefect#20558). A
stage's wait_for once held two runs on CI: walking the previous stage's State reached an object at the recycled
address of an earlier run's freed result."""
from __future__ import annotations

from prefect import flow, task
from prefect.client.schemas.objects import RunType
from prefect.context import FlowRunContext
from prefect.utilities.collections import visit_collection
from prefect.utilities.engine import collect_task_run_inputs_sync

import pytest

from flows.pipeline import finished_upstream
from flows.shard_batch import shard_batch

pytestmark = pytest.mark.usefixtures("prefect_harness")


@task
def stage_like() -> dict:
    return {"stage": "x", "counts": {"kept": 3}, "files": ["a", "b"]}


def reachable(expr) -> list:
    seen: list = []
    visit_collection(expr, visit_fn=lambda obj: seen.append(obj), return_data=False, max_depth=-1)
    return seen


def test_a_stage_waits_for_the_previous_stage_only_when_its_results_objects_sit_at_recycled_addresses() -> None:
    @flow
    def chain() -> tuple[set, set]:
        earlier = stage_like(return_state=True)
        previous = stage_like(return_state=True)
        earlier.result()
        previous.result()
        runs = FlowRunContext.get().run_results
        stale = (earlier.model_copy(update={"data": None}), RunType.TASK_RUN, None)  # an id-only link, as for a list
        for obj in reachable([previous]):  # as if each had been allocated where a freed result of `earlier` lived
            runs.setdefault(id(obj), stale)
        upstream = {r.id for r in collect_task_run_inputs_sync([finished_upstream(previous)])}
        return upstream, {previous.state_details.task_run_id, earlier.state_details.task_run_id}

    upstream, both = chain()
    assert len(both) == 2
    assert len(upstream) == 1 and upstream < both, upstream


def test_a_shard_batchs_result_is_linked_by_a_weak_reference_so_its_address_is_not_linked_after_it_is_freed() -> None:
    @flow
    def one_batch() -> list:
        result = shard_batch(name="langid", first="00000", jobs=[])
        entry = FlowRunContext.get().run_results[id(result)]
        return [entry[2] is not None, entry[2]() is result if entry[2] else False]

    assert one_batch() == [True, True]
