"""Source layer: reading what a provider answered into an outcome (SPEC §5).

| the provider did                                     | outcome                          |
|------------------------------------------------------|----------------------------------|
| 2xx with a complete, well-formed body                | success (the adapter checks it)  |
| 429 (Retry-After seconds or HTTP date, retry-after-ms)| rate_limited with the hint       |
| 408, 409, 5xx, any other non-4xx status               | transient                        |
| 401, 403                                              | source_rejected, credentials     |
| 404, or a context length this model cannot take       | source_rejected                  |
| content policy, bad request, any other 4xx            | fatal, with the provider's reason|

Reasons never quote a credentials error (providers echo part of the key there),
are cut to a few hundred characters, and have every secret the adapter knows
blanked out.
"""

from __future__ import annotations

import email.utils
import json
import math
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

from polygate_celery.core.outcome import Outcome

MAX_REASON = 300
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
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


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
