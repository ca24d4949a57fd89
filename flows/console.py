"""The one rich console every `hymo` subcommand prints to (so tests and subcommands share its width).

It is rich's global console, so the progress bars of stages and training (rich `Progress` with no console
of its own, in tasks/ and hymo_core/, which cannot import this package) draw on it too, and Prefect's log
lines are routed to it (`route_prefect_logs`): rich then prints each line above a live bar instead of
over it.
"""
from __future__ import annotations

import logging

from rich import get_console
from rich.text import Text

console = get_console()


def route_prefect_logs() -> None:
    """Prefect's console handler prints through `console` rather than a console of its own on stderr, in this process
    (the CLI). Prefect re-creates its handlers whenever it sets logging up again, so the class is adjusted."""
    from prefect.logging.handlers import PrefectConsoleHandler

    if getattr(PrefectConsoleHandler, "_hymo_routed", False):
        return

    def emit_on_shared_console(self: logging.Handler, record: logging.LogRecord) -> None:
        try:
            console.print(Text(self.format(record)), soft_wrap=True)
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)

    PrefectConsoleHandler.emit = emit_on_shared_console
    PrefectConsoleHandler._hymo_routed = True
