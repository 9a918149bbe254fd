"""A classified attempt (SPEC §5) and the attempt trail's record."""

from __future__ import annotations

import json

import pytest

from polygate_celery.core.outcome import AttemptRecord, Outcome, OutcomeKind, RateLimits


def test_a_success_carries_its_value_and_fields() -> None:
    outcome = Outcome.success({"text": "hi"}, status=200, model="m", prompt_tokens=3)
    assert outcome.kind is OutcomeKind.SUCCESS
    assert outcome.value == {"text": "hi"}
    assert (outcome.status, outcome.model, outcome.prompt_tokens) == (200, "m", 3)
    assert not outcome.timed_out


def test_a_rate_limit_is_a_429_with_its_hint() -> None:
    outcome = Outcome.rate_limited(12.5)
    assert outcome.kind is OutcomeKind.RATE_LIMITED
    assert outcome.status == 429
    assert outcome.retry_after_s == 12.5


def test_a_rate_limit_without_a_hint_has_none() -> None:
    outcome = Outcome.rate_limited()
    assert outcome.retry_after_s is None
    assert outcome.status == 429


def test_a_rate_limit_keeps_the_status_and_fields_it_was_given() -> None:
    limits = RateLimits(requests_remaining=0)
    outcome = Outcome.rate_limited(3.0, status=529, reason="overloaded", limits=limits)
    assert outcome.status == 529
    assert outcome.reason == "overloaded"
    assert outcome.limits is limits
    assert outcome.retry_after_s == 3.0


def test_a_transient_failure_carries_its_reason_and_fields() -> None:
    outcome = Outcome.transient("HTTP 503", status=503)
    assert outcome.kind is OutcomeKind.TRANSIENT
    assert (outcome.reason, outcome.status) == ("HTTP 503", 503)
    assert not outcome.timed_out


def test_a_timeout_is_a_transient_failure_marked_timed_out() -> None:
    outcome = Outcome.timeout()
    assert outcome.kind is OutcomeKind.TRANSIENT
    assert outcome.timed_out
    assert outcome.reason == "timeout"
    assert Outcome.timeout("first token after 30 s").reason == "first token after 30 s"
    assert Outcome.timeout().status is None


def test_a_rejection_carries_its_reason_and_fields() -> None:
    outcome = Outcome.rejected("HTTP 401", status=401, credentials_rejected=True)
    assert outcome.kind is OutcomeKind.REJECTED
    assert (outcome.reason, outcome.status, outcome.credentials_rejected) == ("HTTP 401", 401, True)
    assert not Outcome.rejected("HTTP 400").credentials_rejected


def test_a_fatal_outcome_carries_its_reason_and_fields() -> None:
    outcome = Outcome.fatal("bad request", status=400)
    assert outcome.kind is OutcomeKind.FATAL
    assert (outcome.reason, outcome.status) == ("bad request", 400)


@pytest.mark.parametrize(
    ("prompt", "completion", "used"),
    [(None, None, None), (3, None, 3), (None, 4, 4), (3, 4, 7), (0, 0, 0)],
)
def test_used_tokens_adds_what_the_provider_reported(
    prompt: int | None, completion: int | None, used: int | None
) -> None:
    outcome = Outcome.success("x", prompt_tokens=prompt, completion_tokens=completion)
    assert outcome.used_tokens == used


def test_an_attempt_record_survives_a_json_result_backend() -> None:
    record = AttemptRecord(
        "a", "rate_limited", 1.5, 0.25, status=429, reason="429", burned_budget=False,
        productive=False,
    )  # fmt: skip
    rebuilt = AttemptRecord.from_value(json.loads(json.dumps(record.as_dict())))
    assert rebuilt == record
    assert AttemptRecord.from_value(record) is record


def test_an_attempt_record_as_a_dict_names_every_field() -> None:
    assert AttemptRecord("a", "success", 1.0, 0.0).as_dict() == {
        "source": "a",
        "outcome": "success",
        "seconds": 1.0,
        "started_s": 0.0,
        "status": None,
        "reason": None,
        "burned_budget": True,
        "productive": True,
    }
