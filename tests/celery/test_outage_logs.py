"""What a worker's log says of an outage: each state change once, with the source's error
(also where the call that met the change sent nothing: the fleet's evidence), the task
parked (not dropped), the breaker's probe, its recovery; and no transport line per
request."""

from __future__ import annotations

import logging
import re
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis as sync_redis

from polygate_celery.celery.worker import quiet_transport_loggers
from polygate_celery.errors import DeferralBudgetExceeded
from polygate_celery.testing.simulator import SimulatedProvider
from tests.celery.app import app, ask, ask_in
from tests.celery.conftest import MODELS, Worker, config_data
from tests.celery.workers import celery_worker

REFUSED = "main: transient: connection refused"
COOLDOWN_S = 20.0  # the time the test has to bring the provider back before the probe


@pytest.fixture
def closed_port() -> int:
    """A local port nobody listens on (yet): connections to it are refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def down_settings(redis_url: str, prefix: str, port: int, **overrides: Any) -> dict[str, Any]:
    """The test worker's settings, with source `main` at `port` (both scopes' sources)."""
    data = config_data(
        SimpleNamespace(url=f"http://127.0.0.1:{port}/v1"),  # type: ignore[arg-type]
        redis_url,
        prefix,
        **overrides,
    )
    data["sources"]["main"]["model"] = "up"
    return data


def wait_for(path: Path, pattern: str, timeout_s: float = 90.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if re.search(pattern, text):
            return text
        time.sleep(0.1)
    raise AssertionError(f"no line matching {pattern!r} in the worker's log:\n{text}")


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    prefix = f"logs-{uuid.uuid4().hex[:10]}"
    yield prefix
    client = sync_redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match=f"{{{prefix}}}*"):
        client.delete(key)


def test_an_outage_is_logged_once_per_change_and_success_quietly(
    redis_url: str, broker: str, prefix: str, closed_port: int, tmp_path: Path
) -> None:
    settings = down_settings(
        redis_url,
        prefix,
        closed_port,
        deferral={"max_delay_s": 120},  # a parked task waits out the breaker's estimate
    )
    settings["sources"]["main"]["breaker"] = {"cooldown_s": COOLDOWN_S}
    # A second scope on the same source: its calls meet the breaker the first one opened.
    settings["scopes"]["side"] = {**settings["scopes"]["chat"]}
    log = tmp_path / "worker.log"
    app.conf.update(broker_url=broker, result_backend=broker, task_default_queue="polygate-tests")
    with celery_worker(settings, broker, tmp_path, loglevel="INFO", logfile=log):
        down = ask.delay("during the outage")
        wait_for(log, rf"{down.id} PARKED")
        wait_for(log, r"source 'main' is failing")
        side = ask_in.delay("side", "refused by the open breaker")  # its gate is open
        wait_for(log, rf"{side.id} PARKED")
        gated = ask.delay("refused by the closed gate")
        wait_for(log, rf"{gated.id} PARKED")
        with SimulatedProvider(MODELS, port=closed_port):  # the source answers again
            assert down.get(timeout=120) == "fine"
            assert gated.get(timeout=120) == "fine"
            assert side.get(timeout=120) == "fine"
            assert ask.delay("after it").get(timeout=60) == "fine"
            wait_for(log, r"scope 'chat' answers again")
            wait_for(log, r"scope 'side' answers again")
            time.sleep(1.0)  # the last lines reach the file
            text = log.read_text()
    lines = text.splitlines()

    def once(fragment: str) -> str:
        found = [line for line in lines if fragment in line]
        assert len(found) == 1, (fragment, found, text)
        return found[0]

    def first(fragment: str) -> str:
        """A task's deferral line: its first (a parked task may come back as the scope's
        probe while the source is still down, and park again: a deferral of its own)."""
        found = [line for line in lines if fragment in line]
        assert found, (fragment, text)
        return found[0]

    opened = once("source 'main' is failing")
    assert "WARNING" in opened
    assert "(transient: connection refused): breaker open" in opened
    closed = once("scope 'chat' stalled (last error")
    assert "WARNING" in closed
    assert f"last error: {REFUSED}" in closed
    parked = first(f"task {down.id} PARKED, not dropped: scope 'chat' stalled")
    assert f"(sources: main; last error: {REFUSED})" in parked
    ignored = first(f"Task tests.celery.app.ask[{down.id}] ignored")
    # Refused by the gate, or its probe refused by the open breaker: nothing tried, and
    # the last error is the fleet's (the gate's, the breaker's), never "none".
    refused = f"(sources: none tried: refused before sending; last error: {REFUSED})"
    assert refused in first(f"task {gated.id} PARKED, not dropped: scope 'chat' stalled")
    # Scope 'side' never sent a request: the open breaker refused it, and said why.
    side_closed = once("scope 'side' stalled (last error")
    assert "WARNING" in side_closed
    assert f"last error: {REFUSED}" in side_closed
    assert refused in first(f"task {side.id} PARKED, not dropped: scope 'side' stalled")
    assert "last error: none" not in text
    half_open = once("source 'main' breaker half-open: one probe request after")
    assert "WARNING" in half_open
    assert "(last error: transient: connection refused)" in half_open
    assert lines.index(parked) < lines.index(ignored)  # read next to each other
    recovered = once("source 'main' recovered: a request succeeded; breaker closed")
    assert "INFO" in recovered
    assert lines.index(opened) < lines.index(half_open) < lines.index(recovered)
    assert "INFO" in once("scope 'chat' answers again (source 'main' succeeded)")
    assert "INFO" in once("scope 'side' answers again (source 'main' succeeded)")
    assert "still failing" not in text  # the provider was back before the probe
    assert "HTTP Request" not in text  # three successes, no transport line
    assert "sk-" not in text


def test_a_spent_deferral_budget_names_the_last_error_in_the_result(
    governed_worker: Worker, closed_port: int
) -> None:
    settings = {
        "sources": down_settings("", "", closed_port)["sources"],
        "deferral": {"max_deferrals": 0},  # the first stalled verdict spends it
    }
    with governed_worker(**settings):
        result = ask.delay("down")
        with pytest.raises(DeferralBudgetExceeded) as caught:
            result.get(timeout=60)
    failure = caught.value  # rebuilt from the JSON result backend, as Flower reads it
    assert failure.reason == "stalled"
    assert failure.scope == "chat"
    assert failure.last_error == REFUSED
    assert (failure.source, failure.status) == ("main", None)
    assert str(failure).endswith(f"last verdict: stalled; last error: {REFUSED}")
    assert result.state == "FAILURE"
    assert REFUSED in str(result.result)


def test_transport_loggers_are_quieted_unless_a_level_was_set_on_them() -> None:
    httpx_logger, httpcore_logger = logging.getLogger("httpx"), logging.getLogger("httpcore")
    before = httpx_logger.level, httpcore_logger.level
    try:
        httpx_logger.setLevel(logging.NOTSET)
        httpcore_logger.setLevel(logging.DEBUG)  # the user's choice
        assert quiet_transport_loggers() == ["httpx"]
        assert httpx_logger.level == logging.WARNING
        assert httpcore_logger.level == logging.DEBUG
        assert quiet_transport_loggers() == []  # set now: kept as it is
    finally:
        httpx_logger.setLevel(before[0])
        httpcore_logger.setLevel(before[1])
