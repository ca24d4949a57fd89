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
