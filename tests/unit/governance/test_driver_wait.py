"""The driver's waits, in virtual time: how long each sleeps and what it reports.

The engine says how long to wait (`core.engine.Wait`); the driver jitters it or
not as told, cuts it to its cap, emits no wait of nothing, and names the call and
the round's blockers in the wait's telemetry event.
"""

from __future__ import annotations

from polygate_celery import MemoryStore
from polygate_celery.store import AdmitRequest, Denial, Grant
from polygate_celery.telemetry import CallEvent, WaitEvent
from polygate_celery.testing import ScriptedSource, VirtualClock, steps
from tests.conftest import GatewayFactory, Recorder, make_config


class RefusingOnceStore(MemoryStore):
    """Refuses the first admission with `denial`, then admits as the memory store does."""

    def __init__(self, clock: VirtualClock, denial: Denial) -> None:
        super().__init__(clock)
        self.denial: Denial | None = denial

    async def admit(self, request: AdmitRequest) -> Grant | Denial:
        denial, self.denial = self.denial, None
        return denial if denial is not None else await super().admit(request)


BOOKED = Denial(None, (("a", "quota"),), booked_in_s=10.0)  # a quota slot booked 10 s ahead
QUEUED = Denial(None, (("a", "at_capacity"),))  # refused for capacity alone: queued


async def test_a_booked_slot_is_waited_for_exactly_and_each_wait_names_its_call(
    clock: VirtualClock, own_store_gateway: GatewayFactory, recorder: Recorder
) -> None:
    """A booked quota slot is asked for again exactly when it comes (no jitter, the
    gateway's draw is 0); the backoff after a failure is jittered (x0.5). Each wait's
    event names the call; only a wait for a runnable source names the blockers."""
    source = ScriptedSource(clock, [steps.server_error(status=503), steps.ok("y")])
    config = make_config("chat", backoff_base_s=4)
    gw = own_store_gateway(config, {"a": source}, store=RefusingOnceStore(clock, BOOKED))

    result = await gw.call("s", "x")

    assert result.value == "y"
    assert [a.started_s for a in result.attempts] == [10.0, 12.0]
    (call,) = recorder.of(CallEvent)
    waits = recorder.of(WaitEvent)
    assert waits == [
        WaitEvent("s", "no_runnable", 0.0, 10.0, (("a", "quota"),)),
        WaitEvent("s", "backoff", 10.0, 2.0, ()),
    ]
    assert [w.call_id for w in waits] == [call.call_id] * 2
    assert call.call_id is not None
    await gw.aclose()


async def test_a_wait_cut_to_nothing_sleeps_not_and_is_not_reported(
    clock: VirtualClock, own_store_gateway: GatewayFactory, recorder: Recorder
) -> None:
    """A cut first token fails over at once (rule 17): its backoff is cut to 0 s, so
    the driver neither sleeps nor reports a wait."""
    primary = ScriptedSource(clock, [steps.stuck_first_token()], ttft_timeout_s=15.0)
    fallback = ScriptedSource(clock, [steps.ok("b", duration_s=1.0)], ttft_timeout_s=15.0)
    config = make_config("chat", {"a": {}, "b": {}})
    gw = own_store_gateway(config, {"a": primary, "b": fallback}, store=MemoryStore(clock))

    result = await gw.call("s", "x")

    assert result.source == "b"
    assert result.attempts[1].started_s == 15.0
    assert recorder.of(WaitEvent) == []
    await gw.aclose()


async def test_a_place_lost_as_its_wait_ends_sends_the_call_to_ask_again_at_once(
    clock: VirtualClock, own_store_gateway: GatewayFactory, recorder: Recorder
) -> None:
    """A queued call whose place is lost in the step its poll ends (here: lost while the
    wait's event is emitted, after its timer won) asks for a permit at once, without
    waiting again."""
    source = ScriptedSource(clock, [steps.ok("y")])
    lost_at: list[float] = []

    def lose_the_place(event: object) -> None:
        if isinstance(event, WaitEvent) and not lost_at:
            place = gw._runtime.places._places.get(event.call_id or "")
            if place is not None:
                place.lost.set()
                lost_at.append(clock.now())

    gw = own_store_gateway(
        make_config("chat"),
        {"a": source},
        store=RefusingOnceStore(clock, QUEUED),
        hooks=[recorder, lose_the_place],
    )

    result = await gw.call("s", "x")

    assert result.value == "y"
    assert len(lost_at) == 1
    # One poll, then a new round at once: no second wait for a place already lost.
    assert [w.cause for w in recorder.of(WaitEvent)] == ["no_runnable"]
    assert result.attempts[0].started_s == lost_at[0]
    await gw.aclose()
