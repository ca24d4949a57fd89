"""The terminal during a run: Prefect's log lines go through the same rich console as the progress bars, so rich
prints them above a live bar instead of over it."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.usefixtures("prefect_harness")


def test_prefect_log_lines_print_through_the_progress_bars_console(monkeypatch) -> None:
    from prefect import flow, get_run_logger
    from rich.progress import Progress

    from flows.console import console, route_prefect_logs

    monkeypatch.setenv("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")
    route_prefect_logs()

    @flow(name="hymo-terminal-probe")
    def probe() -> None:
        get_run_logger().info("hymo-probe-line")

    bar = Progress()  # as the stage and training bars are made: no console of their own
    assert bar.console is console
    with console.capture() as captured:
        with bar:
            bar.add_task("stage", total=2)
            probe()
    assert "hymo-probe-line" in captured.get()
