"""The deferral delay: grown per deferral that waited out an estimate, never for a reset;
the deferral budget, read on the runtime's injected time and draws."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from celery import Celery

from polygate_celery import AllSourcesExhausted, DeferralBudgetExceeded, parse_config
from polygate_celery.celery.deferral import DeferralState, deferral_delay, next_deferral
from polygate_celery.config.models import DeferralConfig
from polygate_celery.testing import VirtualClock
from polygate_celery.testing.celery import governed_tasks

CONFIG = DeferralConfig(growth=2.0, min_delay_s=1.0, max_delay_s=600.0, jitter=0.25)


@pytest.mark.parametrize(("deferrals", "expected"), [(0, 30.0), (1, 60.0), (2, 120.0), (9, 600.0)])
def test_an_estimate_grows_per_deferral_up_to_the_cap(deferrals: int, expected: float) -> None:
    assert deferral_delay(30.0, deferrals, CONFIG, u=0.0) == expected


@pytest.mark.parametrize("deferrals", [0, 1, 5, 20])
def test_a_rate_limit_reset_is_the_delay_however_often_the_task_was_deferred(
    deferrals: int,
) -> None:
    assert deferral_delay(30.0, deferrals, CONFIG, u=0.0, grow=False) == 30.0


def test_jitter_only_stretches() -> None:
    assert deferral_delay(30.0, 0, CONFIG, u=1.0) == 37.5
    assert deferral_delay(0.1, 0, CONFIG, u=0.0, grow=False) == 1.0  # the floor still holds


def test_a_reset_is_spread_by_at_most_a_second() -> None:
    assert deferral_delay(30.0, 3, CONFIG, u=1.0, grow=False) == 31.0
    assert deferral_delay(2.0, 3, CONFIG, u=1.0, grow=False) == 2.5  # 25 % of a short one


def headers(**values: object) -> DeferralState:
    task = SimpleNamespace(request=SimpleNamespace(headers=values))
    return DeferralState.of(task)  # type: ignore[arg-type]


def test_only_deferrals_that_waited_out_an_estimate_count_for_growth() -> None:
    state = headers(polygate_deferrals=3, polygate_grown=1)
    assert (state.count, state.grown) == (3, 1)


def test_a_message_from_before_the_grown_header_grows_per_deferral() -> None:
    assert headers(polygate_deferrals=3).grown == 3
    assert headers(polygate_deferrals=2, polygate_grown=7).grown == 2  # never more than them


def test_a_message_never_deferred_says_so() -> None:
    assert headers() == DeferralState(count=0, first_at=None, grown=0)
    task = SimpleNamespace(request=SimpleNamespace(headers=None))  # Celery's default
    assert DeferralState.of(task) == DeferralState()  # type: ignore[arg-type]


def test_when_it_was_first_deferred_is_read_as_seconds() -> None:
    assert headers(polygate_deferrals=1, polygate_first_deferred_at=1700000000.5).first_at == (
        1700000000.5
    )
    assert headers(polygate_deferrals=1, polygate_first_deferred_at=1700000000).first_at == (
        1700000000.0
    )
    assert headers(polygate_deferrals=1, polygate_first_deferred_at="soon").first_at is None


@pytest.mark.parametrize("bad", [True, -1, "3", 2.0, None])
def test_a_count_that_is_not_a_whole_number_reads_as_none(bad: object) -> None:
    assert headers(polygate_deferrals=bad).count == 0
    assert headers(polygate_deferrals=3, polygate_grown=bad).grown == 3  # as if absent


def test_none_grown_is_a_count_of_its_own() -> None:
    assert headers(polygate_deferrals=3, polygate_grown=0).grown == 0


STALLED = AllSourcesExhausted("stalled", "s", retry_after_s=30.0)
BUDGET = DeferralConfig(
    growth=2.0, min_delay_s=1.0, max_delay_s=600.0, jitter=0.25, max_defer_age_s=100.0
)


def test_a_virtual_clock_and_the_injected_draw_drive_the_deferral() -> None:
    clock = VirtualClock(start=1_700_000_000.0)
    first = next_deferral(DeferralState(), STALLED, BUDGET, clock.now(), u=1.0)
    assert first.state == DeferralState(count=1, first_at=1_700_000_000.0, grown=1)
    assert first.delay_s == deferral_delay(30.0, 0, BUDGET, u=1.0) == 37.5
    clock.advance(first.delay_s)
    second = next_deferral(first.state, STALLED, BUDGET, clock.now(), u=0.0)
    assert second.state == DeferralState(count=2, first_at=1_700_000_000.0, grown=2)
    assert second.delay_s == 60.0  # grown once, no jitter drawn
    clock.advance(100.0)  # past max_defer_age_s since the first deferral
    with pytest.raises(DeferralBudgetExceeded):
        next_deferral(second.state, STALLED, BUDGET, clock.now(), u=0.0)


def test_a_wait_for_a_reset_is_not_grown() -> None:
    reset = AllSourcesExhausted("stalled", "s", retry_after_s=30.0, rate_limited=True)
    step = next_deferral(DeferralState(count=2, first_at=0.0, grown=2), reset, BUDGET, 5.0, 0.0)
    assert (step.reset, step.state.grown, step.delay_s) == (True, 2, 30.0)


def test_a_runtime_draws_its_deferral_jitter_from_the_injected_random() -> None:
    app = Celery("draws", set_as_current=False)
    source = {"base_url": "http://127.0.0.1:9/v1", "model": "m"}
    config = parse_config(
        {"sources": {"a": source}, "scopes": {"s": {"kind": "chat", "sources": ["a"]}}}
    )
    with governed_tasks(app, config, clock=VirtualClock(), random=lambda: 0.75) as runtime:
        assert runtime.random() == 0.75
