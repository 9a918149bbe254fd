"""The scope gate: closed by a stalled verdict, one probe at a time, opened by a success."""

from __future__ import annotations

import pytest

from polygate_celery.core.breaker import Effect
from polygate_celery.core.terms import SourceTerms
from polygate_celery.store import AdmitRequest, Denial, Grant
from tests.unit.store.conftest import Harness

SRC = SourceTerms("a", 8)


async def admit(h: Harness, call: str, *, gate: bool = True) -> Grant | Denial:
    request = AdmitRequest("s", (SRC,), h.new_id(), gate=gate, call_id=call, probe_lease_s=60)
    return await h.store.admit(request)


async def test_an_open_gate_lets_every_call_through(h: Harness) -> None:
    assert isinstance(await admit(h, "x"), Grant)
    assert isinstance(await admit(h, "y"), Grant)


async def test_a_closed_gate_admits_one_probe_and_refuses_the_rest(h: Harness) -> None:
    await h.store.close_gate("s", 30)
    assert isinstance(await admit(h, "probe"), Grant)
    refused = await admit(h, "other")
    assert isinstance(refused, Denial)
    assert refused.gated_for_s == pytest.approx(30)
    assert isinstance(await admit(h, "probe"), Grant)  # the probe's later attempts pass
    assert isinstance(await admit(h, "free", gate=False), Grant)  # ungated calls ignore it


async def test_the_gate_opens_when_its_time_passes(h: Harness) -> None:
    await h.store.close_gate("s", 30)
    await admit(h, "probe")
    h.clock.advance(31)
    assert isinstance(await admit(h, "other"), Grant)


async def test_a_probe_that_goes_quiet_hands_the_slot_on_after_its_lease(h: Harness) -> None:
    await h.store.close_gate("s", 300)
    await admit(h, "probe")  # probe lease 60 s
    h.clock.advance(61)
    assert isinstance(await admit(h, "next probe"), Grant)
    assert isinstance(await admit(h, "probe"), Denial)


async def test_a_success_in_the_scope_opens_the_gate(h: Harness) -> None:
    await h.store.close_gate("s", 300)
    grant = await admit(h, "probe")
    assert isinstance(grant, Grant)
    await h.settle(grant, SRC, Effect.SUCCESS)
    assert isinstance(await admit(h, "other"), Grant)


async def test_closing_again_keeps_the_later_time(h: Harness) -> None:
    await h.store.close_gate("s", 100)
    await h.store.close_gate("s", 10)
    await admit(h, "probe")
    refused = await admit(h, "other")
    assert isinstance(refused, Denial)
    assert refused.gated_for_s == pytest.approx(100)


@pytest.mark.parametrize("reset", [True, False])
async def test_a_refused_call_learns_whether_the_gate_opens_as_rate_limits_reset(
    h: Harness, reset: bool
) -> None:
    await h.store.close_gate("s", 30, reset)
    await admit(h, "probe")
    refused = await admit(h, "other")
    assert isinstance(refused, Denial)
    assert refused.gated_reset is reset


async def test_the_later_close_decides_whether_it_is_a_reset(h: Harness) -> None:
    await h.store.close_gate("s", 100, True)
    await h.store.close_gate("s", 10, False)  # earlier: ignored
    await admit(h, "probe")
    assert (await admit(h, "other")).gated_reset is True  # type: ignore[union-attr]
    await h.store.close_gate("s", 200, False)  # later: it decides
    await admit(h, "probe")
    assert (await admit(h, "other")).gated_reset is False  # type: ignore[union-attr]
