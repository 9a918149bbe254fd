"""Decision core: a waiting call's standing (`core.standing`): tags, scores, floors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from polygate_celery.core.standing import (
    DECAY,
    RANK_SPAN,
    corrected,
    next_class,
    per_class,
    per_rank,
    rank_of,
    score,
    served_counts,
    tag,
    taken_counts,
    trimmed,
    without_slot,
)


def test_a_tenant_backlogged_starts_after_its_last_tag() -> None:
    assert tag(10.0, 40.0, 100, 2.0) == 90.0


def test_an_idle_tenant_starts_at_the_class_virtual_time() -> None:
    assert tag(50.0, 20.0, 100, 1.0) == 150.0
    assert tag(50.0, None, 100, 1.0) == 150.0


def test_a_call_without_an_estimate_costs_one_token() -> None:
    assert tag(0.0, None, 0, 1.0) == 1.0


@given(
    st.integers(0, 7),
    st.floats(0, 1e12, allow_nan=False),
    st.integers(0, 7),
    st.floats(0, 1e12, allow_nan=False),
)
def test_a_higher_class_always_scores_lower(r1: int, t1: float, r2: int, t2: float) -> None:
    if r1 < r2:
        assert score(r1, t1) < score(r2, t2)
    assert rank_of(score(r1, t1)) == r1


def test_a_tag_beyond_the_span_stays_in_its_class() -> None:
    assert rank_of(score(2, RANK_SPAN * 3)) == 2


def test_the_counters_decay_and_count_the_class_served() -> None:
    assert served_counts({0: 1.0, 1: 2.0}, 1) == {0: DECAY, 1: 2 * DECAY + 1}


def test_without_floors_the_highest_class_with_waiters_is_served() -> None:
    assert next_class([1, 2], {0: 10.0}, ()) == 1


def test_a_class_below_its_floor_goes_first() -> None:
    assert next_class([0, 1], {0: 9.5, 1: 0.5}, (0.0, 0.1)) == 1
    assert next_class([0, 1], {0: 8.5, 1: 1.5}, (0.0, 0.1)) == 0


def test_the_class_furthest_below_its_floor_goes_first() -> None:
    counts = {0: 8.0, 1: 1.0, 2: 1.0}
    assert next_class([0, 1, 2], counts, (0.0, 0.2, 0.4)) == 2


def test_a_floor_holds_over_many_grants() -> None:
    counts: dict[int, float] = {}
    served = []
    for _ in range(1000):
        rank = next_class([0, 1], counts, (0.0, 0.1))
        counts = served_counts(counts, rank)
        served.append(rank)
    assert abs(sum(served[200:]) / 800 - 0.1) < 0.01


def test_a_taken_slot_moves_from_one_class_to_the_other() -> None:
    assert taken_counts({0: 5.0, 1: 5.0}, 0, 1) == {0: 6.0, 1: 4.0}
    assert taken_counts({0: 5.0, 1: 0.5}, 0, 1) == {0: 6.0, 1: 0.0}  # never below 0
    assert taken_counts({}, 1, 0) == {0: 0.0, 1: 1.0}


def test_a_take_is_judged_with_the_slot_counted_for_nobody() -> None:
    assert without_slot({0: 9.0, 1: 1.5}, 1) == {0: 9.0, 1: 0.5}
    assert without_slot({0: 9.0}, 1) == {0: 9.0, 1: 0.0}
    # batch's 1.5 of 10.5 is above a tenth with the slot, below it without
    assert next_class([0, 1], {0: 9.0, 1: 1.5}, (0.0, 0.1)) == 0
    assert next_class([0, 1], without_slot({0: 9.0, 1: 1.5}, 1), (0.0, 0.1)) == 1


@pytest.mark.parametrize("floor", [0.05, 0.1, 0.2, 0.3])
def test_a_class_keeps_its_floor_of_the_slots_it_books_while_a_higher_class_takes_them(
    floor: float,
) -> None:
    """Each slot is booked by batch (a booking counts one, all decayed), then a higher
    caller takes it unless that leaves batch below its floor: batch keeps its floor of
    the slots, to within a hundredth, once its counters have forgotten the start."""
    floors = (0.0, floor)
    counts: dict[int, float] = {}
    kept = []
    for _ in range(600):
        counts = served_counts(counts, 1)
        if next_class([0, 1], without_slot(counts, 1), floors) == 0:
            counts = taken_counts(counts, 0, 1)
            kept.append(0)
        else:
            kept.append(1)
    assert floor <= sum(kept[200:]) / 400 <= floor + 0.015


def test_a_backlogged_tenants_tag_moves_by_the_tokens_used_over_its_weight() -> None:
    assert corrected(500.0, 100.0, 100, 1000, 2.0) == 950.0
    assert corrected(500.0, 100.0, 1000, 100, 2.0) == 50.0  # refunded


def test_a_tenant_behind_the_virtual_time_is_not_moved() -> None:
    assert corrected(80.0, 100.0, 100, 1000, 1.0) == 80.0


def test_a_class_counted_for_the_first_time_counts_one() -> None:
    assert served_counts({}, 1) == {1: 1.0}


@pytest.mark.parametrize(
    ("waiting", "counts", "floors", "served"),
    [
        ([0, 1], {}, (), 0),  # no floors declared: the highest class, whatever it had
        ([0, 1], {0: 5.0, 1: 1.0}, (), 0),
        ([0, 1], {0: 1.0}, (0.0, 0.5), 1),  # a class never served has a share of 0
        ([0, 1], {}, (0.0, 0.3), 1),  # nothing served yet: every share is 0
        ([0, 1], {1: 0.5}, (0.0, 0.6), 0),  # counters below one grant still make shares
        ([0, 1], {0: 3.0, 1: 1.0}, (0.0, 0.25), 0),  # at its floor exactly: not below it
    ],
)
def test_the_next_class_at_the_edges_of_its_floor(
    waiting: list[int], counts: dict[int, float], floors: tuple[float, ...], served: int
) -> None:
    assert next_class(waiting, counts, floors) == served


def test_a_tag_is_capped_just_below_the_next_class() -> None:
    assert score(0, RANK_SPAN) == RANK_SPAN - 1
    assert score(1, 5.0) == RANK_SPAN + 5.0


@pytest.mark.parametrize(
    ("finish", "virtual", "est", "used", "moved_to"),
    [
        (10.0, 10.0, 100, 50, 10.0),  # at the virtual time: its next call starts there anyway
        (20.0, 10.0, 1, 0, 20.0),  # no tokens used counts as one, as the estimate did
        (20.0, 10.0, 1, 5, 24.0),
        (20.0, 10.0, 0, 5, 24.0),  # an estimate of none counted one
    ],
)
def test_a_correction_moves_a_tenant_ahead_by_the_tokens_it_did_not_estimate(
    finish: float, virtual: float, est: int, used: int, moved_to: float
) -> None:
    assert corrected(finish, virtual, est, used, 1.0) == moved_to


def test_calls_are_counted_per_class_the_last_class_taking_any_rank_beyond() -> None:
    assert per_class([0, 0, 2, 9]) == (2, 0, 1, 0, 0, 0, 0, 1)
    assert per_class([]) == ()


def test_grant_counters_by_rank_keep_their_gaps() -> None:
    assert per_rank({0: 2.0, 2: 1.0}) == (2.0, 0.0, 1.0)


def test_only_trailing_zeros_are_trimmed() -> None:
    assert trimmed([1, 0, 2, 0, 0]) == (1, 0, 2)
    assert trimmed([1, 2, 0]) == (1, 2)
    assert trimmed([0, 0]) == ()
