"""Public exceptions (SPEC §4): the tree, messages, and surviving Celery's JSON result backend."""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest

from polygate_celery.core.outcome import AttemptRecord
from polygate_celery.errors import (
    AllSourcesExhausted,
    ConfigError,
    DeferralBudgetExceeded,
    GatewayUnavailableError,
    GovernanceBackendError,
    PolygateError,
    SourceFatalError,
    StoreReplyError,
    StoreUnreachable,
)

TRAIL = (
    AttemptRecord("a", "transient", 300.0, 0.0, reason="timeout"),
    AttemptRecord("b", "rate_limited", 2.5, 301.0, status=429, burned_budget=False),
)

FIELDS: dict[type[PolygateError], tuple[str, ...]] = {
    AllSourcesExhausted: (
        "reason",
        "scope",
        "retry_after_s",
        "attempts",
        "last_error",
        "trail",
        "rate_limited",
    ),
    GovernanceBackendError: ("message", "scope"),
    StoreUnreachable: ("message", "scope"),
    StoreReplyError: ("message", "scope"),
    SourceFatalError: ("reason", "scope", "source", "status", "trail"),
    ConfigError: ("field", "message", "problems"),
    DeferralBudgetExceeded: (
        "reason",
        "scope",
        "deferrals",
        "age_s",
        "retry_after_s",
        "last_error",
        "source",
        "status",
    ),
}

EXAMPLES: list[PolygateError] = [
    AllSourcesExhausted("stalled", "summarise", 12.5, 3, "HTTP 503", TRAIL),
    AllSourcesExhausted("retry_exhausted", "embed", 1.0),
    AllSourcesExhausted("stalled", "chat", 42.0, rate_limited=True),
    AllSourcesExhausted("fail_fast", "ocr", 30.0, attempts=0),
    AllSourcesExhausted("deadline", "s", 3600.0, 7, None, [r.as_dict() for r in TRAIL]),
    GovernanceBackendError("connection refused", "summarise"),
    GovernanceBackendError("script returned nonsense"),
    StoreUnreachable("admit: ConnectionError: Connection refused", "summarise"),
    StoreReplyError("gate: unexpected reply b'x'"),
    SourceFatalError("content policy", "summarise", "a", 400, TRAIL),
    SourceFatalError("no source left", "summarise"),
    ConfigError("scopes.x.stall_window_s", "Input should be greater than 0"),
    ConfigError("a.b", "bad", [("a.b", "bad"), ("c", "worse")]),
    DeferralBudgetExceeded("stalled", "down", 3, 7.2, 30.0, "vllm: transient: refused", "vllm"),
    DeferralBudgetExceeded("stalled", "down", 3, 7.2, 30.0),  # as raised before last_error
]


def fields_of(exc: PolygateError) -> dict[str, Any]:
    return {name: getattr(exc, name) for name in FIELDS[type(exc)]}


@pytest.mark.parametrize("exc", EXAMPLES, ids=lambda e: type(e).__name__)
def test_rebuilds_from_args(exc: PolygateError) -> None:
    rebuilt = type(exc)(*exc.args)
    assert fields_of(rebuilt) == fields_of(exc)
    assert rebuilt.args == exc.args
    assert str(rebuilt) == str(exc)


@pytest.mark.parametrize("exc", EXAMPLES, ids=lambda e: type(e).__name__)
def test_survives_the_json_result_backend(exc: PolygateError) -> None:
    # Celery's JSON backend stores the args and rebuilds with cls(*args).
    args = json.loads(json.dumps(exc.args))
    rebuilt = type(exc)(*args)
    assert fields_of(rebuilt) == fields_of(exc)
    assert str(rebuilt) == str(exc)


@pytest.mark.parametrize("exc", EXAMPLES, ids=lambda e: type(e).__name__)
def test_survives_pickle(exc: PolygateError) -> None:
    rebuilt = pickle.loads(pickle.dumps(exc))
    assert type(rebuilt) is type(exc)
    assert fields_of(rebuilt) == fields_of(exc)
    assert str(rebuilt) == str(exc)


def test_exhausted_args_are_in_constructor_order() -> None:
    exc = AllSourcesExhausted("stalled", "s", 5, 2, "boom", TRAIL)
    assert exc.args == ("stalled", "s", 5.0, 2, "boom", [r.as_dict() for r in TRAIL], False)


def test_exhausted_rejects_an_unknown_reason() -> None:
    with pytest.raises(ValueError, match="unknown AllSourcesExhausted reason"):
        AllSourcesExhausted("gave_up", "s", 1.0)  # type: ignore[arg-type]


def test_exhausted_coerces_numbers() -> None:
    exc = AllSourcesExhausted("stalled", "s", 5, attempts=2.0)  # type: ignore[arg-type]
    assert exc.retry_after_s == 5.0
    assert isinstance(exc.retry_after_s, float)
    assert exc.attempts == 2
    assert isinstance(exc.attempts, int)


@pytest.mark.parametrize("cls", [AllSourcesExhausted, SourceFatalError])
def test_trail_round_trips_from_dicts_to_records(cls: type[PolygateError]) -> None:
    dicts = json.loads(json.dumps([r.as_dict() for r in TRAIL]))
    if cls is AllSourcesExhausted:
        exc: Any = AllSourcesExhausted("stalled", "s", 1.0, 2, None, dicts)
    else:
        exc = SourceFatalError("bad request", "s", "a", 400, dicts)
    assert exc.trail == TRAIL
    assert all(isinstance(r, AttemptRecord) for r in exc.trail)


def test_source_fatal_attempts_is_the_trail_length() -> None:
    assert SourceFatalError("x", "s", trail=TRAIL).attempts == 2
    assert SourceFatalError("x", "s").attempts == 0


def test_exhausted_message_is_readable() -> None:
    exc = AllSourcesExhausted("stalled", "summarise", 12.5, 3, "HTTP 503")
    assert str(exc) == (
        "scope 'summarise': stalled after 3 attempt(s); retry after 12.5 s; last error: HTTP 503"
    )
    assert "last error" not in str(AllSourcesExhausted("fail_fast", "s", 1.0))


def test_backend_message_is_readable() -> None:
    assert str(GovernanceBackendError("timeout", "s")) == (
        "scope 's': governance store unavailable: timeout"
    )
    assert str(GovernanceBackendError("timeout")) == "governance store unavailable: timeout"


def test_source_fatal_message_is_readable() -> None:
    assert str(SourceFatalError("content policy", "s", "a", 400)) == (
        "scope 's': fatal from source 'a' (HTTP 400): content policy"
    )
    assert str(SourceFatalError("no source left", "s")) == "scope 's': fatal: no source left"


def test_config_error_message_lists_every_problem() -> None:
    one = ConfigError("scopes.x.max_attempts", "must be at least 1")
    assert str(one) == "invalid configuration: scopes.x.max_attempts: must be at least 1"
    assert one.problems == (("scopes.x.max_attempts", "must be at least 1"),)
    many = ConfigError("a", "bad", [("a", "bad"), ("b.c", "worse")])
    assert str(many) == "invalid configuration:\n  a: bad\n  b.c: worse"
    assert many.field == "a"


def test_class_hierarchy() -> None:
    assert issubclass(PolygateError, Exception)
    assert issubclass(GatewayUnavailableError, PolygateError)
    assert issubclass(AllSourcesExhausted, GatewayUnavailableError)
    assert issubclass(GovernanceBackendError, GatewayUnavailableError)
    assert issubclass(StoreUnreachable, GovernanceBackendError)
    assert issubclass(StoreReplyError, GovernanceBackendError)
    assert not issubclass(StoreUnreachable, StoreReplyError)
    assert issubclass(SourceFatalError, PolygateError)
    assert not issubclass(SourceFatalError, GatewayUnavailableError)
    assert issubclass(ConfigError, PolygateError)
    assert not issubclass(ConfigError, GatewayUnavailableError)


def test_deferral_budget_names_the_last_verdicts_last_error() -> None:
    trail = (
        AttemptRecord("vllm", "transient", 0.1, 0.0, status=503, reason="upstream error"),
        AttemptRecord("vllm", "transient", 0.1, 1.0, reason="connection refused"),
    )
    verdict = AllSourcesExhausted(
        "stalled", "down", 30.0, 2, "vllm: transient: connection refused", trail
    )
    exc = DeferralBudgetExceeded.after(verdict, 3, 7.2)
    assert (exc.reason, exc.scope, exc.deferrals, exc.retry_after_s) == ("stalled", "down", 3, 30)
    assert (exc.last_error, exc.source, exc.status) == (
        "vllm: transient: connection refused",
        "vllm",
        None,
    )
    assert str(exc) == (
        "scope 'down': deferral budget spent after 3 deferral(s) over 7 s; last verdict: "
        "stalled; last error: vllm: transient: connection refused"
    )
    rebuilt = DeferralBudgetExceeded(*json.loads(json.dumps(exc.args)))
    assert str(rebuilt) == str(exc)
    assert rebuilt.source == "vllm"


def test_deferral_budget_after_a_store_outage_names_it() -> None:
    exc = DeferralBudgetExceeded.after(GovernanceBackendError("admit: timeout", "down"), 5, 60)
    assert exc.reason == "backend_error"
    assert exc.last_error == "scope 'down': governance store unavailable: admit: timeout"
    assert str(exc).endswith(
        "last error: scope 'down': governance store unavailable: admit: timeout"
    )
