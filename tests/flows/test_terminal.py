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


def warn_through_prefects_console_handler(message: str, stream=None) -> None:
    """One warning through a fresh PrefectConsoleHandler (on `stream`, else the stderr of now), as routed by the CLI."""
    import logging

    from prefect.logging.handlers import PrefectConsoleHandler

    from flows.console import route_prefect_logs

    route_prefect_logs()
    handler = PrefectConsoleHandler(stream=stream)
    if stream is not None:
        stream.close()
    logger = logging.getLogger("hymo-terminal-probe")
    logger.addHandler(handler)
    try:
        logger.warning(message)
    finally:
        logger.removeHandler(handler)


def test_without_a_live_bar_log_lines_stay_off_stdout(capsys) -> None:
    """Once Prefect has set logging up, its console handler also carries the root logger's warnings (lm-eval's);
    with no bar to print above, they stay on stderr, so `hymo eval --harness lm-eval --json` prints only JSON."""
    warn_through_prefects_console_handler("hymo-probe-warning")
    captured = capsys.readouterr()
    assert "hymo-probe-warning" not in captured.out and "hymo-probe-warning" in captured.err


def test_a_handler_set_up_under_a_closed_stderr_prints_on_todays(capsys, tmp_path) -> None:
    """Prefect's console handler keeps the stderr it was made under. When that stream has closed since (a test's
    capture, a redirected stderr), a log line goes to today's stderr: before, the write failed, logging printed the
    error, and a flow with log_prints turned that print into another log line, recursing until Python stopped it."""
    warn_through_prefects_console_handler("hymo-probe-after-close", stream=open(tmp_path / "gone.log", "w"))  # flush raises once closed
    captured = capsys.readouterr()
    assert "hymo-probe-after-close" in captured.err and "Logging error" not in captured.err
