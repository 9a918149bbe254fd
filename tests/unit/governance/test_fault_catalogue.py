"""The fault catalogue: one misbehaving preferred source and a healthy fallback, per fault.

Each case asserts where every attempt went, the gaps between attempts and the
call's time, in virtual time with the default settings (random source at 0, so
a backoff is half its nominal value: 1 s after the first failure). SPEC §5
"Failover discipline": the sources' order is the user's preference, so a
transient 5xx or connection error is retried once on the preferred source, a
short Retry-After is waited out on it, and anything else moves over at once.
"""

from __future__ import annotations

import itertools

import pytest

from polygate_celery import AllSourcesExhausted, SourceFatalError
from polygate_celery.testing import ScriptedSource, VirtualClock, steps
from polygate_celery.testing.scripted import Step
from tests.conftest import GatewayFactory, make_config
from tests.unit.governance.outage_sources import DownBetween

SOURCES = {"primary": {"timeout_s": 30}, "fallback": {"timeout_s": 30}}
MALFORMED_STREAM = "malformed stream: a chunk that is not JSON"


def pair(clock: VirtualClock, primary: list[Step]) -> dict[str, ScriptedSource]:
    """`primary` plays its steps, then answers; the fallback always answers."""
    return {
        "primary": ScriptedSource(clock, itertools.chain(primary, itertools.repeat(steps.ok("p")))),
        "fallback": ScriptedSource.always(clock, steps.ok("f")),
    }


def where(sources: dict[str, ScriptedSource]) -> list[tuple[str, float]]:
    """Every attempt, in order: (source, virtual time it was sent)."""
    sent = [(name, s.at) for name, source in sources.items() for s in source.journal]
    return sorted(sent, key=lambda item: item[1])


@pytest.mark.parametrize(
    ("fault", "step"),
    [
        ("a 500", steps.server_error(status=500)),
        ("a 503", steps.server_error(status=503)),
        ("a refused connection", Step("server_error", reason="connection refused")),
    ],
)
async def test_one_transient_failure_is_retried_on_the_preferred_source(
    clock: VirtualClock, gateway: GatewayFactory, fault: str, step: Step
) -> None:
    sources = pair(clock, [step])
    result = await gateway(make_config("chat", SOURCES), sources).call("s", "x")
    assert result.source == "primary", fault
    assert where(sources) == [("primary", 0.0), ("primary", 1.0)]  # after the backoff
    assert clock.now() == 1.0


async def test_a_second_failure_in_a_row_moves_to_the_fallback(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    sources = pair(clock, [steps.server_error(status=502)] * 2)
    result = await gateway(make_config("chat", SOURCES), sources).call("s", "x")
    assert result.source == "fallback"
    # backoff 1 s, then 2 s (the call's second failure)
    assert where(sources) == [("primary", 0.0), ("primary", 1.0), ("fallback", 3.0)]


@pytest.mark.parametrize(
    ("fault", "step", "took"),
    [
        ("a timeout (a silent route)", steps.timeout(), 30.0),
        ("a malformed answer", Step("server_error", status=200, reason="malformed body"), 0.0),
        # what the adapters report for a stream they could not read: its own 2xx status
        ("a malformed stream", Step("server_error", status=200, reason=MALFORMED_STREAM), 0.0),
        ("a context length rejection", steps.source_rejected(), 0.0),
        ("rejected credentials", steps.auth_rejected(), 0.0),
    ],
)
async def test_other_failures_move_to_the_fallback_at_once(
    clock: VirtualClock, gateway: GatewayFactory, fault: str, step: Step, took: float
) -> None:
    sources = pair(clock, [step])
    result = await gateway(make_config("chat", SOURCES), sources).call("s", "x")
    assert result.source == "fallback", fault
    assert [name for name, _ in where(sources)] == ["primary", "fallback"]
    assert clock.now() == took + 1.0  # the attempt, then one backoff


async def test_a_fatal_answer_is_raised_at_once_without_the_fallback(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    sources = pair(clock, [steps.fatal("content policy")])
    with pytest.raises(SourceFatalError, match="content policy"):
        await gateway(make_config("chat", SOURCES), sources).call("s", "x")
    assert where(sources) == [("primary", 0.0)]


@pytest.mark.parametrize("kind", ["chat", "embedding"])
async def test_a_short_retry_after_is_waited_out_on_the_preferred_source(
    clock: VirtualClock, gateway: GatewayFactory, kind: str
) -> None:
    sources = pair(clock, [steps.rate_limited(retry_after_s=2)])
    result = await gateway(make_config(kind, SOURCES), sources).call("s", "x")
    assert result.source == "primary"
    ((_, first), (again, at)) = where(sources)
    assert (again, first) == ("primary", 0.0)
    assert 2.0 <= at <= 3.0  # the hint, then at most one poll
    assert sources["fallback"].attempts == 0


async def test_a_long_retry_after_fails_over_at_once(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    sources = pair(clock, [steps.rate_limited(retry_after_s=30)])
    result = await gateway(make_config("chat", SOURCES), sources).call("s", "x")
    assert result.source == "fallback"
    assert where(sources) == [("primary", 0.0), ("fallback", 1.0)]  # after the backoff


async def test_a_short_retry_after_on_the_fallback_does_not_hold_the_call_there(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    """Only the first choice is waited for; the fallback's own 429 sends the call on."""
    sources = {
        "primary": ScriptedSource(clock, iter([steps.timeout(), *[steps.ok("p")] * 5])),
        "fallback": ScriptedSource.always(clock, steps.rate_limited(retry_after_s=2)),
    }
    result = await gateway(make_config("chat", SOURCES), sources).call("s", "x")
    assert result.source == "primary"
    assert [name for name, _ in where(sources)] == ["primary", "fallback", "primary"]


async def test_429s_without_a_hint_back_off_on_their_streak(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    """One source answering 429 forever, no Retry-After: one call until its stall
    verdict (300 s) sends a handful of requests, the gaps doubling to the cap."""
    source = ScriptedSource.always(clock, steps.rate_limited())
    with pytest.raises(AllSourcesExhausted) as caught:
        await gateway(make_config("chat"), {"a": source}).call("s", "x")
    assert caught.value.reason == "stalled"
    sent = [s.at for s in source.journal]
    gaps = [b - a for a, b in itertools.pairwise(sent)]
    assert gaps[:6] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0]  # backoff_max_s 60, halved at u = 0
    assert set(gaps[5:]) == {30.0}
    assert len(sent) <= 15


async def test_a_recovered_preferred_source_gets_traffic_back_within_15_s(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    """Primary down for 60 s, one request every 4 s: served by the fallback meanwhile,
    failing probes at most one per cooldown, and back on the primary within 15 s."""
    primary = DownBetween(clock, 0.0, 60.0)
    sources = {"primary": primary, "fallback": ScriptedSource.always(clock, steps.ok("f"))}
    gw = gateway(make_config("chat", SOURCES), sources)
    served: list[tuple[float, str]] = []
    for n in range(30):
        clock.advance(n * 4.0 - clock.now())
        result = await gw.call("s", f"r{n}")
        served.append((n * 4.0, result.source))
    back = min(t for t, source in served if t >= 60 and source == "primary")
    assert back - 60.0 <= 15.0
    failing = [t for t, up in primary.sent if not up]
    opened = failing[5:]  # after the breaker opened (5 failures): probes only
    assert all(b - a >= 10.0 for a, b in itertools.pairwise(opened))  # one per cooldown


async def test_fail_fast_never_waits_out_a_short_retry_after(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    sources = pair(clock, [steps.rate_limited(retry_after_s=4)])
    gw = gateway(make_config("chat", SOURCES), sources)
    result = await gw.call("s", "x", fail_fast=True)
    assert result.source == "fallback"
