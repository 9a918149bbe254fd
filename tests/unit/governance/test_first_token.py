"""A first-token limit is a failover trigger (SPEC §3 rule 17), in virtual time.

A slow first token is cut only where another source of the scope could serve the
call, and the call moves to it without a backoff; on the last source left the
attempt waits for its first token up to `timeout_s`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from polygate_celery import Gateway, Store, parse_config
from polygate_celery.core.breaker import Effect
from polygate_celery.governance.first_token import another_could_serve, could_serve
from polygate_celery.sources.payloads import ChatResult
from polygate_celery.store.base import AdmitRequest, Grant, Settlement, SourceSnapshot
from polygate_celery.testing import ScriptedSource, VirtualClock, steps
from tests.conftest import GatewayFactory, make_config

TTFT_S = 15.0  # the adapters' default first-token limit
PAIR = {"a": {}, "b": {}}


def streaming(clock: VirtualClock, *script: steps.Step) -> ScriptedSource:
    return ScriptedSource(clock, list(script), ttft_timeout_s=TTFT_S)


async def test_a_stuck_first_token_fails_over_at_the_limit_without_a_backoff(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    primary = streaming(clock, steps.stuck_first_token())
    fallback = streaming(clock, steps.streamed("from b", first_token_s=0.5, duration_s=1.0))
    gw = gateway(make_config("chat", PAIR), {"a": primary, "b": fallback})
    result = await gw.call("s", "hi")
    assert (result.source, result.value) == ("b", "from b")
    cut, served = result.attempts
    assert (cut.source, cut.outcome, cut.seconds) == ("a", "transient", TTFT_S)
    assert cut.reason == "no first token within ttft_timeout_s"
    assert served.started_s == TTFT_S  # no backoff between (it was 1 s at least)
    assert clock.now() == TTFT_S + 1.0
    assert primary.journal[0].ttft_s == TTFT_S
    await gw.aclose()


async def test_a_lone_sources_slow_first_token_is_waited_for_up_to_timeout_s(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    only = streaming(clock, steps.streamed("late", first_token_s=20.0, duration_s=22.0))
    gw = gateway(make_config("chat"), {"a": only})
    result = await gw.call("s", "hi")
    assert (result.source, result.value, len(result.attempts)) == ("a", "late", 1)
    assert clock.now() == 22.0
    assert only.journal[0].ttft_s is None
    assert only.journal[0].timeout_s == 60.0  # the default timeout_s bounds it alone
    await gw.aclose()


async def test_a_lone_sources_first_token_that_never_comes_times_out_at_timeout_s(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    only = streaming(clock, steps.stuck_first_token(), steps.chat("at last"))
    gw = gateway(make_config("chat"), {"a": only})
    result = await gw.call("s", "hi")
    first = result.attempts[0]
    assert (first.outcome, first.seconds) == ("transient", 60.0)
    assert first.reason != "no first token within ttft_timeout_s"
    assert result.value.text == "at last"
    assert result.attempts[1].started_s > 60.0  # an ordinary timeout keeps its backoff
    await gw.aclose()


async def test_a_source_the_call_excluded_does_not_count_as_another(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    rejecting = streaming(clock, steps.source_rejected())
    slow = streaming(clock, steps.streamed("slow but whole", first_token_s=20.0))
    gw = gateway(make_config("chat", {"b": {}, "a": {}}), {"a": slow, "b": rejecting})
    result = await gw.call("s", "a long prompt")
    assert [a.source for a in result.attempts] == ["b", "a"]
    assert (result.source, result.value) == ("a", "slow but whole")
    assert slow.journal[0].ttft_s is None
    await gw.aclose()


async def test_a_paused_fallback_does_not_count_as_another(
    clock: VirtualClock, gateway: GatewayFactory, store: Store
) -> None:
    slow = streaming(clock, steps.streamed("slow but whole", first_token_s=20.0))
    gw = gateway(make_config("chat", PAIR), {"a": slow, "b": streaming(clock)})
    await store.pause_source("b", 120.0)  # a long Retry-After
    result = await gw.call("s", "hi")
    assert (result.source, len(result.attempts)) == ("a", 1)
    assert slow.journal[0].ttft_s is None
    await gw.aclose()


async def test_a_fallback_whose_breaker_is_open_does_not_count_as_another(
    clock: VirtualClock, gateway: GatewayFactory, store: Store
) -> None:
    slow = streaming(clock, steps.streamed("slow but whole", first_token_s=20.0))
    gw = gateway(make_config("chat", PAIR), {"a": slow, "b": streaming(clock)})
    await open_breaker(gw, store, "b")
    assert (await gw.snapshot("s"))[1].breaker == "open"
    result = await gw.call("s", "hi")
    assert (result.source, len(result.attempts)) == ("a", 1)
    assert slow.journal[0].ttft_s is None
    await gw.aclose()


async def test_a_fallback_at_capacity_still_counts_as_another(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    """Capacity frees up within about a first token's wait, so a busy fallback still
    counts: the stuck first token is cut, and the call asks again at once (here the
    fallback is still busy at the first cut, and serves after the second)."""
    config = parse_config(
        {
            "sources": {"a": {}, "b": {"max_concurrency": 1}},
            "scopes": {
                "s": {"kind": "chat", "sources": ["a", "b"]},
                "only_b": {"kind": "chat", "sources": ["b"]},
            },
        }
    )
    primary = ScriptedSource.always(clock, steps.stuck_first_token(), ttft_timeout_s=TTFT_S)
    fallback = streaming(
        clock, steps.streamed("held", first_token_s=1.0, duration_s=20.0), steps.chat("served")
    )
    gw = gateway(config, {"a": primary, "b": fallback})
    holder = asyncio.ensure_future(gw.call("only_b", "holds b's one permit"))
    await clock.sleep(0.5)
    result = await gw.call("s", "hi")
    assert (result.source, result.value) == ("b", ChatResult("served", "stop"))
    assert [a.source for a in result.attempts] == ["a", "a", "b"]
    assert [sent.ttft_s for sent in primary.journal] == [TTFT_S, TTFT_S]
    assert result.attempts[2].started_s == 2 * TTFT_S  # no backoff after either cut
    assert (await holder).value == "held"
    await gw.aclose()


async def test_only_a_source_that_cuts_a_first_token_costs_a_look_at_the_others(
    clock: VirtualClock, gateway: GatewayFactory, store: Store
) -> None:
    looked: list[str] = []
    snapshot = store.snapshot

    async def counted(terms: Any) -> SourceSnapshot:
        looked.append(terms.name)
        return await snapshot(terms)

    store.snapshot = counted  # type: ignore[method-assign]
    plain = ScriptedSource(clock, [steps.chat("plain")])
    gw = gateway(make_config("chat", PAIR), {"a": plain, "b": streaming(clock)})
    assert (await gw.call("s", "hi")).source == "a"
    assert looked == []
    limited = streaming(clock, steps.streamed("streamed", first_token_s=1.0))
    gw2 = gateway(make_config("chat", PAIR), {"a": limited, "b": streaming(clock)})
    assert (await gw2.call("s", "hi")).source == "a"
    assert looked == ["b"]
    await gw.aclose()
    await gw2.aclose()


async def open_breaker(gw: Gateway, store: Store, source: str) -> None:
    """Settle consecutive transient failures of `source` until its breaker opens."""
    terms = gw.plan("s").terms[source]
    for n in range(terms.breaker.failure_threshold):
        grant = await store.admit(AdmitRequest("s", (terms,), f"probe-{n}"))
        assert isinstance(grant, Grant)
        failure = Settlement("s", terms, grant.permit_id, grant.admitted_at, Effect.FAILURE)
        await store.settle(failure)


def test_could_serve_reads_the_breaker_and_the_pause() -> None:
    def snap(breaker: Any = "closed", paused_for_s: float = 0.0) -> SourceSnapshot:
        return SourceSnapshot("b", 0, 8, breaker, 0, paused_for_s)

    assert could_serve(snap())
    assert could_serve(snap("half_open"))
    assert not could_serve(snap("open"))
    assert not could_serve(snap(paused_for_s=3.0))


async def test_a_lone_source_has_no_other_without_asking_the_store(clock: VirtualClock) -> None:
    config = parse_config(
        {"sources": {"a": {}}, "scopes": {"s": {"kind": "chat", "sources": ["a"]}}}
    )
    gw = Gateway(config, {"a": streaming(clock)}, clock=clock)

    class Unreachable:
        async def snapshot(self, terms: Any) -> SourceSnapshot:
            raise AssertionError("asked the store")

    assert not await another_could_serve(Unreachable(), gw.plan("s"), "a", ())  # type: ignore[arg-type]
    await gw.aclose()
