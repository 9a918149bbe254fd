"""The parking lot in virtual time, on the in-memory twin (Redis keeps its own clock): a
lease that ends makes its entry due again, a kept entry comes back later each release,
and an entry parked for later falls due when its time comes."""

from __future__ import annotations

from polygate_celery.celery.state import MemoryCeleryState
from polygate_celery.testing import VirtualClock
from tests.unit.celery.conftest import message


async def test_an_entry_falls_due_when_its_time_comes(
    memory: MemoryCeleryState, clock: VirtualClock
) -> None:
    lot = memory.lot("lot")
    await lot.park("e", 60.0, message("e"), 600.0)
    assert await lot.claim(10, 30.0, "r") == []
    clock.advance(60.0)
    assert [e for e, _ in await lot.claim(10, 30.0, "r")] == ["e"]


async def test_a_releaser_lost_mid_round_loses_nothing(
    memory: MemoryCeleryState, clock: VirtualClock
) -> None:
    lot = memory.lot("lot")
    await lot.park("e", 0.0, message("e"), 600.0)
    await lot.claim(10, 30.0, "lost")
    clock.advance(29.0)
    assert await lot.claim(10, 30.0, "other") == []
    clock.advance(1.0)
    assert [e for e, _ in await lot.claim(10, 30.0, "other")] == ["e"]
    assert await lot.confirm("e", "lost") is False  # its claim went to the other


async def test_a_kept_entry_comes_back_twice_as_late_each_release(
    memory: MemoryCeleryState, clock: VirtualClock
) -> None:
    lot = memory.lot("lot")
    await lot.park("e", 0.0, message("e"), 600.0)
    waits = []
    for _ in range(7):
        await lot.claim(10, 30.0, "r")
        await lot.confirm("e", "r", keep_s=10.0)
        waited = 0.0
        while not await lot.claim(1, 0.001, "peek"):
            clock.advance(10.0)
            waited += 10.0
        waits.append(waited)
        clock.advance(0.001)  # the peek's lease ends
    assert waits == [10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 320.0]


async def test_a_probe_is_woken_again_once_its_interval_passed(
    memory: MemoryCeleryState, clock: VirtualClock
) -> None:
    lot = memory.lot("lot")
    for entry, due in (("a", 600.0), ("b", 900.0)):
        await lot.park(entry, due, message(entry), 600.0, scope="s")
    assert await lot.wake("s", probe_interval_s=15.0) == 1
    clock.advance(14.0)
    assert await lot.wake("s", probe_interval_s=15.0) == 0
    clock.advance(1.0)
    assert await lot.wake("s", probe_interval_s=15.0) == 1
    assert sorted(e for e, _ in await lot.claim(10, 30.0, "r")) == ["a", "b"]
