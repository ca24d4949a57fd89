"""Where HyMo looks for, or starts, its Prefect server when PREFECT_API_URL names one that does not answer."""
from __future__ import annotations

import pytest

from flows.server import prefect_api


def test_an_unanswered_remote_api_is_an_error_not_a_local_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFECT_API_URL", "http://prefect.invalid:4200/api")
    with pytest.raises(ConnectionError, match="prefect.invalid:4200/api does not answer"):
        with prefect_api():
            pass
