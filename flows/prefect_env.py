"""Prefect defaults for a machine with no internet and few cores; a user's own settings win."""
from __future__ import annotations

import os

DEFAULTS = {
    # No telemetry: the machines this runs on often have no route out. The server's analytics, and the client's:
    # Prefect's SDK sends its own events unless DO_NOT_TRACK is set (prefect._internal.analytics.enabled).
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "PREFECT_CLOUD_ENABLE_ORCHESTRATION_TELEMETRY": "false",
    # A temporary server on a busy 2-core machine can take longer than Prefect's 20 s default.
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
}


def apply_prefect_defaults() -> None:
    """Set the defaults before Prefect is imported; variables already set are left alone."""
    for name, value in DEFAULTS.items():
        os.environ.setdefault(name, value)
