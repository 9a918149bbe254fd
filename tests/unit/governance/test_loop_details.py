"""The loop's smaller promises: a queued call's wait (its deadline, what blocks it, a lost
place), a gate-refused call leaving the gate alone, what an alert and a result carry,
and permit ids unique to a process."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest

from polygate_celery import (
    AllSourcesExhausted,
    ConfigError,
    Gateway,
    MemoryStore,
    Outcome,
    SourceFatalError,
    Store,
)
from polygate_celery.core.engine import same_source_worth_retrying
from polygate_celery.governance import loop
from polygate_celery.sources.payloads import ChatRequest, EmbeddingRequest, OcrRequest
from polygate_celery.telemetry import AttemptEvent, SourceAlertEvent, VerdictEvent, WaitEvent
from polygate_celery.testing import ScriptedSource, VirtualClock, steps
from tests.conftest import GatewayFactory, Recorder, make_config
from tests.unit.governance.recording import Answers

ONE_PERMIT = {"a": {"max_concurrency": 1}}


async def hold_the_permit(gw: object, clock: VirtualClock) -> asyncio.Task[object]:
    holder = asyncio.ensure_future(gw.call("s", "holder"))  # type: ignore[attr-defined]
    await clock.sleep(0.5)
    return holder


async def test_a_queued_call_ends_at_its_deadline_to_the_instant(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    source = ScriptedSource.always(clock, steps.ok(duration_s=50))
    patient = gateway(make_config("chat", ONE_PERMIT, max_call_s=300), {"a": source})
    hasty = gateway(
        make_config("chat", ONE_PERMIT, max_call_s=10, stall_window_s=60, poll_interval_s=3),
        {"a": source},
    )  # fmt: skip  (1.5 s polls)
    holder = await hold_the_permit(patient, clock)  # the same store: one permit for both
    with pytest.raises(AllSourcesExhausted) as verdict:
        await hasty.call("s", "queued")
    assert verdict.value.reason == "deadline"
    assert clock.now() == 0.5 + 10.0
    assert source.attempts == 1  # the holder's
    await holder
    await patient.aclose()
    await hasty.aclose()


async def test_a_queued_calls_waits_say_what_blocks_it(
    clock: VirtualClock, gateway: GatewayFactory, recorder: Recorder
) -> None:
    source = ScriptedSource.always(clock, steps.ok(duration_s=30))
    gw = gateway(make_config("chat", ONE_PERMIT), {"a": source})
    holder = await hold_the_permit(gw, clock)
    assert (await gw.call("s", "queued")).value == "ok"
    await holder
    waits = [e for e in recorder.of(WaitEvent) if e.cause == "no_runnable"]
    assert waits
    assert {e.blocked for e in waits} == {(("a", "at_capacity"),)}
    assert {e.scope for e in waits} == {"s"}
    await gw.aclose()


async def test_a_queued_call_whose_place_is_lost_asks_again_then_not_at_its_poll(
    clock: VirtualClock, own_store_gateway: GatewayFactory, recorder: Recorder
) -> None:
    """The keeper renews every third of a claim (7 s for a 10 s poll): when the store no
    longer keeps the place (here the source was paused), the call asks again at once."""
    store = MemoryStore(clock)
    source = ScriptedSource.always(clock, steps.ok(duration_s=50))
    config = make_config("chat", ONE_PERMIT, poll_interval_s=10, stall_window_s=600)
    gw = own_store_gateway(config, {"a": source}, store=store, random=lambda: 0.99)
    holder = await hold_the_permit(gw, clock)
    queued = asyncio.ensure_future(gw.call("s", "queued"))
    await clock.sleep(1.0)
    await store.pause_source("a", 30.0)
    await clock.sleep(7.0)
    first = next(e for e in recorder.of(WaitEvent) if e.cause == "no_runnable")
    assert first.started_s == 0.0
    assert first.seconds == 7.0  # the keeper's renewal at 7.5, not the poll's end at 10.4
    queued.cancel()
    holder.cancel()
    await asyncio.gather(queued, holder, return_exceptions=True)
    await gw.aclose()


class GateCountingStore(MemoryStore):
    def __init__(self, clock: VirtualClock) -> None:
        super().__init__(clock)
        self.closings: list[float] = []

    async def close_gate(
        self,
        scope: str,
        seconds: float,
        reset: bool = False,
        call_id: str = "",
        error: str | None = None,
    ) -> bool:
        self.closings.append(seconds)
        return await super().close_gate(scope, seconds, reset, call_id, error)


async def test_a_call_the_gate_refuses_leaves_the_gate_as_it_is(
    clock: VirtualClock, own_store_gateway: GatewayFactory
) -> None:
    store = GateCountingStore(clock)
    source = ScriptedSource.always(clock, steps.ok("back"))
    config = make_config("chat", stall_window_s=10)
    gw = own_store_gateway(config, {"a": source}, store=store, scope_gate=True)
    await store.pause_source("a", 400)
    with pytest.raises(AllSourcesExhausted):
        await gw.call("s", "stalls")  # closes the gate
    assert len(store.closings) == 1
    probe = asyncio.ensure_future(gw.call("s", "probes"))
    await clock.sleep(0)
    for _ in range(3):
        with pytest.raises(AllSourcesExhausted) as refused:
            await gw.call("s", "refused")
        assert refused.value.reason == "stalled"
    assert len(store.closings) == 1  # the refused calls did not close it again
    with pytest.raises(AllSourcesExhausted):
        await probe
    await gw.aclose()


class GateFailingStore(MemoryStore):
    async def close_gate(
        self,
        scope: str,
        seconds: float,
        reset: bool = False,
        call_id: str = "",
        error: str | None = None,
    ) -> bool:
        raise ConnectionError("the store is gone")


async def test_a_gate_that_cannot_be_closed_is_logged_and_the_verdict_stands(
    clock: VirtualClock, own_store_gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    store = GateFailingStore(clock)
    source = ScriptedSource.always(clock, steps.ok())
    gw = own_store_gateway(make_config("chat", stall_window_s=10), {"a": source}, store=store,
                           scope_gate=True)  # fmt: skip
    await store.pause_source("a", 400)
    with (
        caplog.at_level(logging.WARNING, logger="polygate_celery"),
        pytest.raises(AllSourcesExhausted) as verdict,
    ):
        await gw.call("s", "stalls")
    assert verdict.value.reason == "stalled"
    (record,) = [r for r in caplog.records if "gate" in r.getMessage()]
    assert record.getMessage() == "scope 's': closing its gate failed"
    assert record.exc_info
    assert isinstance(record.exc_info[1], ConnectionError)
    await gw.aclose()


async def test_rejected_credentials_alert_names_the_source_and_the_cooldown(
    clock: VirtualClock, gateway: GatewayFactory, recorder: Recorder,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    a = ScriptedSource.always(clock, steps.auth_rejected())
    b = ScriptedSource.always(clock, steps.ok("b"))
    config = make_config("chat", {"a": {"breaker": {"auth_cooldown_s": 600}}, "b": {}})
    gw = gateway(config, {"a": a, "b": b})
    with caplog.at_level(logging.ERROR, logger="polygate_celery"):
        assert (await gw.call("s", "x")).source == "b"
    assert recorder.of(SourceAlertEvent) == [SourceAlertEvent("a", "credentials rejected", 600)]
    assert [r.getMessage() for r in caplog.records] == [
        "source 'a' rejected its credentials; breaker open for 600s"
    ]
    await gw.aclose()


class Counted:
    """A source whose answer says how many tokens the prompt and the completion took."""

    async def send(self, payload: object, *, timeout_s: float) -> Outcome:
        return Outcome.success("v", prompt_tokens=7, completion_tokens=3)


async def test_a_result_carries_the_prompt_and_completion_tokens(
    gateway: GatewayFactory,
) -> None:
    gw = gateway(make_config("chat"), {"a": Counted()})
    result = await gw.call("s", "x")
    assert (result.prompt_tokens, result.completion_tokens) == (7, 3)
    await gw.aclose()


def test_permit_ids_carry_a_random_prefix_of_their_process() -> None:
    ours, theirs = loop._new_permit_ids(), loop._new_permit_ids()
    first, second = next(ours), next(ours)
    assert re.fullmatch(r"[0-9a-f]{16}-0", first)
    assert second == first.removesuffix("0") + "1"
    assert next(theirs).split("-")[0] != first.split("-")[0]


@pytest.mark.parametrize(
    ("outcome", "same_source"),
    [
        (Outcome.transient("HTTP 500", status=500), True),
        (Outcome.transient("HTTP 503", status=503), True),
        (Outcome.transient("HTTP 408", status=408), True),
        (Outcome.transient("HTTP 409", status=409), True),
        (Outcome.transient("HTTP 410", status=410), False),
        (Outcome.transient("HTTP 499", status=499), False),
        (Outcome.transient("connection refused"), True),
        (Outcome.timeout(), False),
    ],
)
def test_which_failures_are_worth_a_second_try_at_the_same_source(
    outcome: Outcome, same_source: bool
) -> None:
    """A 5xx, 408, 409 or no answer at all: often gone on the next try. A timeout (a silent
    route) or another status moves on to the next source."""
    assert same_source_worth_retrying(outcome) is same_source


@pytest.mark.parametrize(
    ("outcome", "last_error"),
    [
        (Outcome.transient("server error", status=503), "a: transient (HTTP 503): server error"),
        (Outcome.transient("connection refused"), "a: transient: connection refused"),
        (Outcome.transient("", status=500), "a: transient (HTTP 500)"),
    ],
)
async def test_a_verdict_names_the_last_error_with_its_status_and_reason(
    gateway: GatewayFactory, outcome: Outcome, last_error: str
) -> None:
    gw = gateway(make_config("chat", outage_is_waiting=False), {"a": Answers(outcome)})
    with pytest.raises(AllSourcesExhausted) as verdict:
        await gw.call("s", "x")
    assert (verdict.value.reason, verdict.value.scope) == ("retry_exhausted", "s")
    assert verdict.value.last_error == last_error
    await gw.aclose()


async def test_same_source_retries_counts_each_retry_at_the_failed_source(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    a = ScriptedSource.always(clock, steps.server_error())
    b = ScriptedSource.always(clock, steps.ok("b"))
    config = make_config("chat", {"a": {}, "b": {}}, same_source_retries=2, max_attempts=5,
                         outage_is_waiting=False)  # fmt: skip
    gw = gateway(config, {"a": a, "b": b})
    result = await gw.call("s", "x")
    assert [r.source for r in result.attempts] == ["a", "a", "a", "b"]  # a, then twice again
    await gw.aclose()


@pytest.mark.parametrize(("retry_after_s", "next_source"), [(5.0, "a"), (5.5, "b")])
async def test_a_retry_after_as_long_as_the_wait_out_limit_is_waited_out(
    clock: VirtualClock, gateway: GatewayFactory, retry_after_s: float, next_source: str
) -> None:
    a = ScriptedSource(clock, [steps.rate_limited(retry_after_s=retry_after_s), steps.ok("a")])
    b = ScriptedSource.always(clock, steps.ok("b"))
    config = make_config("chat", {"a": {}, "b": {}}, wait_out_retry_after_s=5.0)
    gw = gateway(config, {"a": a, "b": b})
    result = await gw.call("s", "x")
    assert [r.source for r in result.attempts] == ["a", next_source]
    await gw.aclose()


async def test_a_success_at_the_very_instant_a_call_began_is_not_progress_since(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    """Rule 15: a failure counts as the call's own only if a call of the scope succeeded
    after the call began; one at that same instant does not tell its failure from an
    outage, so it is charged to waiting, and the call goes on (one attempt allowed)."""
    source = ScriptedSource(
        clock, [steps.ok("other"), steps.server_error(duration_s=1.0), steps.ok("mine")]
    )
    gw = gateway(make_config("chat", max_attempts=1), {"a": source}, caller="task")
    assert (await gw.call("s", "other")).value == "other"  # succeeds at t=0
    result = await gw.call("s", "mine")  # begins at t=0, fails at t=1
    assert result.value == "mine"
    assert clock.now() > 1.0
    await gw.aclose()


@pytest.mark.parametrize(
    ("outcome", "reason"),
    [
        (Outcome.fatal("", status=400), "fatal"),  # a fatal answer without a reason
        (Outcome.rejected("", status=422), "no source left: rejected"),  # rejected everywhere
    ],
)
async def test_a_request_no_source_can_serve_is_reported_in_full(
    gateway: GatewayFactory, outcome: Outcome, reason: str
) -> None:
    gw = gateway(make_config("chat"), {"a": Answers(outcome)})
    with pytest.raises(SourceFatalError) as fatal:
        await gw.call("s", "x")
    error = fatal.value
    assert (error.reason, error.scope, error.source) == (reason, "s", "a")
    assert error.status == outcome.status
    assert [r.source for r in error.trail] == ["a"]
    await gw.aclose()


async def test_a_failure_that_ends_at_the_deadline_is_a_deadline_verdict(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    """Its last attempt failed exactly as the deadline came: the deadline ends the call,
    not the retry budget that failure would spend."""
    source = ScriptedSource.always(clock, steps.server_error(duration_s=10.0))
    config = make_config("chat", max_call_s=10, max_attempts=1, outage_is_waiting=False)
    gw = gateway(config, {"a": source})
    with pytest.raises(AllSourcesExhausted) as verdict:
        await gw.call("s", "x")
    assert (verdict.value.reason, verdict.value.scope, clock.now()) == ("deadline", "s", 10.0)
    await gw.aclose()


async def test_each_attempt_is_reported_as_its_trail_records_it(
    clock: VirtualClock, gateway: GatewayFactory, recorder: Recorder
) -> None:
    source = ScriptedSource(clock, [steps.server_error(duration_s=1.0), steps.ok(duration_s=2)])
    gw = gateway(make_config("chat", outage_is_waiting=False), {"a": source})
    clock.advance(100.0)  # the call's offsets count from its start, not the clock's zero
    result = await gw.call("s", "x")
    events = recorder.of(AttemptEvent)
    assert [(e.scope, e.attempt) for e in events] == [("s", 1), ("s", 2)]
    assert [e.record for e in events] == list(result.attempts)
    assert [(r.started_s, r.productive) for r in result.attempts] == [(0.0, True), (2.0, True)]
    await gw.aclose()


async def test_a_rate_limited_call_that_fails_fast_says_when_the_limit_resets(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    source = ScriptedSource.always(clock, steps.rate_limited(retry_after_s=20.0))
    gw = gateway(make_config("chat"), {"a": source})
    with pytest.raises(AllSourcesExhausted) as verdict:
        await gw.call("s", "x", fail_fast=True)
    assert clock.now() + verdict.value.retry_after_s == 20.0  # when the limit resets
    assert verdict.value.rate_limited is True
    await gw.aclose()


async def test_a_retry_budget_spent_after_a_rate_limit_says_when_that_limit_resets(
    clock: VirtualClock, gateway: GatewayFactory
) -> None:
    """a's Retry-After is too long to wait out, b fails: the verdict's retry_after_s is
    a's reset, known from its 429 alone (the call never asked the store again)."""
    a = ScriptedSource.always(clock, steps.rate_limited(retry_after_s=20.0))
    b = ScriptedSource.always(clock, steps.server_error())
    config = make_config("chat", {"a": {}, "b": {}}, max_attempts=1, outage_is_waiting=False)
    gw = gateway(config, {"a": a, "b": b})
    with pytest.raises(AllSourcesExhausted) as verdict:
        await gw.call("s", "x")
    assert verdict.value.reason == "retry_exhausted"
    assert [r.source for r in verdict.value.trail] == ["a", "b"]
    assert clock.now() + verdict.value.retry_after_s == 20.0
    assert verdict.value.rate_limited is True
    assert verdict.value.trail[0].productive is False  # an exempt 429 is time spent waiting
    await gw.aclose()


class Capture:
    """A source that keeps every payload it is sent."""

    def __init__(self) -> None:
        self.payloads: list[object] = []

    async def send(self, payload: object, *, timeout_s: float) -> Outcome:
        self.payloads.append(payload)
        return Outcome.success("ok")


async def test_each_kind_of_call_sends_its_request_as_given(gateway: GatewayFactory) -> None:
    source = Capture()
    gw = gateway(make_config("chat"), {"a": source})
    messages = [{"role": "user", "content": "hi"}]
    await gw.chat("s", messages, temperature=0.2)
    await gw.chat("s", messages, stream=True)
    await gw.embed("s", ["one", "two"])
    await gw.embed("s", "alone")
    await gw.ocr("s", b"png", prompt="read it")
    await gw.ocr("s", b"jpg", mime="image/jpeg")
    assert source.payloads == [
        ChatRequest(messages, {"temperature": 0.2}, None),
        ChatRequest(messages, {}, True),
        EmbeddingRequest(["one", "two"]),
        EmbeddingRequest(["alone"]),
        OcrRequest(b"png", "image/png", "read it"),
        OcrRequest(b"jpg", "image/jpeg", None),
    ]
    await gw.aclose()


@pytest.mark.parametrize("kind", ["chat", "embed", "ocr"])
@pytest.mark.parametrize("fail_fast", [False, True])
async def test_each_kind_of_call_waits_unless_told_to_fail_fast(
    clock: VirtualClock, gateway: GatewayFactory, store: Store, kind: str, fail_fast: bool
) -> None:
    gw = gateway(make_config("chat", stall_window_s=10), {"a": Capture()})
    await store.pause_source("a", 100)
    told = {"fail_fast": True} if fail_fast else {}  # waiting is the default
    call = {
        "chat": lambda: gw.chat("s", [{"role": "user", "content": "hi"}], **told),
        "embed": lambda: gw.embed("s", ["x"], **told),
        "ocr": lambda: gw.ocr("s", b"png", **told),
    }[kind]
    with pytest.raises(AllSourcesExhausted) as verdict:
        await call()
    assert verdict.value.reason == ("fail_fast" if fail_fast else "stalled")
    assert (clock.now() == 0.0) is fail_fast
    await gw.aclose()


async def test_a_stall_window_spent_exactly_is_not_yet_exceeded(
    clock: VirtualClock, gateway: GatewayFactory, store: Store
) -> None:
    """Stalled means the window is exceeded: at the poll where it is spent to the instant
    (10.0 s, polls every 0.5 s) the call waits one more poll."""
    gw = gateway(make_config("chat", stall_window_s=10, poll_interval_s=1), {"a": Capture()})
    await store.pause_source("a", 100)
    with pytest.raises(AllSourcesExhausted) as verdict:
        await gw.call("s", "x")
    assert (verdict.value.reason, clock.now()) == ("stalled", 10.5)
    await gw.aclose()


async def test_a_release_wakes_a_call_that_waits_for_more_than_a_permit(
    clock: VirtualClock, gateway: GatewayFactory, store: Store
) -> None:
    """`a` is at capacity and `b` paused, so the call is not queued (its wait is an
    ordinary poll); the permit `a` releases at 2.5 still ends that poll at once."""
    source = ScriptedSource.always(clock, steps.ok(duration_s=2.5))
    config = make_config("chat", {"a": {"max_concurrency": 1}, "b": {}}, poll_interval_s=10)
    gw = gateway(config, {"a": source, "b": ScriptedSource.always(clock, steps.ok("b"))})
    await store.pause_source("b", 100)
    holder = await hold_the_permit(gw, clock)  # holds a's permit until 2.5
    result = await gw.call("s", "waits")  # from 0.5
    assert (result.source, result.attempts[0].started_s) == ("a", 2.0)
    await holder
    await gw.aclose()


async def test_a_failure_at_the_deadline_ends_the_call_without_a_backoff(
    clock: VirtualClock, gateway: GatewayFactory, recorder: Recorder
) -> None:
    """The attempt's timeout is cut to the deadline, so its failure comes at the deadline
    itself, with retry budget left: the call ends there, with no backoff wait."""
    source = ScriptedSource.always(clock, steps.server_error(duration_s=30.0))
    gw = gateway(make_config("chat", max_call_s=10, outage_is_waiting=False), {"a": source})
    with pytest.raises(AllSourcesExhausted) as verdict:
        await gw.call("s", "x")
    assert (verdict.value.reason, clock.now()) == ("deadline", 10.0)
    assert recorder.of(WaitEvent) == []
    await gw.aclose()


@pytest.mark.parametrize("kind", ["embed", "ocr"])
async def test_embeddings_and_ocr_reserve_their_estimate_against_the_token_quota(
    clock: VirtualClock, gateway: GatewayFactory, kind: str
) -> None:
    """Each call's estimate (about 1,000 tokens for 4,000 characters, 1,512 for a page)
    is reserved before it is sent, and kept when the source reports no usage: at 1,600
    tokens a minute the second call waits for the quota."""
    gw = gateway(make_config("chat", {"a": {"tpm": 1600}}), {"a": Capture()})
    call = {"embed": lambda: gw.embed("s", ["x" * 4000]), "ocr": lambda: gw.ocr("s", b"png")}
    await call[kind]()
    assert clock.now() == 0.0
    await call[kind]()
    assert clock.now() > 10.0
    await gw.aclose()


async def test_a_verdict_is_reported_with_what_ended_the_call(
    clock: VirtualClock, gateway: GatewayFactory, store: Store, recorder: Recorder
) -> None:
    source = ScriptedSource.always(clock, steps.ok(duration_s=2))
    gw = gateway(make_config("chat", stall_window_s=10, poll_interval_s=1), {"a": source})
    await gw.call("s", "x")
    await store.pause_source("a", 100)
    with pytest.raises(AllSourcesExhausted) as verdict:
        await gw.call("s", "x")
    assert recorder.of(VerdictEvent) == [
        VerdictEvent("s", "success", 1, 2.0, 0.0, None, "a"),
        VerdictEvent("s", "stalled", 0, 10.5, 10.5, verdict.value.retry_after_s, None),
    ]
    assert verdict.value.retry_after_s is not None
    await gw.aclose()


def test_a_scope_without_an_adapter_for_a_source_is_refused_naming_it(clock: VirtualClock) -> None:
    config = make_config("chat", {"a": {}, "b": {}})
    with pytest.raises(ConfigError) as refused:
        Gateway(config, {"a": Capture()}, store=MemoryStore(clock), clock=clock)
    assert str(refused.value) == (
        "invalid configuration: sources.b: no adapter was given for this source"
    )


async def test_an_unknown_scope_is_named_in_the_error(gateway: GatewayFactory) -> None:
    gw = gateway(make_config("chat"), {"a": Capture()})
    with pytest.raises(ConfigError) as refused:
        await gw.call("summarize", "x")
    assert (refused.value.field, refused.value.message) == (
        "scopes.summarize",
        "no scope named 'summarize'",
    )
    await gw.aclose()


async def test_a_gateway_without_a_store_builds_one_on_its_own_clock() -> None:
    """No store given and none configured: an in-memory store that reads the gateway's
    clock, so a pause runs out in the gateway's (here virtual) time."""
    clock = VirtualClock()
    gw = Gateway(make_config("chat"), {"a": Capture()}, clock=clock)
    await gw.store.pause_source("a", 30)
    with pytest.raises(AllSourcesExhausted):
        await gw.call("s", "x", fail_fast=True)
    clock.advance(31)
    assert (await gw.call("s", "x", fail_fast=True)).value == "ok"
    await gw.aclose()
