"""Testing: `ModelBehaviour`, how one simulated model answers — limits, faults and rejections.

A behaviour is plain data: the server reads it on every request, so one frozen
value describes a model for the whole run. `from_dict` reads the JSON form the
command line takes (lists for tuples, string keys for `error_rates`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

RetryAfterFormat = Literal["seconds", "http-date", "ms", "none"]
RejectKind = Literal[
    "context_length",
    "model_not_found",
    "auth",
    "forbidden",
    "content_policy",
    "bad_request",
    "unprocessable",
]
RateLimiter = Literal["window", "bucket"]
RateLimitHeaders = Literal["none", "openai", "anthropic"]
StreamFault = Literal["stall", "cut", "malformed", "no_done", "slow_first_token"]

# `slow_first_token` holds the first chunk at least this long.
SLOW_FIRST_TOKEN_S = 30.0


@dataclass(frozen=True, slots=True)
class ModelBehaviour:
    """How one model answers. Every field is optional; the default answers at once, always."""

    capacity: int | None = None
    rpm: int | None = None
    tpm: int | None = None
    # How rpm and tpm are counted: "window", at most that many in any 60 s; "bucket",
    # a token bucket of that size refilled continuously (as OpenAI and Anthropic do).
    rate_limiter: RateLimiter = "window"
    # Rate-limit headers on every answer, in OpenAI's (x-ratelimit-*) or Anthropic's
    # (anthropic-ratelimit-*) style, as real providers send them.
    ratelimit_headers: RateLimitHeaders = "none"
    latency_s: tuple[float, float] = (0.0, 0.0)
    first_token_s: float = 0.0
    error_rates: Mapping[int, float] = field(default_factory=dict)
    queueing_s: float | None = None
    outages: tuple[tuple[float, float], ...] = ()
    # Where the outage windows' seconds count from: "start" (the server started), or a
    # model's name: that model's first request (an outage that meets the traffic whenever
    # it comes, e.g. a model down from its 1st request for 20 s).
    outages_from: str = "start"
    retry_after: RetryAfterFormat = "seconds"
    retry_after_s: float | None = None
    reject: RejectKind | None = None
    stream_fault: StreamFault | None = None
    status_body_malformed: bool = False
    reply: str = "simulated answer"
    # A request whose text contains this answers 500 after its latency while every
    # other request is served: a failure of the request's own, not an outage.
    poison: str | None = None
    embedding_dim: int = 8
    api_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        low, high = self.latency_s
        if not 0 <= low <= high:
            raise ValueError(
                f"latency_s must be (low, high) with 0 <= low <= high, not {low, high}"
            )
        for name in ("capacity", "rpm", "tpm"):
            limit = getattr(self, name)
            if limit is not None and limit < 1:
                raise ValueError(f"{name} must be at least 1, not {limit}")
        if any(not 0 <= p <= 1 for p in self.error_rates.values()):
            raise ValueError("error_rates probabilities must lie in [0, 1]")
        if sum(self.error_rates.values()) > 1 + 1e-9:
            raise ValueError("error_rates probabilities must sum to at most 1")
        if any(not 400 <= status <= 599 for status in self.error_rates):
            raise ValueError("error_rates keys must be HTTP error statuses (400-599)")
        if any(start > end for start, end in self.outages):
            raise ValueError("each outage must be (start_s, end_s) with start_s <= end_s")
        if self.embedding_dim < 1:
            raise ValueError("embedding_dim must be at least 1")

    def first_token_delay_s(self) -> float:
        """The wait before the first streamed chunk, `slow_first_token` included."""
        if self.stream_fault == "slow_first_token":
            return max(self.first_token_s, SLOW_FIRST_TOKEN_S)
        return self.first_token_s

    def in_outage(self, since_origin_s: float | None) -> bool:
        """Whether `since_origin_s` (seconds since `outages_from`; None: it has not
        happened yet) falls in an outage."""
        if since_origin_s is None:
            return False
        return any(start <= since_origin_s < end for start, end in self.outages)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelBehaviour:
        """Read the JSON form: tuples as lists, `error_rates` keyed by status strings."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown ModelBehaviour fields: {', '.join(unknown)}")
        values = dict(data)
        if "latency_s" in values:
            low, high = values["latency_s"]
            values["latency_s"] = (float(low), float(high))
        if "outages" in values:
            values["outages"] = tuple((float(a), float(b)) for a, b in values["outages"])
        if "error_rates" in values:
            values["error_rates"] = {int(k): float(v) for k, v in values["error_rates"].items()}
        return cls(**values)
