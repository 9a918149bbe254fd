"""A provider's reset headers: a bucket told from a window, and the window followed
(core.quota: counts_in_windows, window_learn, window_take, window_charge)."""

from __future__ import annotations

import math

import pytest

from polygate_celery.core.quota import (
    ARRIVAL_MARGIN_S,
    PERIOD_S,
    RESET_EVIDENCE_S,
    counts_in_windows,
    window_charge,
    window_learn,
    window_take,
)


@pytest.mark.parametrize(
    ("limit", "remaining", "reset_s"),
    [
        (120, 119, 0.5),  # one spent: refilled in 60 / 120 s
        (120, 60, 30.0),
        (120, 0, 60.0),
        (120, 120, 0.0),
        (120, 59, 30.2),  # remaining rounded down: up to one request's refill less
        (60, 59, 1.0),  # OpenAI's documented example: 60 / 59 / "1s"
        (1000, 999, 1.0),  # Anthropic's whole seconds, rounded up
        (120, 100, 10.0 + 5.0),  # a few seconds of clock skew
        (60, 60, 1.0 + RESET_EVIDENCE_S),  # off by one request's refill plus the evidence
    ],
)
def test_a_bucket_announces_its_refill_time(limit: int, remaining: int, reset_s: float) -> None:
    assert counts_in_windows(limit, remaining, reset_s) is False


@pytest.mark.parametrize(
    ("limit", "remaining", "reset_s"),
    [
        (120, 119, 59.8),  # a window's first request: a minute to its end
        (120, 100, 45.0),
        (120, 20, 2.0),  # near its end, most of it spent
        (3, 2, 60.0),
        (120, 119, PERIOD_S + RESET_EVIDENCE_S),  # the longest reset a minute's window has
    ],
)
def test_a_window_announces_its_end(limit: int, remaining: int, reset_s: float) -> None:
    assert counts_in_windows(limit, remaining, reset_s) is True


@pytest.mark.parametrize(
    ("limit", "remaining", "reset_s"),
    [
        (None, 10, 5.0),
        (120, None, 5.0),
        (120, 10, None),
        (0, 0, 5.0),
        (-5, 0, 5.0),
        (120, 121, 5.0),  # more left than the limit
        (120, -1, 5.0),
        (120, 10, -1.0),
        (120, 10, math.nan),
        (120, 10, math.inf),
        (200, 199, 432.0),  # a daily limit (OpenAI's free tier): not a minute's
        (120, 119, PERIOD_S + RESET_EVIDENCE_S + 1.0),
    ],
)
def test_an_absent_or_implausible_announcement_says_nothing(
    limit: int | None, remaining: int | None, reset_s: float | None
) -> None:
    assert counts_in_windows(limit, remaining, reset_s) is None


def test_a_one_request_limit_never_shows_a_window() -> None:
    # One request's refill is the whole period: every reset fits a bucket.
    assert counts_in_windows(1, 0, 60.0) is False
    assert counts_in_windows(1, 1, 0.0) is False


def test_a_window_is_learned_from_its_first_answer() -> None:
    assert window_learn(-math.inf, 0.0, 10.0, 119, 59.8) == (pytest.approx(69.8), 119.0)


def test_answers_of_the_same_window_only_take_from_what_is_left() -> None:
    end, left = window_learn(-math.inf, 0.0, 10.0, 100, 50.0)  # ends at 60
    end, left = window_learn(end, 90.0, 11.0, 95, 49.0)  # the fleet counted more
    assert (end, left) == (pytest.approx(60.0), 90.0)
    end, left = window_learn(end, left, 12.0, 80, 49.0)  # another user of the key spent
    assert (end, left) == (pytest.approx(61.0), 80.0)  # the later end is kept


def test_an_answer_of_a_past_window_is_not_taken() -> None:
    # The window ends at 120; a late answer of the one that ended at 60 says 0 left.
    assert window_learn(120.0, 100.0, 61.0, 0, 0.5) == (120.0, 100.0)


def test_the_window_ending_a_few_seconds_earlier_is_the_same_window() -> None:
    assert window_learn(120.0, 100.0, 61.0, 30, 55.0) == (120.0, 30.0)
    # Its end exactly `RESET_EVIDENCE_S` before the one known: still the same window.
    assert window_learn(120.0, 100.0, 61.0, 30, 49.0) == (120.0, 30.0)


def test_a_window_ending_now_is_over_and_the_answer_announces_the_next() -> None:
    assert window_learn(60.0, 5.0, 60.0, 100, 59.0) == (119.0, 100.0)


def test_what_is_left_is_taken_until_just_before_the_end_then_a_new_window() -> None:
    assert window_take(60.0, 2.0, 10.0, 120) == (60.0, 1.0)
    assert window_take(60.0, 1.0, 10.0, 120) == (60.0, 0.0)  # the last one left
    assert window_take(60.0, 0.0, 10.0, 120) == pytest.approx(50.0)
    # Too close to the end: the request might reach the provider in the next window.
    assert window_take(60.0, 5.0, 60.0 - ARRIVAL_MARGIN_S / 2, 120) == pytest.approx(0.25)
    assert window_take(60.0, 5.0, 60.0 - ARRIVAL_MARGIN_S, 120) == ARRIVAL_MARGIN_S
    new_window = (pytest.approx(60.0 + ARRIVAL_MARGIN_S + PERIOD_S), 119.0)
    assert window_take(60.0, 0.0, 60.0, 120) == new_window


def test_a_lower_declared_limit_holds_back_the_difference() -> None:
    # 120 a window announced, 100 declared: 20 of what is left are not the fleet's.
    assert window_take(60.0, 21.0, 10.0, 120, 100) == (60.0, 20.0)
    assert window_take(60.0, 20.0, 10.0, 120, 100) == pytest.approx(50.0)
    assert window_take(60.0, 20.0, 10.0, 120, 200) == (60.0, 19.0)  # a higher one: no say
    assert window_take(60.0, 1.0, 10.0, 120, 120) == (60.0, 0.0)  # an equal one: none held
    assert window_take(60.0, 1.0, 10.0, 120, 200) == (60.0, 0.0)
    # A new window is counted in the provider's terms: 119 left, 20 of them held back.
    assert window_take(60.0, 0.0, 61.0, 120, 100) == (pytest.approx(121.5), 119.0)


def test_a_request_counted_as_a_bucket_keeps_the_window_up_to_date() -> None:
    assert window_charge(60.0, 3.0, 10.0) == 2.0
    assert window_charge(60.0, 0.0, 10.0) == 0.0
    assert window_charge(60.0, 3.0, 61.0) == 3.0  # ended: the next one is not known yet
    assert window_charge(60.0, 3.0, 60.0) == 3.0  # ending now: ended
