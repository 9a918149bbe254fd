"""State changes are logged by the settle (or gate close) that made them: once, with the error."""

from __future__ import annotations

import logging

import pytest

from polygate_celery.core.breaker import Effect
from polygate_celery.core.terms import BreakerTerms, SourceTerms
from polygate_celery.store import AdmitRequest, Denial, Grant, Settlement
from tests.unit.store.conftest import Harness

SRC = SourceTerms("vllm", 8, breaker=BreakerTerms(failure_threshold=2, cooldown_s=30))
REFUSED = "transient: connection refused"


async def settle(h: Harness, grant: Grant, effect: Effect, **kwargs: object) -> bool:
    settlement = Settlement(
        scope="s",
        source=SRC,
        permit_id=grant.permit_id,
        admitted_at=grant.admitted_at,
        effect=effect,
        error=None if effect is Effect.SUCCESS else REFUSED,
        **kwargs,  # type: ignore[arg-type]
    )
    return await h.store.settle(settlement)


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [
        (r.levelno, r.getMessage()) for r in caplog.records if r.name.startswith("polygate_celery")
    ]


async def test_a_breaker_opening_is_one_warning_naming_the_source_and_error(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="polygate_celery")
    grants = [await h.grant(SRC) for _ in range(4)]
    for grant in grants:  # the second opens it; the stragglers change nothing
        await settle(h, grant, Effect.FAILURE)
    assert lines(caplog) == [
        (
            logging.WARNING,
            "source 'vllm' is failing (transient: connection refused): breaker open, "
            "no requests to it for 30 s but one probe then",
        )
    ]


async def test_a_failed_probe_warns_again_and_a_success_recovers_once(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    first, second, straggler = [await h.grant(SRC) for _ in range(3)]
    await settle(h, first, Effect.FAILURE)
    caplog.set_level(logging.INFO, logger="polygate_celery")
    await settle(h, second, Effect.FAILURE)  # open
    h.clock.advance(31)
    await settle(h, await h.grant(SRC), Effect.FAILURE)  # the probe fails
    h.clock.advance(31)
    await settle(h, await h.grant(SRC), Effect.SUCCESS)  # the next probe succeeds
    await settle(h, straggler, Effect.SUCCESS)  # closed already: nothing to say
    half_open = (
        logging.WARNING,
        "source 'vllm' breaker half-open: one probe request after 31 s open "
        "(last error: transient: connection refused)",
    )
    assert [text.split(":")[0] for _, text in lines(caplog)] == [
        "source 'vllm' is failing (transient",
        "source 'vllm' breaker half-open",
        "source 'vllm' still failing",
        "source 'vllm' breaker half-open",
        "source 'vllm' recovered",
    ]
    assert lines(caplog)[1:] == [
        half_open,
        (
            logging.WARNING,
            "source 'vllm' still failing: its probe failed (transient: connection refused); "
            "breaker open again for 30 s",
        ),
        half_open,
        (logging.INFO, "source 'vllm' recovered: a request succeeded; breaker closed"),
    ]


async def test_a_long_retry_after_is_one_warning_a_short_one_none(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="polygate_celery")
    await settle(h, await h.grant(SRC), Effect.NEUTRAL, pause_s=2.0)  # routine
    h.clock.advance(3)
    first, second = await h.grant(SRC), await h.grant(SRC)
    await settle(h, first, Effect.NEUTRAL, pause_s=60.0)
    await settle(h, second, Effect.NEUTRAL, pause_s=60.0)  # paused already
    assert lines(caplog) == [
        (
            logging.WARNING,
            "source 'vllm' paused fleet-wide for 60 s by its Retry-After "
            "(transient: connection refused)",
        )
    ]


async def test_the_gate_closes_once_and_a_success_opens_it_once(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="polygate_celery")
    assert await h.store.close_gate("s", 30) is True  # it was open: this call closed it
    assert await h.store.close_gate("s", 60) is False  # closed already
    request = AdmitRequest("s", (SRC,), h.new_id(), gate=True, call_id="probe", probe_lease_s=9)
    probe = await h.store.admit(request)
    assert isinstance(probe, Grant)
    await settle(h, probe, Effect.SUCCESS)
    await settle(h, await h.grant(SRC), Effect.SUCCESS)
    assert lines(caplog) == [
        (logging.INFO, "scope 's' answers again (source 'vllm' succeeded): its gate is open")
    ]
    assert await h.store.close_gate("s", 30) is True


async def test_a_gate_closed_again_after_opening_by_time_is_the_same_outage(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="polygate_celery")
    assert await h.store.close_gate("s", 30) is True
    h.clock.advance(31)  # open by time: a probe's verdict closes it again
    assert await h.store.close_gate("s", 30) is False
    h.clock.advance(31)
    await settle(h, await h.grant(SRC), Effect.SUCCESS)  # the gate opened by time
    assert [text for _, text in lines(caplog)] == [
        "scope 's' answers again (source 'vllm' succeeded): its gate is open"
    ]
    assert await h.store.close_gate("s", 30) is True  # a new outage


async def test_a_stall_on_record_ends_a_minute_after_its_gate_opened(h: Harness) -> None:
    assert await h.store.close_gate("s", 30) is True
    h.clock.advance(30 + 61)
    assert await h.store.close_gate("s", 30) is True


async def test_a_call_the_gate_refuses_learns_the_closing_verdicts_last_error(
    h: Harness,
) -> None:
    assert await h.store.close_gate("s", 30, error="vllm: transient: connection refused")
    await h.store.close_gate("s", 30)  # a close without an error keeps the one told
    probe = AdmitRequest("s", (SRC,), h.new_id(), gate=True, call_id="probe", probe_lease_s=9)
    assert isinstance(await h.store.admit(probe), Grant)
    other = AdmitRequest("s", (SRC,), h.new_id(), gate=True, call_id="other", probe_lease_s=9)
    refused = await h.store.admit(other)
    assert isinstance(refused, Denial)
    assert refused.gated_error == "vllm: transient: connection refused"


# --- the source's last error, and its breaker's probe ---------------------------------

RATE_LIMITED = "rate_limited (HTTP 429)"
SPARE = SourceTerms("spare", 1)


async def test_a_call_the_breaker_refuses_is_told_the_sources_last_error(h: Harness) -> None:
    first, second = await h.grant(SRC), await h.grant(SRC)
    await settle(h, first, Effect.FAILURE)
    await settle(h, second, Effect.FAILURE)  # open
    busy = await h.grant(SPARE)  # the fallback is merely full: no error of its own
    denial = await h.deny(SRC, SPARE)
    assert denial.blocked == (("vllm", "breaker_open"), ("spare", "at_capacity"))
    assert denial.errors == (("vllm", REFUSED),)
    h.clock.advance(31)
    probe = await h.grant(SRC)
    assert probe.probe
    denial = await h.deny(SRC, scope="another-scope")  # fleet-wide, whatever the scope
    assert denial.blocked == (("vllm", "probe_in_flight"),)
    assert denial.errors == (("vllm", REFUSED),)
    await settle(h, probe, Effect.SUCCESS)  # closed: the error is over
    assert not (await h.grant(SRC)).probe
    await h.store.pause_source("vllm", 10)  # an operator's pause says nothing of health
    denial = await h.deny(SRC)
    assert denial.blocked == (("vllm", "paused"),)
    assert denial.errors == ()
    await h.store.resume_source("vllm")
    assert await h.settle(busy, SPARE)


async def test_a_pause_keeps_what_the_source_said_until_a_success_after_it(h: Harness) -> None:
    limited = Settlement(
        scope="s",
        source=SRC,
        permit_id=(grant := await h.grant(SRC)).permit_id,
        admitted_at=grant.admitted_at,
        effect=Effect.NEUTRAL,
        pause_s=60.0,
        error=RATE_LIMITED,
    )
    await h.store.settle(limited)
    assert (await h.deny(SRC)).errors == (("vllm", RATE_LIMITED),)
    h.clock.advance(61)
    await settle(h, await h.grant(SRC), Effect.SUCCESS)
    await h.store.pause_source("vllm", 10)
    assert (await h.deny(SRC)).errors == ()


async def test_a_failure_without_a_held_permit_or_a_reset_leaves_no_error(h: Harness) -> None:
    grants = [await h.grant(SRC) for _ in range(3)]
    await settle(h, grants[0], Effect.FAILURE)
    await settle(h, grants[1], Effect.FAILURE)  # open
    await h.store.reset_source("vllm")  # forgets the breaker and its error
    await h.store.pause_source("vllm", 10)
    assert (await h.deny(SRC)).errors == ()
    await h.store.resume_source("vllm")
    await settle(h, grants[2], Effect.SUCCESS)
    await settle(h, grants[2], Effect.FAILURE)  # settled already: no failure recorded
    await h.store.pause_source("vllm", 10)
    assert (await h.deny(SRC)).errors == ()


async def test_the_admission_that_turns_the_breaker_half_open_says_so_once(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    first, second = await h.grant(SRC), await h.grant(SRC)
    await settle(h, first, Effect.FAILURE)
    await settle(h, second, Effect.FAILURE)  # open for 30 s
    caplog.set_level(logging.INFO, logger="polygate_celery")
    caplog.clear()
    await h.deny(SRC)  # still open: nothing to say
    h.clock.advance(45)
    probe = await h.grant(SRC, scope="another-scope")
    assert probe.probe
    await h.deny(SRC)  # the probe is in flight
    await settle(h, probe, Effect.NEUTRAL)  # it proved nothing: the slot is free
    again = await h.grant(SRC)
    assert again.probe  # the next probe, of a breaker half-open already: no new line
    await settle(h, again, Effect.SUCCESS)
    assert lines(caplog) == [
        (
            logging.WARNING,
            "source 'vllm' breaker half-open: one probe request after 45 s open "
            "(last error: transient: connection refused)",
        ),
        (logging.INFO, "source 'vllm' recovered: a request succeeded; breaker closed"),
    ]


async def test_a_grant_of_a_closed_breaker_is_no_probe(h: Harness) -> None:
    grant = await h.grant(SRC, SPARE)
    assert not grant.probe
    again = await h.admit(SRC, permit_id=grant.permit_id)  # a repeated admit: its grant
    assert isinstance(again, Grant)
    assert not again.probe
