"""The classification table (SPEC §5) and Retry-After parsing, without a network."""

from __future__ import annotations

import email.utils
import json

import pytest

from polygate_celery.core.outcome import OutcomeKind
from polygate_celery.sources.classify import classify_error, retry_after_s


def error(code: str | None, message: str, kind: str = "invalid_request_error") -> str:
    return json.dumps({"error": {"message": message, "type": kind, "code": code}})


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Retry-After": "7"}, 7.0),
        ({"retry-after": "2.5"}, 2.5),
        ({"retry-after-ms": "1500"}, 1.5),
        ({"retry-after-ms": "1500", "Retry-After": "9"}, 1.5),  # the finer one wins
        ({"Retry-After": email.utils.formatdate(1_000_030, usegmt=True)}, 30.0),
        ({"Retry-After": email.utils.formatdate(999_000, usegmt=True)}, 0.0),  # in the past
        ({}, None),
        ({"Retry-After": "soon"}, None),
        ({"Retry-After": "-3"}, None),
        ({"Retry-After": "nan"}, None),
        ({"retry-after-ms": "lots", "Retry-After": "4"}, 4.0),
    ],
)
def test_retry_after_formats(headers: dict[str, str], expected: float | None) -> None:
    assert retry_after_s(headers, now=1_000_000) == expected


@pytest.mark.parametrize(
    ("status", "body", "kind", "reason"),
    [
        (429, "", OutcomeKind.RATE_LIMITED, "rate limited"),
        (408, "", OutcomeKind.TRANSIENT, "HTTP 408"),
        (409, "", OutcomeKind.TRANSIENT, "HTTP 409"),
        (
            500,
            error(None, "The server had an error"),
            OutcomeKind.TRANSIENT,
            "The server had an error",
        ),
        (502, "<html>bad gateway</html>", OutcomeKind.TRANSIENT, "HTTP 502"),
        (503, "", OutcomeKind.TRANSIENT, "HTTP 503"),
        (
            400,
            error("context_length_exceeded", "This model's maximum context length is 8192 tokens"),
            OutcomeKind.REJECTED,
            "This model's maximum context length is 8192 tokens",
        ),
        (400, error(None, "prompt is too long: 9000 tokens"), OutcomeKind.REJECTED, None),
        (404, error("model_not_found", "The model `m` does not exist"), OutcomeKind.REJECTED, None),
        (
            400,
            error("content_policy_violation", "Rejected by our safety system."),
            OutcomeKind.FATAL,
            "Rejected by our safety system.",
        ),
        (400, error(None, "Invalid 'temperature'"), OutcomeKind.FATAL, "Invalid 'temperature'"),
        (422, "", OutcomeKind.FATAL, "HTTP 422"),
    ],
)
def test_the_classification_table(
    status: int, body: str, kind: OutcomeKind, reason: str | None
) -> None:
    outcome = classify_error(status, {}, body)
    assert outcome.kind is kind
    assert outcome.status == status
    if reason is not None:
        assert outcome.reason == reason


@pytest.mark.parametrize("status", [401, 403])
def test_credentials_errors_are_rejections_that_never_quote_the_provider(status: int) -> None:
    body = error("invalid_api_key", "Incorrect API key provided: sk-abc...wxyz")
    outcome = classify_error(status, {}, body)
    assert outcome.kind is OutcomeKind.REJECTED
    assert outcome.credentials_rejected
    assert "sk-" not in (outcome.reason or "")


def test_a_429_carries_its_hint() -> None:
    outcome = classify_error(429, {"retry-after-ms": "250"}, "")
    assert (outcome.retry_after_s, outcome.kind) == (0.25, OutcomeKind.RATE_LIMITED)


def test_reasons_are_cut_and_redacted() -> None:
    secret = "sk-canary-123"
    outcome = classify_error(
        400, {}, error(None, f"bad input near {secret} " + "x" * 1000), secrets=[secret]
    )
    assert secret not in (outcome.reason or "")
    assert len(outcome.reason or "") <= 300


@pytest.mark.parametrize(
    "message",
    [
        "The decoder prompt (length 5000) is longer than the maximum model length of 4096",
        "the request exceeds the available context size, try increasing it",
        "exceed context limit: 197000 + 8192 > 200000",
        "`inputs` tokens + `max_new_tokens` must be <= 4096. Given: 4000 and 200",
        "This model's maximum context length is 4096 tokens. However, you requested 5000",
        "prompt is too long: 210000 tokens > 200000 maximum",
    ],
)
@pytest.mark.parametrize("wrapped", [True, False])
def test_context_length_as_providers_phrase_it(message: str, wrapped: bool) -> None:
    body = error(None, message) if wrapped else message
    assert classify_error(400, {}, body).kind is OutcomeKind.REJECTED
    assert classify_error(422, {}, body).kind is OutcomeKind.REJECTED


def test_a_413_and_a_400_model_not_found_are_rejections() -> None:
    assert classify_error(413, {}, "").kind is OutcomeKind.REJECTED
    assert classify_error(400, {}, error("model_not_found", "no")).kind is OutcomeKind.REJECTED


def test_a_repeated_retry_after_header_keeps_its_hint() -> None:
    assert retry_after_s({"Retry-After": "5, 5"}) == 5.0
