"""The parking lot's contract, run on Redis and on the in-memory twin: park, claim under a
lease, confirm, bury what Celery cannot take, count failed releases, wake a scope's
entries, and end a deferring run in the step that parks its message."""

from __future__ import annotations

import json

import pytest

from polygate_celery.celery.state import CeleryState
from tests.unit.celery.conftest import message, start

LATER = 3600.0  # due long after any case ends


async def test_a_due_entry_is_claimed_decoded_and_one_not_due_is_left(state: CeleryState) -> None:
    lot = state.lot("lot")
    await lot.park("due", 0.0, message("due"), 60.0)
    await lot.park("later", LATER, message("later"), 60.0)
    assert await lot.size() == 2
    assert await lot.claim(10, 30.0, "releaser") == [("due", message("due"))]


async def test_a_claimed_entry_is_leased_to_its_releaser(state: CeleryState) -> None:
    lot = state.lot("lot")
    await lot.park("e", 0.0, message("e"), 60.0)
    assert [e for e, _ in await lot.claim(10, 30.0, "first")] == ["e"]
    assert await lot.claim(10, 30.0, "second") == []
    assert await lot.confirm("e", "second") is False
    assert await lot.confirm_all(["e"], "first", 0.0) == [True]
    assert await lot.size() == 0


async def test_a_confirmed_entry_is_kept_until_its_run_begins(state: CeleryState) -> None:
    lot = state.lot("lot")
    await lot.park("run-1", 0.0, message("run-1"), 60.0)
    await lot.claim(10, 30.0, "r")
    assert await lot.confirm("run-1", "r", keep_s=300.0)
    assert (await lot.size(), await lot.claim(10, 30.0, "r")) == (1, [])
    assert state.markers.begin(start("run-1", "tok", False, 1.0, lot="lot"))
    assert await lot.size() == 0  # the run forgot the entry that started it


async def test_parking_again_voids_an_earlier_claim(state: CeleryState) -> None:
    lot = state.lot("lot")
    await lot.park("e", 0.0, message("e"), 60.0)
    await lot.claim(10, 30.0, "r")
    await lot.park("e", 0.0, message("e"), 60.0)
    assert await lot.confirm("e", "r") is False
    assert [e for e, _ in await lot.claim(10, 30.0, "other")] == ["e"]


@pytest.mark.parametrize(
    ("parked", "why"),
    [({}, "missing body"), ({**message("x"), "serializer": "pickle"}, "serializer must be json")],
)
async def test_an_entry_celery_cannot_take_is_buried_whole(
    state: CeleryState, parked: dict[str, object], why: str
) -> None:
    lot = state.lot("lot")
    await lot.park("bad", 0.0, parked, 60.0)  # type: ignore[arg-type]
    await lot.park("good", 0.0, message("good"), 60.0)
    assert [e for e, _ in await lot.claim(10, 30.0, "r")] == ["good"]
    (reason,) = (await lot.dead_letters()).values()
    assert reason.startswith(why)
    assert reason.endswith("\n" + json.dumps(parked))
    assert await lot.size() == 1


async def test_failed_releases_are_counted_and_the_last_allowed_buries(
    state: CeleryState,
) -> None:
    lot = state.lot("lot")
    await lot.park("e", 0.0, message("e"), 60.0)
    await lot.claim(10, 30.0, "r")
    assert await lot.unpublished("e", "other", 2, "Boom") == 0  # not its claim
    assert await lot.unpublished("e", "r", 2, "Boom") == 1
    assert await lot.dead_letters() == {}
    assert await lot.unpublished("e", "r", 2, "Boom") == 2
    assert list(await lot.dead_letters()) == ["e"]
    assert await lot.size() == 0


async def test_a_scopes_success_wakes_what_its_outage_parked(state: CeleryState) -> None:
    lot = state.lot("lot")
    await lot.park("a", LATER, message("a"), 60.0, scope="s")
    await lot.park("b", LATER, message("b"), 60.0, scope="s")
    await lot.park("c", LATER, message("c"), 60.0, scope="other")
    await lot.park("d", LATER, message("d"), 60.0)
    assert await lot.wake("s") == 2
    assert await lot.wake("s") == 0  # due already: dropped from the index
    assert sorted(e for e, _ in await lot.claim(10, 30.0, "r")) == ["a", "b"]


async def test_a_probe_wakes_the_earliest_entry_once_per_interval(state: CeleryState) -> None:
    lot = state.lot("lot")
    await lot.park("late", 2 * LATER, message("late"), 60.0, scope="s")
    await lot.park("early", LATER, message("early"), 60.0, scope="s")
    assert await lot.wake("s", probe_interval_s=15.0) == 1
    assert await lot.wake("s", probe_interval_s=15.0) == 0  # a probe was woken lately
    assert [e for e, _ in await lot.claim(10, 30.0, "r")] == ["early"]


async def test_no_probe_when_an_entry_comes_back_within_the_interval(state: CeleryState) -> None:
    lot = state.lot("lot")
    await lot.park("soon", 5.0, message("soon"), 60.0, scope="s")
    assert await lot.wake("s", probe_interval_s=15.0) == 0


async def test_parking_a_deferral_ends_its_run(state: CeleryState) -> None:
    lot = state.lot("lot")
    markers = state.markers
    assert markers.begin(start("run", "tok", False, 1.0)).verdict == "go"
    await lot.park("run:1", LATER, message("run:1"), 600.0, ending=("run", "tok"))
    copy = markers.begin(start("run", "other", True, 2.0))
    assert copy.verdict == "done"  # its own message, redelivered, is dropped


async def test_lots_are_apart(state: CeleryState) -> None:
    await state.lot("one").park("e", 0.0, message("e"), 60.0)
    assert await state.lot("two").size() == 0
    assert await state.lot("two").claim(10, 30.0, "r") == []
