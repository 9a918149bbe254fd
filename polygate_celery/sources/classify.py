"""Source layer: reading what a provider answered into an outcome (SPEC §5).

| the provider did                                     | outcome                          |
|------------------------------------------------------|----------------------------------|
| 2xx with a complete, well-formed body                | success (the adapter checks it)  |
| 429 (Retry-After seconds or HTTP date, retry-after-ms)| rate_limited with the hint       |
| 408, 409, 5xx, any other non-4xx status               | transient                        |
| 401, 403                                              | source_rejected, credentials     |
| 404, or a context length this model cannot take       | source_rejected                  |
| content policy, bad request, any other 4xx            | fatal, with the provider's reason|

A 401, 403 or 429 is classified by its status alone (`STATUS_ONLY`): a 429 is
rate limited whatever its headers and body, an unreadable hint being no hint.
Reasons never quote a credentials error (providers echo part of the key there),
are cut to a few hundred characters, and have every secret the adapter knows
blanked out. `rate_limits` reads what a provider's rate-limit headers announce,
which the adapters attach to every outcome built from an answer.
"""

from __future__ import annotations

import datetime
import email.utils
import json
import math
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

from polygate_celery.core.outcome import Outcome, RateLimits

MAX_REASON = 300
# Answers classified by their status alone, so their body is never read: a 429 is
# rate limited whatever its body, and a credentials error's body is never quoted.
STATUS_ONLY = frozenset({401, 403, 429})
# How providers say "this model cannot take a prompt this long" (OpenAI, vLLM, TGI,
# llama.cpp, Anthropic-compatible proxies): another source of the scope might.
_CONTEXT = re.compile(
    r"context[ _-]?(length|window|size|limit)|maximum context|max(imum)?[ _-]?model[ _-]?length"
    r"|too many tokens|prompt is too long|input is too long|exceeds? (the )?(available )?context"
    r"|must be <= ?\d+|max_new_tokens|exceed_context",
    re.IGNORECASE,
)
_NOT_HERE_CODES = {"model_not_found", "context_length_exceeded", "exceed_context_size_error"}
_CONTENT_POLICY_CODES = {"content_policy_violation", "content_filter", "content_policy"}


def retry_after_s(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """The provider's hint in seconds: ``retry-after-ms``, else ``Retry-After`` as
    seconds or as an HTTP date. None when absent or unreadable."""
    lowered = {k.lower(): v for k, v in headers.items()}
    if "retry-after-ms" in lowered:
        try:
            ms = float(lowered["retry-after-ms"].split(",")[0])
        except ValueError:
            ms = math.nan
        if math.isfinite(ms) and ms >= 0:
            return ms / 1000
    value = lowered.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value.split(",")[0])  # a repeated header arrives joined: "5, 5"
        return seconds if math.isfinite(seconds) and seconds >= 0 else None
    except ValueError:
        pass
    return _seconds_until(_http_date(value), now)


def _http_date(value: str) -> datetime.datetime | None:
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=datetime.UTC)


def _seconds_until(when: datetime.datetime | None, now: float | None) -> float | None:
    """Seconds from `now` to `when`, 0 if it has passed; None for an instant no clock can hold."""
    if when is None:
        return None
    try:
        seconds = when.timestamp() - (time.time() if now is None else now)
    except (OverflowError, ValueError, OSError):
        return None
    return max(0.0, seconds) if math.isfinite(seconds) else None


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(h|ms|m|s|us|µs|μs|ns)")
_UNIT_S = {
    "h": 3600.0,
    "m": 60.0,
    "s": 1.0,
    "ms": 1e-3,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ns": 1e-9,
}
_LIMIT_HEADERS = frozenset(
    name
    for kind in ("requests", "tokens")
    for part in ("limit", "remaining", "reset")
    for name in (f"x-ratelimit-{part}-{kind}", f"anthropic-ratelimit-{kind}-{part}")
)


def rate_limits(headers: Mapping[str, str], now: float | None = None) -> RateLimits | None:
    """What the provider's rate-limit headers announce; None when it sent none of them.

    Reads OpenAI's ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` and
    Anthropic's ``anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}``
    (OpenAI's wins where both are sent and readable). Anthropic's
    ``input-tokens`` and ``output-tokens`` families are not read: its ``tokens``
    family already states the most restrictive of them. A reset is a duration
    (``6m0s``, ``20ms``, ``1h2m3.5s``, plain seconds) or an RFC 3339 instant,
    turned into seconds from `now` (0 once passed). A value that cannot be read
    (or a count past 64 bits) is None, never an error.
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    if lowered.keys().isdisjoint(_LIMIT_HEADERS):
        return None

    def values(kind: str, part: str) -> list[str]:
        names = (f"x-ratelimit-{part}-{kind}", f"anthropic-ratelimit-{kind}-{part}")
        return [_first(lowered[name]) for name in names if name in lowered]

    def count(kind: str, part: str) -> int | None:
        return next((c for c in map(_count, values(kind, part)) if c is not None), None)

    def reset(kind: str) -> float | None:
        found = (_reset_s(value, now) for value in values(kind, "reset"))
        return next((seconds for seconds in found if seconds is not None), None)

    return RateLimits(
        requests_limit=count("requests", "limit"),
        requests_remaining=count("requests", "remaining"),
        requests_reset_s=reset("requests"),
        tokens_limit=count("tokens", "limit"),
        tokens_remaining=count("tokens", "remaining"),
        tokens_reset_s=reset("tokens"),
    )


def _first(value: str) -> str:
    return value.partition(",")[0].strip()  # a repeated header arrives joined: "5, 5"


def _count(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 19 else None


def _reset_s(text: str, now: float | None) -> float | None:
    try:
        seconds: float | None = float(text)
    except ValueError:
        seconds = _duration_s(text)
    if seconds is None:
        return _seconds_until(_rfc3339(text), now)
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _duration_s(text: str) -> float | None:
    """A Go-style duration such as ``1h2m3.5s`` or ``20ms``, in seconds."""
    parts = _DURATION.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        return None
    return sum(float(number) * _UNIT_S[unit] for number, unit in parts)


def _rfc3339(text: str) -> datetime.datetime | None:
    try:
        when = datetime.datetime.fromisoformat(text)
    except (ValueError, OverflowError):
        return None
    return when if when.tzinfo is not None else None  # an instant needs its offset


def redact(text: str, secrets: Iterable[str]) -> str:
    """Blank out each secret, and the head and tail a provider may echo of it."""
    for secret in secrets:
        if not secret:
            continue
        text = text.replace(secret, "***")
        if len(secret) >= 12:
            text = text.replace(secret[:6], "***").replace(secret[-4:], "***")
    return text


def provider_error(body: str) -> tuple[str | None, str | None, str | None]:
    """(code, type, message) of an OpenAI-style error body, as far as it is one."""
    try:
        data: Any = json.loads(body)
    except (ValueError, TypeError, RecursionError):
        return None, None, None
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, str):
        return None, None, error
    if not isinstance(error, dict):
        message = data.get("message") if isinstance(data, dict) else None
        return None, None, message if isinstance(message, str) else None
    code, kind, message = error.get("code"), error.get("type"), error.get("message")
    return (
        str(code) if code is not None else None,
        str(kind) if kind is not None else None,
        str(message) if message is not None else None,
    )


def short(text: str, secrets: Iterable[str] = ()) -> str:
    text = redact(" ".join(text.split()), secrets)
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 1] + "…"


def classify_error(
    status: int,
    headers: Mapping[str, str],
    body: str,
    *,
    secrets: Iterable[str] = (),
    now: float | None = None,
) -> Outcome:
    """The outcome of a non-2xx answer."""
    secrets = tuple(secrets)
    if status == 429:
        return Outcome.rate_limited(retry_after_s(headers, now), status=429, reason="rate limited")
    if status in (401, 403):
        return Outcome.rejected(
            f"credentials rejected (HTTP {status})", status=status, credentials_rejected=True
        )
    code, kind, message = provider_error(body)
    said = short(message, secrets) if message else None
    if status in (408, 409) or status >= 500 or status < 400:
        return Outcome.transient(said or f"HTTP {status}", status=status)
    if code in _CONTENT_POLICY_CODES or kind in _CONTENT_POLICY_CODES:
        return Outcome.fatal(said or "content policy", status=status)
    if status == 404 or code in _NOT_HERE_CODES:
        return Outcome.rejected(said or "model not found here", status=status)
    if status == 413 or _CONTEXT.search(message or body[:2000]):
        return Outcome.rejected(said or "the request is too long for this model", status=status)
    return Outcome.fatal(said or f"HTTP {status}", status=status)
