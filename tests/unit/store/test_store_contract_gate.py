"""The scope gate: closed by a stalled verdict, one probe at a time, opened by a success."""

from __future__ import annotations

import asyncio

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


async def test_a_later_stalled_verdict_leaves_the_live_probe_alone(h: Harness) -> None:
    await h.store.close_gate("s", 30)
    assert isinstance(await admit(h, "probe"), Grant)
    await h.store.close_gate("s", 30, call_id="stalled elsewhere")  # another call's verdict
    await h.store.close_gate("s", 40)
    refused = await admit(h, "second")
    assert isinstance(refused, Denial)  # the probe's slot is still taken
    assert refused.gated_for_s == pytest.approx(40)
    assert isinstance(await admit(h, "probe"), Grant)


async def test_the_probes_own_stalled_verdict_frees_its_slot(h: Harness) -> None:
    await h.store.close_gate("s", 30)
    await admit(h, "probe")
    await h.store.close_gate("s", 30, call_id="probe")  # it defers: its probe is over
    assert isinstance(await admit(h, "next probe"), Grant)
    assert isinstance(await admit(h, "probe"), Denial)


async def test_a_probe_of_an_earlier_closing_is_no_probe_of_the_next(h: Harness) -> None:
    await h.store.close_gate("s", 30)
    await admit(h, "probe")  # probe lease 60 s
    h.clock.advance(31)  # the gate opened by itself
    await h.store.close_gate("s", 30, call_id="another")
    assert isinstance(await admit(h, "new probe"), Grant)
    assert isinstance(await admit(h, "probe"), Denial)


async def test_racing_stalled_verdicts_leave_one_probe_at_a_time(h: Harness) -> None:
    """Calls race on one closed gate: each asks to probe; a refused call's stalled verdict
    closes the gate again; a probe ends with its own verdict. One probe at any time."""
    await h.store.close_gate("s", 300)
    probing: set[str] = set()
    most = 0
    probes = 0

    async def call(n: int) -> None:
        nonlocal most, probes
        me = f"call-{n}"
        for round_ in range(6):
            result = await admit(h, me)
            if isinstance(result, Grant):
                probing.add(me)
                most, probes = max(most, len(probing)), probes + 1
                await h.turns(1 + (n + round_) % 4)  # its attempt
                probing.discard(me)  # the attempt ended; its verdict follows
                await h.store.close_gate("s", 300, call_id=me)
            else:
                await h.store.close_gate("s", 300 + n, call_id=me)
                await h.turns(n % 3)

    await asyncio.gather(*(call(n) for n in range(12)))
    assert most == 1
    assert probes > 1  # the slot was handed on as probes ended, never shared
