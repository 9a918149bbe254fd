"""The deferral delay: grown per deferral when it is an estimate, not when it is a reset."""

from __future__ import annotations

import pytest

from polygate_celery.celery import deferral_delay
from polygate_celery.config.models import DeferralConfig

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
