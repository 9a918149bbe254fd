"""What the loop tells the store after each attempt (its settlement), and the verdict
event each way a call can end."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from polygate_celery import (
    AllSourcesExhausted,
    GovernanceBackendError,
    MemoryStore,
    Outcome,
    SourceFatalError,
)
from polygate_celery.core.breaker import Effect
from polygate_celery.core.outcome import OutcomeKind, RateLimits
from polygate_celery.store import AdmitRequest, Denial, Grant
from polygate_celery.telemetry import VerdictEvent
from polygate_celery.testing import ScriptedSource, VirtualClock, steps
from tests.conftest import GatewayFactory, Recorder, make_config
from tests.unit.governance.recording import Answers, RecordingStore

LIMITS = RateLimits(requests_limit=60, requests_remaining=59, tokens_limit=9000)


@pytest.mark.parametrize(
    ("outcome", "congested", "pause_s", "used"),
    [
        (Outcome.success("ok", prompt_tokens=30, completion_tokens=12, limits=LIMITS),
         False, None, 42),
        (Outcome.success("ok", limits=LIMITS), False, None, 500),  # no usage: the estimate
        (Outcome.rate_limited(20, limits=LIMITS), True, 20.0, 0),
        (Outcome(OutcomeKind.TRANSIENT, reason="timeout", timed_out=True, limits=LIMITS),
         True, None, 0),
        (Outcome.transient("unavailable", status=503, retry_after_s=30, limits=LIMITS),
         False, None, 0),
    ],
    ids=["success", "success-without-usage", "429", "timeout", "503-with-retry-after"],
)  # fmt: skip
async def test_an_attempt_settles_what_its_answer_says(
    clock: VirtualClock,
    own_store_gateway: GatewayFactory,
    outcome: Outcome,
    congested: bool,
    pause_s: float | None,
    used: int,
) -> None:
    """Tokens: the reported usage, else (a success) the estimate, else none. A 429 or a
    timeout is congestion; only a 429's Retry-After pauses the source. The provider's
    rate-limit headers go to the store as they came."""
    store = RecordingStore(clock)
    source = Answers(outcome, Outcome.success("later"))
    config = make_config("chat", max_attempts=1, outage_is_waiting=False)
    gw = own_store_gateway(config, {"a": source}, store=store)
    with contextlib.suppress(AllSourcesExhausted):  # the failures spend the one attempt
        await gw.call("s", "x", est_tokens=500)
    first = store.settlements[0]
    assert (first.scope, first.source.name, first.est_tokens) == ("s", "a", 500)
    assert (first.congested, first.pause_s, first.used_tokens) == (congested, pause_s, used)
    assert first.limits == LIMITS
    await gw.aclose()


async def test_a_success_whose_recording_fails_is_returned_and_logged(
    clock: VirtualClock, own_store_gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    store = RecordingStore(clock, settle_fails=True)
    gw = own_store_gateway(
        make_config("chat"), {"a": Answers(Outcome.success("paid"))}, store=store
    )
    with caplog.at_level(logging.ERROR, logger="polygate_celery"):
        assert (await gw.call("s", "x")).value == "paid"
    (record,) = [r for r in caplog.records if r.name.startswith("polygate_celery")]
    assert record.getMessage() == (
        "scope 's': recording a success of source 'a' failed; result returned"
    )
    assert record.exc_info is not None
    assert record.exc_info[0] is GovernanceBackendError
    await gw.aclose()


class UnreachableStore(MemoryStore):
    async def admit(self, request: AdmitRequest) -> Grant | Denial:
        raise GovernanceBackendError("connection refused")


async def test_each_way_a_call_ends_is_reported_as_its_verdict(
    clock: VirtualClock,
    gateway: GatewayFactory,
    own_store_gateway: GatewayFactory,
    recorder: Recorder,
) -> None:
    config = make_config("chat")
    fatal = gateway(config, {"a": Answers(Outcome.fatal("bad request", status=400))})
    with pytest.raises(SourceFatalError):
        await fatal.call("s", "x")
    down = own_store_gateway(config, {"a": Answers()}, store=UnreachableStore(clock))
    with pytest.raises(GovernanceBackendError):
        await down.call("s", "x")
    slow = gateway(config, {"a": ScriptedSource.always(clock, steps.ok(duration_s=60))})
    call = asyncio.ensure_future(slow.call("s", "x"))
    await clock.sleep(1)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert [(e.verdict, e.source) for e in recorder.of(VerdictEvent)] == [
        ("fatal", "a"),
        ("backend_error", None),
        ("cancelled", None),
    ]
    for gw in (fatal, down, slow):
        await gw.aclose()


@pytest.mark.parametrize(
    ("outcome", "effect"),
    [
        (Outcome(OutcomeKind.TRANSIENT, reason="timeout", timed_out=True), Effect.NEUTRAL),
        (Outcome.transient("unavailable", status=503), Effect.FAILURE),
    ],
    ids=["timeout", "503"],
)
async def test_only_a_timeout_the_deadline_cut_short_says_nothing_of_the_source(
    clock: VirtualClock, own_store_gateway: GatewayFactory, outcome: Outcome, effect: Effect
) -> None:
    """The call's 10 s left cut the source's 60 s timeout: a timeout then is the call's
    deadline, not the source's slowness, and neither fails it nor asks for a decrease;
    a 503 in the same attempt is the source's failure as ever."""
    store = RecordingStore(clock)
    config = make_config("chat", {"a": {"timeout_s": 60}}, max_call_s=10)
    gw = own_store_gateway(config, {"a": Answers(outcome)}, store=store)
    with contextlib.suppress(AllSourcesExhausted):
        await gw.call("s", "x")
    first = store.settlements[0]
    assert (first.effect, first.congested) == (effect, False)
    await gw.aclose()
