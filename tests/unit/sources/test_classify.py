"""The classification table (SPEC §5), Retry-After and rate-limit headers, without a network."""

from __future__ import annotations

import email.utils
import json

import pytest

from polygate_celery.core.outcome import OutcomeKind, RateLimits
from polygate_celery.sources.classify import classify_error, rate_limits, retry_after_s


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


# -- out-of-range Retry-After: a 429 is always a 429 -------------------------------------

OUT_OF_RANGE_DATES = [
    "Fri, 31 Dec 99999 23:59:59 GMT",  # a year no datetime holds
    "Fri, 31 Dec 99999999999999999999 23:59:59 GMT",  # a year no C long holds
    "Fri, 31 Dec 2020 99999999999999999999:59:59 GMT",
    "Fri, 31 Dec 2020 23:59:59 +99999999999999999999",  # an offset no C int holds
    "Fri, 31 Dec 9999 23:59:59 -9999",
    "Mon, 01 Jan 0001 00:00:00 +9999",
]


@pytest.mark.parametrize("value", OUT_OF_RANGE_DATES)
def test_an_out_of_range_retry_after_date_is_no_hint(value: str) -> None:
    assert retry_after_s({"Retry-After": value}, now=1_000_000) is None
    assert retry_after_s({"Retry-After": value}) is None


@pytest.mark.parametrize("value", [*OUT_OF_RANGE_DATES, "soon", "-1", "inf", "1e999", ""])
@pytest.mark.parametrize("body", ["", "<html>", error("rate_limit_exceeded", "slow down"), "\x00"])
def test_any_429_is_rate_limited_whatever_its_headers_and_body(value: str, body: str) -> None:
    outcome = classify_error(429, {"Retry-After": value, "retry-after-ms": value}, body)
    assert (outcome.kind, outcome.status, outcome.retry_after_s) == (
        OutcomeKind.RATE_LIMITED,
        429,
        None,
    )


def test_a_date_without_a_zone_is_read_as_utc() -> None:
    assert retry_after_s({"Retry-After": "Mon, 12 Jan 1970 13:46:40 -0000"}, now=1_000_000) == 0.0
    hint = retry_after_s({"Retry-After": "Mon, 12 Jan 1970 13:47:10 -0000"}, now=1_000_000)
    assert hint == 30.0


# -- rate-limit headers --------------------------------------------------------------------


def test_openai_rate_limit_headers() -> None:
    limits = rate_limits(
        {
            "x-ratelimit-limit-requests": "60",
            "x-ratelimit-remaining-requests": "59",
            "x-ratelimit-reset-requests": "1s",
            "X-RateLimit-Limit-Tokens": "150000",
            "x-ratelimit-remaining-tokens": "149984",
            "x-ratelimit-reset-tokens": "6m0s",
        }
    )
    assert limits == RateLimits(60, 59, 1.0, 150000, 149984, 360.0)


def test_anthropic_rate_limit_headers_reset_at_an_instant() -> None:
    now = 1_704_067_200.0  # 2024-01-01T00:00:00Z
    limits = rate_limits(
        {
            "anthropic-ratelimit-requests-limit": "50",
            "anthropic-ratelimit-requests-remaining": "49",
            "anthropic-ratelimit-requests-reset": "2024-01-01T00:00:30Z",
            "anthropic-ratelimit-tokens-limit": "40000",
            "anthropic-ratelimit-tokens-remaining": "39000",
            "anthropic-ratelimit-tokens-reset": "2024-01-01T01:00:00.5+01:00",  # = 00:00:00.5Z
            "anthropic-ratelimit-input-tokens-remaining": "1",  # not read
        },
        now=now,
    )
    assert limits == RateLimits(50, 49, 30.0, 40000, 39000, 0.5)


def test_an_instant_already_passed_resets_in_zero_seconds() -> None:
    limits = rate_limits({"anthropic-ratelimit-tokens-reset": "2020-01-01T00:00:00Z"}, now=2e9)
    assert limits == RateLimits(tokens_reset_s=0.0)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("1s", 1.0),
        ("6m0s", 360.0),
        ("20ms", 0.02),
        ("1h2m3.5s", 3723.5),
        ("2.5", 2.5),
        ("0", 0.0),
        ("1m", 60.0),
        ("500us", 0.0005),
        ("7, 7", 7.0),  # a repeated header arrives joined
        ("soon", None),
        ("-1s", None),
        ("-3", None),
        ("1x", None),
        ("s", None),
        ("1s2", None),
        ("nan", None),
        ("inf", None),
        ("2024-01-01T00:00:30", None),  # an instant without its offset
        ("9" * 400 + "h", None),
    ],
)
def test_reset_durations(value: str, seconds: float | None) -> None:
    limits = rate_limits({"x-ratelimit-reset-requests": value}, now=1_704_067_200.0)
    assert limits is not None
    assert limits.requests_reset_s == (pytest.approx(seconds) if seconds is not None else None)


@pytest.mark.parametrize("value", ["", "many", "-1", "1.5", "²", "9" * 20, "0x10"])
def test_an_unreadable_count_is_none(value: str) -> None:
    limits = rate_limits({"x-ratelimit-remaining-tokens": value, "x-ratelimit-limit-tokens": "10"})
    assert limits == RateLimits(tokens_limit=10)


def test_no_rate_limit_header_is_no_limits() -> None:
    assert rate_limits({}) is None
    assert rate_limits({"retry-after": "3", "anthropic-ratelimit-input-tokens-limit": "5"}) is None


def test_openai_headers_win_over_anthropic_ones_where_readable() -> None:
    limits = rate_limits(
        {
            "x-ratelimit-limit-requests": "60",
            "anthropic-ratelimit-requests-limit": "50",
            "x-ratelimit-remaining-requests": "lots",
            "anthropic-ratelimit-requests-remaining": "7",
        }
    )
    assert limits == RateLimits(requests_limit=60, requests_remaining=7)
