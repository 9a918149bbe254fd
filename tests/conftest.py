"""Shared fixtures: virtual time, a real Redis, stores, and configurations in one line.

`store` is parametrized: every test that uses it (or the `gateway` fixture)
runs once on the in-memory store and once on the Redis store, both in virtual
time, so the loop's acceptance tests hold on both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import platform
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import pytest_asyncio

from polygate_celery import Gateway, GatewayConfig, MemoryStore, Store, parse_config
from polygate_celery.sources import Source
from polygate_celery.store.redis import RedisStore
from polygate_celery.telemetry import Event
from polygate_celery.testing import VirtualClock
from tests import soak
from tests.redis_server import RedisServer, reachable_redis

# Tests assert behaviour, not speed: no per-example deadline, which a busy core would trip.
hypothesis.settings.register_profile("polygate", deadline=None)
hypothesis.settings.load_profile("polygate")

# A key every simulated source uses; tests/integration/sources checks it never leaks.
CANARY_KEY = "sk-canary-7f3a9c1e5b2d4086"


def make_config(
    kind: str = "chat",
    sources: Mapping[str, Mapping[str, Any]] | None = None,
    **scope: Any,
) -> GatewayConfig:
    """A gateway configuration with one scope named "s" over `sources` (default: one, "a")."""
    sources = dict(sources or {"a": {}})
    return parse_config(
        {
            "sources": {name: dict(settings) for name, settings in sources.items()},
            "scopes": {"s": {"kind": kind, "sources": list(sources), **scope}},
        }
    )


class Recorder:
    """A telemetry hook that keeps every event."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def __call__(self, event: Event) -> None:
        self.events.append(event)

    def of(self, kind: type[Any]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


@pytest.fixture(autouse=True)
def _package_logger_reaches_caplog() -> None:
    """A Celery worker started by an earlier test raises the root logger to ERROR."""
    logging.getLogger().setLevel(logging.WARNING)
    logger = logging.getLogger("polygate_celery")
    logger.disabled = False
    logger.propagate = True
    logger.setLevel(logging.NOTSET)


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A real Redis: 127.0.0.1:6379 when it answers, else a private server for the session.

    ``POLYGATE_TEST_REDIS`` overrides it: a URL, or ``private`` to always start one.
    """
    choice = os.environ.get("POLYGATE_TEST_REDIS", "")
    url = None if choice == "private" else (choice or reachable_redis())
    if url is not None:
        yield url
        return
    with RedisServer() as server:
        yield server.url


@contextlib.contextmanager
def own_redis() -> Iterator[str]:
    """A private server for the one test (or session) that uses it, removed afterwards:
    a broker's queues, unacknowledged messages and results that no other run can see or
    empty, however many runs share the machine's Redis."""
    with RedisServer() as server:
        yield server.url


def unique_prefix() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


StoreFactory = Callable[[VirtualClock], Store]


@pytest_asyncio.fixture(params=["memory", "redis"])
async def store_factory(request: pytest.FixtureRequest) -> AsyncIterator[StoreFactory]:
    """Build stores of one kind on a given clock; Redis ones get their own prefix and clean up."""
    if request.param == "memory":
        yield MemoryStore
        return
    url = request.getfixturevalue("redis_url")
    made: list[RedisStore] = []

    def build(clock: VirtualClock) -> Store:
        # These tests judge the loop in virtual time, not Redis's latency: on a busy machine
        # a reply can take longer than the production 2 s socket timeout, which would become
        # a verdict (backend error) no test asked for. The outage tests set their own.
        store = RedisStore.from_url(url, prefix=unique_prefix(), clock=clock, socket_timeout_s=30)
        made.append(store)
        return store

    yield build
    for store in made:
        keys = [key async for key in store.client.scan_iter(match=store.keys.pattern)]
        if keys:
            await store.client.delete(*keys)
        await store.aclose()


@pytest.fixture
def store(store_factory: StoreFactory, clock: VirtualClock) -> Store:
    return store_factory(clock)


GatewayFactory = Callable[..., Gateway]


@pytest.fixture
def own_store_gateway(clock: VirtualClock, recorder: Recorder) -> GatewayFactory:
    """`gateway` for a test that passes a store of its own (``store=``): run once, not once
    per store kind, so that no test id names a store the test does not use."""

    def build(config: GatewayConfig, sources: Mapping[str, Source], **kwargs: Any) -> Gateway:
        kwargs.setdefault("random", lambda: 0.0)
        kwargs.setdefault("hooks", [recorder])
        return Gateway(config, sources, clock=clock, **kwargs)

    return build


@pytest.fixture
def gateway(own_store_gateway: GatewayFactory, store: Store) -> GatewayFactory:
    """Build a deterministic gateway: virtual clock, random source fixed at 0, events recorded."""

    def build(config: GatewayConfig, sources: Mapping[str, Source], **kwargs: Any) -> Gateway:
        kwargs.setdefault("store", store)
        return own_store_gateway(config, sources, **kwargs)

    return build


@pytest.fixture
def no_real_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any test that sleeps for real: unit tests run in virtual time only."""
    real_sleep = asyncio.sleep

    async def guarded_sleep(delay: float, result: Any = None) -> Any:
        if delay > 0:
            raise AssertionError(f"a unit test slept for real: asyncio.sleep({delay})")
        return await real_sleep(delay, result)

    def guarded_time_sleep(seconds: float) -> None:
        raise AssertionError(f"a unit test slept for real: time.sleep({seconds})")

    monkeypatch.setattr(asyncio, "sleep", guarded_sleep)
    monkeypatch.setattr(time, "sleep", guarded_time_sleep)


async def until(condition: Callable[[], bool], turns: int = 100_000) -> None:
    """Yield to the event loop until `condition` holds (a store round trip may be in flight)."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


# -- the soak tier's figures -------------------------------------------------------------------

_FIGURES: list[tuple[str, str]] = []
_PENDING: dict[str, list[str]] = {}
SOAK_RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "soak.md"

Figures = Callable[[str], None]


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Figures:
    """Record a test's measured figures: printed always, written to soak.md under ``make soak``
    only if the test then passes (a failing run's figures are no result)."""

    def record(text: str) -> None:
        print(text)
        _PENDING.setdefault(request.node.nodeid, []).append(text)

    return record


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        texts = _PENDING.pop(item.nodeid, [])
        if report.passed:
            _FIGURES.extend((item.nodeid, text) for text in texts)
    return report


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under ``make soak``, write this session's figures into soak.md, keeping the rows of
    tests it did not run (each row says which run measured it) unless their file ran
    without them (a test renamed or removed)."""
    if not soak.SOAK or not _FIGURES:
        return
    run = f"{time.strftime('%Y-%m-%d %H:%M')}, {_commit()}, exit {exitstatus}"
    files = {item.nodeid.split("::")[0] for item in session.items}
    ran = {item.nodeid for item in session.items}
    kept = {
        nodeid: row
        for nodeid, row in _soak_rows().items()
        if nodeid.split("::")[0] not in files or nodeid in ran
    }
    rows = kept | {nodeid: f"{text} | {run}" for nodeid, text in _FIGURES}
    lines = [
        "# Soak tier: heavy fault trials at full size",
        "",
        f"`make soak` on {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}. Each row comes from the run it names (a run of some "
        "of the tests rewrites their rows only), and only from tests that passed. The CI runs "
        "the same tests at smaller sizes, except the frozen-then-killed Redis run (soak only).",
        "",
        "| test | figures | run (commit, pytest exit status) |",
        "|---|---|---|",
    ]
    lines += [f"| `{nodeid}` | {row} |" for nodeid, row in rows.items()]
    SOAK_RESULTS.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _commit() -> str:
    """The checkout's commit, marked when its tree has changes (a run of what is not
    committed)."""
    root = SOAK_RESULTS.parents[2]

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    try:
        sha = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except OSError:
        return "commit unknown"
    return f"{sha or 'commit unknown'}{' with changes' if dirty else ''}"


def _soak_rows() -> dict[str, str]:
    """The rows of the committed soak.md that name their run: test id -> "figures | run"."""
    if not SOAK_RESULTS.exists():
        return {}
    rows = {}
    for line in SOAK_RESULTS.read_text(encoding="utf-8").splitlines():
        cells = line.split(" | ")
        if line.startswith("| `") and len(cells) == 3:
            rows[cells[0].removeprefix("| ").strip("`")] = f"{cells[1]} | {cells[2].rstrip(' |')}"
    return rows


def drop_result_subscriptions(app: Any) -> None:
    """Forget an app's result-backend subscriptions while its Redis still answers.

    Celery's Redis backend subscribes to every task's result when it is sent and
    unsubscribes when the `AsyncResult` is collected, which may happen in a later
    test, after a private server has gone: the unsubscribe then fails there.
    """
    consumer = app.backend.result_consumer
    consumer.stop()
    consumer.subscribed_to.clear()
    consumer._pending_unsubscribe.clear()
    consumer._pubsub = None
