"""Decision core: what one attempt at one source came to, and the record a call keeps of it."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass
from typing import Any


class OutcomeKind(enum.Enum):
    """The classification of one attempt, which the loop acts on."""

    SUCCESS = "success"
    RATE_LIMITED = "rate_limited"
    TRANSIENT = "transient"
    REJECTED = "source_rejected"
    FATAL = "fatal"


@dataclass(frozen=True, slots=True)
class RateLimits:
    """What a provider announced about its rate limits with one answer.

    Read from OpenAI-style ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``
    and Anthropic-style ``anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}``
    headers. `*_reset_s` is the time until the limit is fully replenished (OpenAI
    sends a duration such as ``6m0s``, Anthropic an RFC 3339 instant), in seconds
    from the answer. Every field is None when its header is absent or unreadable.
    """

    requests_limit: int | None = None
    requests_remaining: int | None = None
    requests_reset_s: float | None = None
    tokens_limit: int | None = None
    tokens_remaining: int | None = None
    tokens_reset_s: float | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """A classified attempt, as a source adapter reports it.

    Adapters never raise for a provider's answer: a 429, a timeout or a malformed
    body is an `Outcome`, so the loop is the only place that decides what to do.
    `reason` is a short, secret-free description (never a key, never a prompt).
    `first_token_cut` marks a timeout of the first-token limit (`ttft_timeout_s`):
    a failover trigger the loop acts on at once, without a backoff.
    """

    kind: OutcomeKind
    value: Any = None
    status: int | None = None
    reason: str | None = None
    retry_after_s: float | None = None
    timed_out: bool = False
    credentials_rejected: bool = False
    model: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    limits: RateLimits | None = None  # the provider's rate-limit headers, if it sent any
    first_token_cut: bool = False

    @property
    def used_tokens(self) -> int | None:
        """Tokens the provider reports for this attempt, if it reports any."""
        if self.prompt_tokens is None and self.completion_tokens is None:
            return None
        return (self.prompt_tokens or 0) + (self.completion_tokens or 0)

    @classmethod
    def success(cls, value: Any, **fields: Any) -> Outcome:
        return cls(OutcomeKind.SUCCESS, value=value, **fields)

    @classmethod
    def rate_limited(cls, retry_after_s: float | None = None, **fields: Any) -> Outcome:
        fields.setdefault("status", 429)
        return cls(OutcomeKind.RATE_LIMITED, retry_after_s=retry_after_s, **fields)

    @classmethod
    def transient(cls, reason: str, **fields: Any) -> Outcome:
        return cls(OutcomeKind.TRANSIENT, reason=reason, **fields)

    @classmethod
    def timeout(cls, reason: str = "timeout", **fields: Any) -> Outcome:
        return cls(OutcomeKind.TRANSIENT, reason=reason, timed_out=True, **fields)

    @classmethod
    def rejected(cls, reason: str, **fields: Any) -> Outcome:
        return cls(OutcomeKind.REJECTED, reason=reason, **fields)

    @classmethod
    def fatal(cls, reason: str, **fields: Any) -> Outcome:
        return cls(OutcomeKind.FATAL, reason=reason, **fields)


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One line of a call's attempt trail: which source, what happened, how long.

    `started_s` is the offset from the start of the call. `burned_budget` says
    whether the attempt counted against `max_attempts` (an exempt 429 and a
    failure that shows the scope down do not). `productive` says whether its time
    was excluded from the stall budget: false when it was refunded to waiting (an
    exempt 429, an outage's failure other than a timeout). The record is plain
    data so it survives a JSON result backend.
    """

    source: str
    outcome: str
    seconds: float
    started_s: float
    status: int | None = None
    reason: str | None = None
    burned_budget: bool = True
    productive: bool = True

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_value(cls, value: AttemptRecord | dict[str, Any]) -> AttemptRecord:
        """Accept a record or its dict form (as rebuilt from a JSON result)."""
        if isinstance(value, AttemptRecord):
            return value
        return cls(**value)
