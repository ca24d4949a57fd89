"""The one rich console every `hymo` subcommand prints to (so tests and subcommands share its width).

It is rich's global console, so the progress bars of stages and training (rich `Progress` with no console
of its own, in tasks/ and hymo_core/, which cannot import this package) draw on it too, and Prefect's log
lines are routed to it while a bar is live (`route_prefect_logs`): rich then prints each line above the bar
instead of over it; with no bar they stay on stderr, off the stdout that tables and `--json` use.
"""
from __future__ import annotations

import logging
import sys

from rich import get_console
from rich.text import Text

console = get_console()


def live_display_active() -> bool:
    """Whether a progress bar (a rich Live) is drawing on `console` now."""
    return bool(getattr(console, "_live_stack", None))


def route_prefect_logs() -> None:
    """While a progress bar is live, Prefect's console handler prints through `console` (rich then prints the line
    above the bar) rather than through its own console on stderr, in this process (the CLI). Otherwise a log line
    stays on stderr: once Prefect has set logging up it also carries the root logger's warnings (lm-eval's, say),
    and stdout is where `--json` and the tables go. Prefect re-creates its handlers whenever it sets logging up
    again, so the class is adjusted."""
    from prefect.logging.handlers import PrefectConsoleHandler

    if getattr(PrefectConsoleHandler, "_hymo_routed", False):
        return
    emit_on_stderr = PrefectConsoleHandler.emit

    def emit_on_shared_console(self: logging.Handler, record: logging.LogRecord) -> None:
        if not live_display_active():
            if getattr(self.stream, "closed", False):  # set up under a stderr that has since closed (a test's capture)
                self.stream = self.console.file = sys.stderr  # not setStream: it flushes the closed stream first
            emit_on_stderr(self, record)
            return
        try:
            console.print(Text(self.format(record)), soft_wrap=True)
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)

    PrefectConsoleHandler.emit = emit_on_shared_console
    PrefectConsoleHandler._hymo_routed = True
