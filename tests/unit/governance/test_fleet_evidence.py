"""A call refused before it sends anything names the fleet's evidence: the last error on
record of the source whose breaker (or pause) refused it, in its verdict, the gate's line
and a spent deferral budget; the call that takes a breaker's probe says it turned
half-open, once."""

from __future__ import annotations

import logging
import re

import pytest

from polygate_celery import AllSourcesExhausted, GatewayConfig, Store, parse_config
from polygate_celery.core.terms import SourceTerms
from polygate_celery.errors import DeferralBudgetExceeded
from polygate_celery.testing import ScriptedSource, VirtualClock, steps
from tests.conftest import GatewayFactory

COOLDOWN_S = 60
A = SourceTerms("a", 10)  # the snapshot reads the breaker only


def two_scopes() -> GatewayConfig:
    """Scopes "s" and "t" over one source "a", whose breaker opens on its second failure."""
    scope = {"kind": "chat", "sources": ["a"], "stall_window_s": 10, "max_attempts": 5}
    return parse_config(
        {
            "sources": {"a": {"breaker": {"failure_threshold": 2, "cooldown_s": COOLDOWN_S}}},
            "scopes": {"s": scope, "t": scope},
        }
    )


def messages(caplog: pytest.LogCaptureFixture, fragment: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("polygate_celery") and fragment in r.getMessage()
    ]


async def test_a_call_the_open_breaker_refuses_names_the_sources_last_error(
    clock: VirtualClock,
    gateway: GatewayFactory,
    store: Store,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="polygate_celery")
    source = ScriptedSource.always(clock, steps.server_error(status=503))
    gw = gateway(two_scopes(), {"a": source}, scope_gate=True)
    with pytest.raises(AllSourcesExhausted) as opened:
        await gw.call("s", "x")  # fails until it stalls; the breaker opens on the way
    assert (await store.snapshot(A)).breaker == "open"
    assert opened.value.last_error is not None
    evidence = opened.value.last_error  # "a: transient (HTTP 503): ..."
    assert evidence.startswith("a: transient (HTTP 503)")

    sent = source.attempts
    with pytest.raises(AllSourcesExhausted) as refused:
        await gw.call("t", "y")  # scope t's gate is open: the breaker refuses it
    assert source.attempts == sent  # nothing sent
    assert (refused.value.reason, refused.value.attempts) == ("stalled", 0)
    assert refused.value.last_error == evidence
    assert messages(caplog, "scope 't' stalled") == [
        f"scope 't' stalled (last error: {evidence}): gate closed, its tasks park, one probe "
        f"at a time for up to {refused.value.retry_after_s:.0f} s"
    ]
    spent = DeferralBudgetExceeded.after(refused.value, 3, 120.0)
    assert spent.last_error == evidence
    assert str(spent).endswith(f"last verdict: stalled; last error: {evidence}")


async def test_the_call_that_takes_the_breakers_probe_logs_half_open_once(
    clock: VirtualClock,
    gateway: GatewayFactory,
    store: Store,
    caplog: pytest.LogCaptureFixture,
) -> None:
    source = ScriptedSource(clock, [steps.server_error(status=503)] * 2 + [steps.ok("back")] * 2)
    gw = gateway(two_scopes(), {"a": source}, scope_gate=False)
    with pytest.raises(AllSourcesExhausted) as opened:
        await gw.call("s", "x", fail_fast=True)  # two failures open the breaker
    assert (await store.snapshot(A)).breaker == "open"
    caplog.set_level(logging.INFO, logger="polygate_celery")
    clock.advance(COOLDOWN_S)
    assert (await gw.call("t", "y")).value == "back"  # the probe, in the other scope
    assert (await gw.call("s", "z")).value == "back"  # closed: no probe, no line
    error = (opened.value.last_error or "").removeprefix("a: ")
    [half_open] = messages(caplog, "half-open")
    said = re.fullmatch(
        rf"source 'a' breaker half-open: one probe request after (\d+) s open "
        rf"\(last error: {re.escape(error)}\)",
        half_open,
    )
    assert said is not None, half_open
    assert COOLDOWN_S <= int(said[1]) <= COOLDOWN_S + 5  # opened a backoff before the verdict
    assert messages(caplog, "recovered") == [
        "source 'a' recovered: a request succeeded; breaker closed"
    ]
