"""How the loop acts on each outcome: fatal, rejected, transient, 429, settle failures."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from polygate_celery import GovernanceBackendError, MemoryStore, SourceFatalError
from polygate_celery.core.breaker import Effect
from polygate_celery.store import Settlement
from polygate_celery.telemetry import SourceAlertEvent
from polygate_celery.testing import ScriptedSource, VirtualClock, steps
from tests.conftest import GatewayFactory, Recorder, make_config

TWO = {"a": {}, "b": {}}


async def test_fatal_raises_at_once_without_retry(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    a = ScriptedSource(clock, [steps.fatal("content policy violation")])
    b = ScriptedSource.always(clock, steps.ok())
    gw = gateway(make_config("chat", TWO), {"a": a, "b": b})

    with pytest.raises(SourceFatalError) as caught:
        await gw.call("s", "x")

    assert caught.value.reason == "content policy violation"
    assert (caught.value.source, caught.value.status, caught.value.attempts) == ("a", 400, 1)
    assert (a.attempts, b.attempts, clock.now()) == (1, 0, 0.0)


async def test_rejected_source_moves_to_another_and_is_not_retried(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    a = ScriptedSource.always(clock, steps.source_rejected("context length exceeded"))
    b = ScriptedSource(clock, [steps.server_error(), steps.server_error(), steps.ok("b")])
    gw = gateway(make_config("chat", TWO, max_attempts=5), {"a": a, "b": b})

    result = await gw.call("s", "x")

    assert result.source == "b"
    assert a.attempts == 1  # excluded for the rest of the call, though it is the priority
    assert [r.source for r in result.attempts] == ["a", "b", "b", "b"]


async def test_rejected_everywhere_is_fatal(clock: VirtualClock, gateway: GatewayFactory) -> None:
    a = ScriptedSource.always(clock, steps.source_rejected("model not found"))
    b = ScriptedSource.always(clock, steps.source_rejected("context length exceeded"))
    gw = gateway(make_config("embedding", TWO, max_attempts=5), {"a": a, "b": b})

    with pytest.raises(SourceFatalError) as caught:
        await gw.call("s", "x")

    assert caught.value.reason == "no source left: context length exceeded"
    assert (a.attempts, b.attempts) == (1, 1)


async def test_after_transient_failure_next_attempt_prefers_another_source(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    a = ScriptedSource(clock, [steps.server_error(status=503)] * 2 + [steps.ok("a")])
    b = ScriptedSource(clock, [steps.timeout(), steps.ok("b")])
    # four attempts: a direct call's three failures here all burn its retry budget
    gw = gateway(make_config("ocr", TWO, max_attempts=4), {"a": a, "b": b})

    result = await gw.call("s", "x")

    # a's 503 is retried once on a (same_source_retries); a fails again, b (untried) is
    # preferred; b times out (no retry on the same source), a (least recent) goes next.
    assert [r.source for r in result.attempts] == ["a", "a", "b", "a"]
    assert result.value == "a"


async def test_429_exactly_at_timeout_is_a_429(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    source = ScriptedSource(clock, [steps.rate_limited(duration_s=30), steps.ok()])
    gw = gateway(make_config("embedding", {"a": {"timeout_s": 30}}), {"a": source})

    result = await gw.call("s", "x")

    first = result.attempts[0]
    assert (first.outcome, first.status, first.seconds) == ("rate_limited", 429, 30.0)


async def test_a_step_past_the_timeout_is_a_timeout(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    source = ScriptedSource(clock, [steps.rate_limited(duration_s=30.5), steps.ok()])
    gw = gateway(make_config("embedding", {"a": {"timeout_s": 30}}), {"a": source})

    result = await gw.call("s", "x")

    assert (result.attempts[0].outcome, result.attempts[0].reason) == ("transient", "timeout")
    assert result.attempts[0].seconds == 30.0


class FailingSettleStore(MemoryStore):
    """Settles fail for the chosen effects, as when Redis is lost mid-call."""

    def __init__(self, clock: VirtualClock, fail_on: set[Effect]) -> None:
        super().__init__(clock)
        self.fail_on = fail_on

    async def settle(self, settlement: Settlement) -> bool:
        if settlement.effect in self.fail_on:
            raise GovernanceBackendError("connection refused")
        return await super().settle(settlement)


async def test_raising_settle_after_success_still_returns_the_result(
    clock: VirtualClock, own_store_gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    store = FailingSettleStore(clock, {Effect.SUCCESS})
    gw = own_store_gateway(
        make_config(), {"a": ScriptedSource.always(clock, steps.ok("paid"))}, store=store
    )

    result = await gw.call("s", "x")

    assert result.value == "paid"
    assert "recording a success" in caplog.text


async def test_raising_settle_after_failure_fails_closed(
    clock: VirtualClock, own_store_gateway: GatewayFactory
) -> None:
    store = FailingSettleStore(clock, {Effect.FAILURE})
    source = ScriptedSource.always(clock, steps.server_error())
    gw = own_store_gateway(make_config(), {"a": source}, store=store)

    with pytest.raises(GovernanceBackendError):
        await gw.call("s", "x")
    assert source.attempts == 1


class UnreachableStore(MemoryStore):
    async def admit(self, request):  # type: ignore[no-untyped-def]
        raise GovernanceBackendError("connection refused")


async def test_unreachable_store_sends_nothing(
    clock: VirtualClock, own_store_gateway: GatewayFactory
) -> None:
    source = ScriptedSource.always(clock, steps.ok())
    gw = own_store_gateway(make_config(), {"a": source}, store=UnreachableStore(clock))

    with pytest.raises(GovernanceBackendError):
        await gw.call("s", "x")
    assert source.attempts == 0


async def test_rejected_credentials_open_the_breaker_long_and_alert(
    clock: VirtualClock, gateway: GatewayFactory, recorder: Recorder
) -> None:
    a = ScriptedSource(clock, itertools.repeat(steps.auth_rejected()))
    b = ScriptedSource.always(clock, steps.ok("b"))
    config = make_config("chat", {"a": {"breaker": {"auth_cooldown_s": 600}}, "b": {}})
    gw = gateway(config, {"a": a, "b": b})

    assert (await gw.call("s", "x")).source == "b"
    assert (await gw.call("s", "y")).attempts[0].source == "b"  # a stays open for new calls

    snapshot = {s.name: s for s in await gw.snapshot("s")}
    assert snapshot["a"].breaker == "open"
    assert [e.source for e in recorder.of(SourceAlertEvent)] == ["a"]
    assert a.attempts == 1


async def test_result_carries_source_model_usage_and_trail(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    source = ScriptedSource(clock, [steps.server_error(), steps.ok("v", tokens=12, duration_s=2)])
    config = make_config("chat", {"a": {"model": "m-1"}})
    gw = gateway(config, {"a": source})

    result = await gw.call("s", "x")

    assert (result.source, result.model, result.completion_tokens) == ("a", "m-1", 12)
    trail = [replace(r, reason=None) for r in result.attempts]
    assert [(r.outcome, r.started_s, r.seconds) for r in trail] == [
        ("transient", 0.0, 0.0),
        ("success", 1.0, 2.0),
    ]
    assert result.elapsed_s == 3.0
