"""The run markers' contract, run on Redis and on the in-memory twin: one live run per
message, a finished message's copies dropped, copies of dead runs counted toward the cap
(a release is not counted, a hand-back is), and the heartbeat."""

from __future__ import annotations

from polygate_celery.celery.state import CeleryState
from tests.unit.celery.conftest import TERMS, start


async def test_one_live_run_and_a_finished_messages_copies_dropped(state: CeleryState) -> None:
    markers = state.markers
    assert markers.begin(start("r", "a", False, 1.0)).verdict == "go"
    running = markers.begin(start("r", "b", True, 2.0))
    assert running.verdict == "running"
    assert 0 < running.wait_s <= TERMS.run_ttl_s
    markers.end("r", "a", "finish", TERMS)
    assert markers.begin(start("r", "c", True, 3.0)).verdict == "done"


async def test_a_run_that_began_and_never_finished_is_named_to_the_next(
    state: CeleryState,
) -> None:
    markers = state.markers
    markers.begin(start("r", "a", False, 100.5))
    markers.end("r", "a", "release", TERMS)  # terminated: its message goes on
    again = markers.begin(start("r", "b", True, 200.0))
    assert (again.verdict, again.began_at) == ("go", 100.5)


async def test_copies_count_toward_the_cap_but_releases_do_not(state: CeleryState) -> None:
    markers = state.markers  # TERMS.cap == 2
    for token in ("a", "b", "c"):
        assert markers.begin(start("r", token, True, 1.0)).verdict == "go"
        markers.end("r", token, "release", TERMS)
    assert markers.begin(start("r", "d", True, 1.0)).verdict == "go"
    markers.end("r", "d", "handback", TERMS)
    assert markers.begin(start("r", "e", True, 1.0)).verdict == "go"
    markers.end("r", "e", "handback", TERMS)
    assert markers.begin(start("r", "f", True, 1.0)).verdict == "poison"


async def test_ending_with_another_token_leaves_the_live_marker(state: CeleryState) -> None:
    markers = state.markers
    markers.begin(start("r", "a", False, 1.0))
    markers.end("r", "stale", "release", TERMS)
    assert markers.begin(start("r", "b", True, 1.0)).verdict == "running"


async def test_a_beat_keeps_its_markers_and_sets_a_lapsed_one_again(state: CeleryState) -> None:
    markers = state.markers
    markers.begin(start("r", "a", False, 1.0))
    assert await markers.beat({"r": "a", "gone": "g"}, TERMS.run_ttl_s) == 0
    assert markers.begin(start("gone", "other", True, 1.0)).verdict == ("running")
    assert await markers.beat({"r": "someone else"}, TERMS.run_ttl_s) == 1
    assert markers.begin(start("r", "b", True, 1.0)).verdict == "running"
