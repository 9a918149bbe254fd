"""A RabbitMQ vhost of the tests' own, on the RabbitMQ of this machine (127.0.0.1:5672,
guest/guest), made with ``rabbitmqctl`` and deleted afterwards.

Where RabbitMQ does not answer, or ``rabbitmqctl`` is missing or may not add a
vhost (it needs root or the broker's Erlang cookie), the tests that use it skip
with the reason.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator

import pytest

HOST, PORT = "127.0.0.1", 5672


def rabbitmqctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["rabbitmqctl", *args], capture_output=True, text=True, timeout=120, check=False
    )


def unavailable() -> str | None:
    """Why the RabbitMQ tests cannot run here, or None."""
    if shutil.which("rabbitmqctl") is None:
        return "rabbitmqctl is not installed"
    try:
        socket.create_connection((HOST, PORT), timeout=2).close()
    except OSError as exc:
        return f"RabbitMQ does not answer at {HOST}:{PORT} ({exc})"
    return None


def _failed(done: subprocess.CompletedProcess[str]) -> str:
    lines = (done.stderr or done.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit status {done.returncode}"


@pytest.fixture(scope="session")
def rabbitmq_vhost() -> Iterator[str]:
    """The broker URL of a vhost of this test session's own (guest may use all of it)."""
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    name = f"polygate-tests-{uuid.uuid4().hex[:10]}"
    added = rabbitmqctl("add_vhost", name)
    if added.returncode != 0:
        pytest.skip(f"rabbitmqctl add_vhost failed: {_failed(added)}")
    try:
        allowed = rabbitmqctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
        assert allowed.returncode == 0, _failed(allowed)
        yield f"amqp://guest:guest@{HOST}:{PORT}/{name}"
    finally:
        rabbitmqctl("delete_vhost", name)
