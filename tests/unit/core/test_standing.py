"""Decision core: a waiting call's standing (`core.standing`): tags, scores, floors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from polygate_celery.core.standing import (
    CREDIT_TOLERANCE,
    DECAY,
    RANK_SPAN,
    arrival_at,
    corrected,
    credit_of,
    next_class,
    owed,
    per_class,
    per_rank,
    rank_of,
    score,
    served_counts,
    slot_goes_to,
    tag,
    tag_text,
    takes_later,
    trimmed,
    used_credits,
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


def test_a_slot_used_costs_its_class_and_earns_the_others_their_floors() -> None:
    floors = (0.0, 0.1, 0.3)
    credits = used_credits({1: -0.5, 2: 0.0}, 0, floors)
    assert credits == pytest.approx({1: -0.4, 2: 0.3})  # a class without a floor: none
    assert used_credits(credits, 2, floors) == pytest.approx({1: -0.3, 2: -0.4})


def test_a_class_without_a_credit_yet_starts_at_its_lowest() -> None:
    assert not owed({}, 1, (0.0, 0.1))
    assert used_credits({}, 0, (0.0, 0.1)) == pytest.approx({1: -0.8})


def test_the_credits_stay_within_their_bounds() -> None:
    floors = (0.0, 0.25)
    assert used_credits({1: -0.75}, 1, floors) == {1: -0.75}  # used alone: no debt
    assert used_credits({1: 1.0}, 0, floors) == {1: 1.0}  # idle: owed one slot at most


def test_a_class_is_owed_a_slot_once_its_credit_comes_round_to_0() -> None:
    floors = (0.0, 0.1)
    credits: dict[int, float] = {1: -0.9}
    for _ in range(8):
        credits = used_credits(credits, 0, floors)
        assert not owed(credits, 1, floors)
    credits = used_credits(credits, 0, floors)
    assert credits[1] < 0  # nine additions of 0.1 fall short by a rounding
    assert credits[1] >= -CREDIT_TOLERANCE
    assert owed(credits, 1, floors)
    assert not owed(credits, 0, floors)  # no floor: never owed


def test_a_slot_goes_to_a_class_owed_one_else_to_the_higher() -> None:
    floors = (0.0, 0.1, 0.2)
    assert slot_goes_to(0, 1, {1: -0.5}, floors) == 0
    assert slot_goes_to(0, 1, {1: 0.0}, floors) == 1
    assert slot_goes_to(1, 0, {1: 0.0}, floors) == 1
    assert slot_goes_to(1, 2, {1: 0.0, 2: 0.4}, floors) == 2  # owed more
    assert slot_goes_to(2, 1, {1: 0.0, 2: 0.4}, floors) == 2
    assert slot_goes_to(1, 2, {1: 0.4, 2: 0.0}, floors) == 1
    assert slot_goes_to(1, 2, {1: 0.1, 2: 0.1}, floors) == 1  # owed alike: the higher
    assert slot_goes_to(2, 1, {1: 0.1, 2: 0.1}, floors) == 1
    assert slot_goes_to(2, 1, {1: -0.5, 2: -0.5}, floors) == 1


def test_a_class_without_a_floor_is_never_owed_whatever_its_credit() -> None:
    assert not owed({0: 0.5}, 0, (0.0, 0.1))
    assert not owed({3: 0.5}, 3, (0.0, 0.1))  # beyond the floors declared
    assert credit_of({}, 3, (0.0, 0.1)) == -1.0
    assert credit_of({}, 2, (0.0, 0.1)) == -1.0  # the first rank beyond them


def test_a_credit_at_the_tolerance_below_0_is_owed() -> None:
    assert owed({1: -CREDIT_TOLERANCE}, 1, (0.0, 0.1))
    assert not owed({1: -2 * CREDIT_TOLERANCE}, 1, (0.0, 0.1))


@pytest.mark.parametrize("floor", [0.05, 0.1, 0.25, 0.5])
def test_a_floor_is_kept_in_every_run_of_slots_from_the_first_owed_one(floor: float) -> None:
    """Batch used every slot while interactive was idle; then both want them all. Each
    slot goes as `slot_goes_to` says, and batch's share of the slots used is its floor
    to one slot in every run, from its first owed slot on: no more, no less."""
    floors = (0.0, floor)
    credits: dict[int, float] = {}
    for _ in range(50):
        credits = used_credits(credits, 1, floors)
    used = []
    for _ in range(1000):
        rank = slot_goes_to(0, 1, credits, floors)
        credits = used_credits(credits, rank, floors)
        used.append(rank)
    start = used.index(1)
    assert start == round((1 - floor) / floor)  # its lowest credit earned back
    for width in (40, 100):
        for at in range(start, 1000 - width, 7):
            assert abs(sum(used[at : at + width]) - floor * width) <= 1


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


def test_a_call_takes_a_later_call_of_its_class_only() -> None:
    assert takes_later(100, 1, 200, 1)  # a later call of its own class
    assert not takes_later(200, 1, 100, 1)  # an earlier one
    assert not takes_later(100, 1, 100, 1)  # itself, or a tie
    assert not takes_later(100, 1, 200, 2)  # another class: the classes' rules decide
    assert not takes_later(None, 1, 200, 1)  # no arrival yet: it is the latest


def test_between_tenants_a_call_takes_one_of_a_higher_tag() -> None:
    # (arrivals the other way round: tags decide between calls of tenants)
    assert takes_later(200, 1, 100, 1, tag=10.0, booker_tag=20.0)
    assert not takes_later(100, 1, 200, 1, tag=20.0, booker_tag=10.0)
    assert not takes_later(100, 1, 200, 1, tag=20.0, booker_tag=20.0)  # a tie
    assert not takes_later(100, 1, 200, 2, tag=10.0, booker_tag=20.0)  # another class
    # a call of a tenant and one of none take nothing of each other
    assert not takes_later(100, 1, 200, 1, tag=10.0)
    assert not takes_later(100, 1, 200, 1, booker_tag=20.0)


@given(st.floats(min_value=0, max_value=2.0**60, allow_nan=False))
def test_a_tag_written_as_the_scripts_write_it_reads_back_the_same(x: float) -> None:
    assert float(tag_text(x)) == x
    assert tag_text(float(tag_text(x))) == tag_text(x)  # the booking's name, given back
    assert tag_text(x) == "%.17g" % x  # noqa: UP031 (Lua's string.format, as fmt() uses)


def test_an_arrival_is_the_store_time_in_microseconds() -> None:
    assert arrival_at(1733460000.1234567) == 1733460000123457
    assert arrival_at(0.0) == 0  # a valid arrival (virtual time), not "none"
