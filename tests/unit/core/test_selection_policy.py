"""Source preference order within a call, and the per-kind 429 policy."""

from __future__ import annotations

import pytest

from polygate_celery.core.policy import KINDS, Kind, KindPolicy, policy_for
from polygate_celery.core.selection import preference_order


def test_configuration_order_is_priority() -> None:
    assert preference_order(["a", "b", "c"], excluded=(), last_failure={}) == ["a", "b", "c"]


def test_a_failed_source_goes_behind_every_source_that_has_not_failed() -> None:
    assert preference_order(["a", "b", "c"], (), {"a": 1}) == ["b", "c", "a"]


def test_most_recent_failure_goes_last() -> None:
    assert preference_order(["a", "b", "c"], (), {"a": 2, "b": 1}) == ["c", "b", "a"]
    assert preference_order(["a", "b", "c"], (), {"a": 1, "b": 2}) == ["c", "a", "b"]


def test_when_every_source_failed_the_least_recent_comes_first() -> None:
    assert preference_order(["a", "b"], (), {"a": 3, "b": 2}) == ["b", "a"]


def test_excluded_sources_are_left_out() -> None:
    assert preference_order(["a", "b", "c"], {"b"}, {}) == ["a", "c"]
    assert preference_order(["a", "b", "c"], {"b"}, {"a": 1, "b": 2}) == ["c", "a"]


def test_every_source_excluded_leaves_nothing() -> None:
    assert preference_order(["a", "b"], {"a", "b"}, {}) == []


def test_failures_of_unknown_sources_are_ignored() -> None:
    assert preference_order(["a", "b"], (), {"zz": 1}) == ["a", "b"]


def test_preference_order_does_not_mutate_its_input() -> None:
    sources = ["a", "b", "c"]
    preference_order(sources, {"a"}, {"b": 1})
    assert sources == ["a", "b", "c"]


def test_kinds() -> None:
    assert KINDS == ("chat", "embedding", "ocr")


@pytest.mark.parametrize(("kind", "exempt"), [("chat", True), ("embedding", False), ("ocr", False)])
def test_policy_defaults(kind: Kind, exempt: bool) -> None:
    assert policy_for(kind) == KindPolicy(kind=kind, rate_limit_exempt=exempt)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("override", [True, False])
def test_policy_override_wins(kind: Kind, override: bool) -> None:
    policy = policy_for(kind, rate_limit_exempt=override)
    assert policy.rate_limit_exempt is override
    assert policy.kind == kind


def test_the_source_the_call_stays_on_goes_first() -> None:
    # After a 5xx on "c" the call retries "c" once (SPEC §5 "Failover discipline").
    assert preference_order(["a", "b", "c"], (), {"c": 1}, stay="c") == ["c", "a", "b"]
    assert preference_order(["a", "b", "c"], (), {}, stay="b") == ["b", "a", "c"]


def test_staying_on_the_first_source_changes_nothing() -> None:
    assert preference_order(["a", "b", "c"], (), {}, stay="a") == ["a", "b", "c"]


def test_a_stay_that_is_no_longer_a_candidate_is_ignored() -> None:
    assert preference_order(["a", "b", "c"], {"c"}, {"c": 1}, stay="c") == ["a", "b"]
    assert preference_order(["a", "b"], (), {}, stay="zz") == ["a", "b"]
