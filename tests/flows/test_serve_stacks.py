"""`hymo serve` prints where every thread is on SIGUSR1 and goes on serving (what a serve stuck after Ctrl-C waits for)."""
from __future__ import annotations

import signal
import time


def test_sigusr1_prints_every_threads_stack_and_serving_goes_on(served) -> None:
    from prefect.client.orchestration import get_client

    log, process = served["log"], served["process"]
    before = log.stat().st_size
    process.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 30
    while "most recent call first" not in (text := log.read_bytes()[before:].decode(errors="replace")):
        assert time.monotonic() < deadline, "no stack dump in the serve log after SIGUSR1"
        time.sleep(0.5)
    assert "Current thread" in text or "Thread 0x" in text
    assert process.poll() is None
    with get_client(sync_client=True) as client:
        assert client.read_deployment_by_name("hymo-pipeline/full").name == "full"
