"""The HumanEval sandbox: a time limit that kills, and no network in either isolation mode."""
from __future__ import annotations

import socket
import time

import pytest

import hymo_core.eval.sandbox as sandbox
from hymo_core.eval.sandbox import run_program

CONNECT_TO = """
import socket, sys
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2).close()
except OSError:
    sys.exit(3)
"""


@pytest.fixture
def listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    yield server.getsockname()[1]
    server.close()


def test_an_endless_program_is_killed_at_the_timeout():
    started = time.monotonic()
    result = run_program("while True:\n    pass\n", timeout_s=1.0)
    assert result.status == "timeout" and not result.passed
    assert time.monotonic() - started < 30  # killed, not waited for (a generous bound for a loaded machine)


def test_a_program_cannot_reach_a_listening_port(listener):
    result = run_program(CONNECT_TO.format(port=listener), timeout_s=20)
    assert result.status == "failed" and not result.passed  # exit 3: the connection was refused


def test_the_socket_guard_blocks_connections_without_a_network_namespace(listener, monkeypatch):
    monkeypatch.setattr(sandbox, "isolation_prefix", lambda: ())
    assert sandbox.isolation_mode() == "guard"
    result = run_program(CONNECT_TO.format(port=listener), timeout_s=20)
    assert result.status == "failed"
    # the control: the same program outside the sandbox connects
    socket.create_connection(("127.0.0.1", listener), timeout=2).close()


def test_a_passing_program_passes_and_memory_is_bounded():
    assert run_program("assert sum(range(10)) == 45\n", timeout_s=20).passed
    hog = run_program("x = bytearray(4 << 30)\n", timeout_s=20)
    assert hog.status == "failed" and "MemoryError" in hog.detail
