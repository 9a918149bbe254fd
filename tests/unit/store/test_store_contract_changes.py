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
    assert [text.split(":")[0] for _, text in lines(caplog)] == [
        "source 'vllm' is failing (transient",
        "source 'vllm' still failing",
        "source 'vllm' recovered",
    ]
    assert lines(caplog)[1:] == [
        (
            logging.WARNING,
            "source 'vllm' still failing: its probe failed (transient: connection refused); "
            "breaker open again for 30 s",
        ),
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
