"""Polling helpers for tests that drive flow runs through the Prefect API."""
from __future__ import annotations

import time


def wait_for_flow_run(flow_run_id, timeout_s: float = 600):
    """Poll the API until the flow run reaches a final state; return the run."""
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while True:
            flow_run = client.read_flow_run(flow_run_id)
            if flow_run.state is not None and flow_run.state.is_final():
                return flow_run
            if time.monotonic() > deadline:
                raise TimeoutError(f"flow run {flow_run_id} still {flow_run.state.name if flow_run.state else None}")
            time.sleep(1)


def task_runs(flow_run_id, settle_s: float = 30.0) -> list:
    """The flow run's task runs once every one of them shows a final state.

    Prefect 3 clients report task-run states as events that the server stores
    asynchronously, so right after a flow returns a task run may still read as
    Running; poll (bounded) instead of reading once.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    deadline = time.monotonic() + settle_s
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            if all(r.state is not None and r.state.is_final() for r in runs) or time.monotonic() > deadline:
                return runs
            time.sleep(0.5)


def task_states(flow_run_id) -> dict[str, list[str]]:
    """Task run name -> the state names of its runs, oldest first."""
    runs = task_runs(flow_run_id)
    states: dict[str, list[str]] = {}
    for task_run in sorted(runs, key=lambda t: t.expected_start_time or t.created):
        states.setdefault(task_run.name, []).append(task_run.state.name if task_run.state else "?")
    return states


def create_from_deployment(parameters: dict | None = None, name: str = "hymo-pipeline/full"):
    """A flow run of the deployment as the UI's Run button makes it: the deployment's parameters, updated by `parameters`."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name(name)
        return client.create_flow_run_from_deployment(deployment.id, parameters=parameters or {})
