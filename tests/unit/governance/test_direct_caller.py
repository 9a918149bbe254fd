"""A direct caller cannot park (SPEC §3 rule 15 as amended), with default settings.

A `Gateway` call awaited by code, to a scope that never answered: its failures burn
the retry budget, so it ends `retry_exhausted` within its attempts and their
backoffs instead of a stall window. Fleet-wide evidence, an open breaker, still
makes it wait within its stall budget; a governed task (``caller="task"``) keeps
charging the same failures to waiting; a setting made explicitly holds for both.
"""

from __future__ import annotations

import pytest

from polygate_celery import AllSourcesExhausted
from polygate_celery.testing import ScriptedSource, VirtualClock, steps
from polygate_celery.testing.scripted import Step
from tests.conftest import GatewayFactory, make_config

FAULTS = [
    ("every request 503", steps.server_error(status=503), 0.0),
    ("refused connections", Step("server_error", reason="connection refused"), 0.0),
    ("a malformed answer", Step("server_error", status=200, reason="malformed body"), 0.0),
    ("timeouts (a silent route)", steps.timeout(), 10.0),
]


async def exhausted(call: object) -> AllSourcesExhausted:
    with pytest.raises(AllSourcesExhausted) as caught:
        await call  # type: ignore[misc]
    return caught.value


@pytest.mark.parametrize(("fault", "step", "each_s"), FAULTS)
async def test_a_direct_call_to_a_scope_that_never_answered_ends_retry_exhausted(
    clock: VirtualClock, gateway: GatewayFactory, fault: str, step: Step, each_s: float
) -> None:
    source = ScriptedSource.always(clock, step)
    gw = gateway(make_config("chat", {"a": {"timeout_s": 10}}), {"a": source})
    verdict = await exhausted(gw.call("s", "x"))
    assert verdict.reason == "retry_exhausted", fault
    assert source.attempts == 3  # max_attempts, the default
    assert all(a.burned_budget for a in verdict.trail)
    # three attempts and two backoffs (1 s, 2 s at u = 0), not a stall window
    assert clock.now() == pytest.approx(3 * each_s + 3.0)


async def test_an_open_breaker_makes_a_direct_call_wait_within_its_stall_budget(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    """The breaker (5 failures in a row) is fleet-wide evidence of the outage: the call
    that opens it, and the calls after it, wait (probing once per cooldown) until the
    stall budget is spent, without burning their retry budget on the probes."""
    source = ScriptedSource.always(clock, steps.server_error(status=503))
    gw = gateway(make_config("chat"), {"a": source})
    first = await exhausted(gw.call("s", "first"))
    assert (first.reason, source.attempts) == ("retry_exhausted", 3)
    began = clock.now()
    second = await exhausted(gw.call("s", "second"))
    assert second.reason == "stalled"
    assert [a.burned_budget for a in second.trail][:3] == [True, False, False]
    assert 300 <= clock.now() - began <= 300 + 30 + 60 + 10  # window, a cooldown, a backoff
    assert source.attempts <= 3 + 2 + 300 / 30 + 2  # about one probe per cooldown
    third = await exhausted(gw.call("s", "third", fail_fast=True))
    assert third.reason == "fail_fast"  # fail_fast: no wait for a breaker at all


async def test_a_task_charges_the_same_failures_to_waiting(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    source = ScriptedSource.always(clock, steps.server_error(status=503))
    gw = gateway(make_config("chat"), {"a": source}, caller="task")
    verdict = await exhausted(gw.call("s", "x"))
    assert verdict.reason == "stalled"
    assert not any(a.burned_budget for a in verdict.trail)


@pytest.mark.parametrize("caller", ["direct", "task"])
@pytest.mark.parametrize(("setting", "reason"), [(True, "stalled"), (False, "retry_exhausted")])
async def test_a_setting_made_explicitly_holds_for_every_caller(
    clock: VirtualClock, gateway: GatewayFactory, caller: str, setting: bool, reason: str
) -> None:
    source = ScriptedSource.always(clock, steps.server_error(status=503))
    config = make_config("chat", outage_is_waiting=setting)
    verdict = await exhausted(gateway(config, {"a": source}, caller=caller).call("s", "x"))
    assert verdict.reason == reason


async def test_a_direct_call_whose_source_serves_others_still_burns_its_budget(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    """Progress of the scope since the failure: the failure is the request's own."""
    source = ScriptedSource(
        clock, iter([steps.ok("other"), *[steps.server_error(status=500)] * 10])
    )
    gw = gateway(make_config("chat"), {"a": source})
    assert (await gw.call("s", "other")).value == "other"
    verdict = await exhausted(gw.call("s", "x"))
    assert verdict.reason == "retry_exhausted"
    assert source.attempts == 4
