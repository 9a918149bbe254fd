"""Configuration: the models of sources, quotas, scopes and the gateway (pydantic v2).

Every timing field is in seconds. The two budgets of a call are orthogonal:
`max_attempts` counts attempts that burn the retry budget (a request that runs
its whole `timeout_s` is one of them), `stall_window_s` counts every other
second of the call (waiting for a runnable source, backoff sleeps, 429s exempt
from the retry budget). Neither bounds the other, so no rule ties `timeout_s`
to `stall_window_s`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Literal, Self

from pydantic import (
    Field,
    PrivateAttr,
    SecretStr,
    field_validator,
    model_validator,
)

from polygate_celery.config.fields import (
    DAY,
    HOUR,
    MAX_BODY_BYTES,
    MAX_CONCURRENCY,
    MAX_RPM,
    MAX_TPM,
    MIN_BODY_BYTES,
    MONTH,
    RPM_WINDOW_HELP,
    WEEK,
    Name,
    Seconds,
    _check_window,
    _Strict,
)

# Defined beside its URL parsing; long imported from here by the store and the tests.
from polygate_celery.config.store import StoreConfig as StoreConfig  # noqa: PLC0414
from polygate_celery.config.urls import check_http_url
from polygate_celery.core.policy import Kind
from polygate_celery.core.terms import RpmWindow


class BreakerConfig(_Strict):
    failure_threshold: int = Field(
        5, ge=1, le=1000, description="consecutive transient failures that open it"
    )
    cooldown_s: Seconds = Field(
        10.0,
        ge=0.01,
        le=DAY,
        description="open time before one half-open probe (a recovered source gets traffic "
        "back within about this long; failing probes stay one per cooldown, fleet-wide)",
    )
    auth_cooldown_s: Seconds = Field(
        600.0,
        ge=0.01,
        le=WEEK,
        description="open time after the source rejected its credentials (401/403)",
    )


class AimdConfig(_Strict):
    increase: float = Field(
        1.0, ge=0.01, le=1000, allow_inf_nan=False, description="added on each success"
    )
    decrease_factor: float = Field(0.5, gt=0, lt=1, description="multiplied on a 429 or timeout")
    initial_limit: int | None = Field(
        None, ge=1, le=MAX_CONCURRENCY, description="starting limit (default: the cap)"
    )


class SourceSettings(_Strict):
    """Source settings that `source_defaults` may set for every source."""

    timeout_s: Seconds = Field(
        60.0,
        ge=0.01,
        le=DAY,
        description="total deadline of one attempt (streaming: the whole stream)",
    )
    ttft_timeout_s: Seconds | None = Field(
        None,
        ge=0.01,
        le=HOUR,
        description="streaming chat: limit until the first token of any kind, text, "
        "reasoning, refusal or tool call (unset: 15 s; a model that reasons silently "
        "before its first token needs its thinking time here, or timeout_s for no "
        "separate limit)",
    )
    stream_idle_timeout_s: Seconds = Field(
        30.0, ge=0.01, le=HOUR, description="longest gap between chunks"
    )
    max_body_bytes: int | None = Field(
        None,
        ge=MIN_BODY_BYTES,
        le=MAX_BODY_BYTES,
        description="the most of one answer read, in bytes after content decoding; a larger "
        "answer fails the attempt (unset: the adapter's 64 MiB)",
    )
    max_concurrency: int = Field(
        8, ge=1, le=MAX_CONCURRENCY, description="fleet-wide cap on requests in flight"
    )
    breaker: BreakerConfig = BreakerConfig()
    aimd: AimdConfig = AimdConfig()


_reading_keys: ContextVar[bool] = ContextVar("_reading_keys", default=True)


@contextmanager
def without_api_keys() -> Iterator[None]:
    """Load configurations without reading the sources' API keys: ``api_key_env`` and
    ``api_key_file`` may name a variable that is unset or a file that is absent here, and
    every `SourceConfig.key` is None. For tools that only read or write governance state
    (an operator's command, a metrics exporter), run where the keys are not."""
    token = _reading_keys.set(False)
    try:
        yield
    finally:
        _reading_keys.reset(token)


class SourceConfig(SourceSettings):
    """One model endpoint. The API key comes from exactly one of three places."""

    base_url: str | None = Field(
        None, description="OpenAI-compatible base URL (http:// or https://)"
    )
    model: str | None = Field(None, description="model name sent to the endpoint")
    adapter: Literal["http", "openai-sdk"] = Field(
        "http", description="http (built in) or openai-sdk (the openai package's client)"
    )
    stream: bool | None = Field(
        None, description="stream chat answers (unset: stream when ttft_timeout_s is set)"
    )
    stream_usage: bool = Field(True, description="ask a stream for its token usage")
    ocr_endpoint: str | None = Field(
        None, description="path of a JSON OCR endpoint, e.g. /ocr (unset: OCR by vision chat)"
    )
    ocr_prompt: str | None = Field(None, description="instruction sent with an image for OCR")
    api_key: SecretStr | None = Field(None, description="the key itself (prefer the two below)")
    api_key_env: str | None = Field(None, description="name of the environment variable holding it")
    api_key_file: Path | None = Field(
        None, strict=False, description="file holding it (e.g. a mounted secret)"
    )
    rpm: int | None = Field(
        None, ge=1, le=MAX_RPM, description="requests per minute (a private quota)"
    )
    tpm: int | None = Field(
        None, ge=1, le=MAX_TPM, description="tokens per minute (a private quota)"
    )
    rpm_window: RpmWindow | None = Field(None, description=RPM_WINDOW_HELP)
    quota: Name | None = Field(None, description="name of a shared quota in [quotas]")
    _key: SecretStr | None = PrivateAttr(None)

    @property
    def key(self) -> SecretStr | None:
        """The API key, from whichever of the three places holds it (read at load time)."""
        return self._key

    @field_validator("base_url")
    @classmethod
    def _an_http_url(cls, url: str | None) -> str | None:
        if url is not None:
            check_http_url(url)
        return url

    @field_validator("api_key_env")
    @classmethod
    def _env_is_set(cls, name: str | None) -> str | None:
        if name is not None and _reading_keys.get() and not os.environ.get(name):
            raise ValueError(f"environment variable {name!r} is not set")
        return name

    @field_validator("api_key_file")
    @classmethod
    def _file_is_readable(cls, path: Path | None) -> Path | None:
        if path is None or not _reading_keys.get():
            return path
        try:
            text = path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ValueError(f"cannot read the key file: {exc.strerror}") from None
        if not text:
            raise ValueError("the key file is empty")
        return path

    @model_validator(mode="after")
    def _resolve_key(self) -> Self:
        given = [f for f in ("api_key", "api_key_env", "api_key_file") if getattr(self, f)]
        if len(given) > 1:
            raise ValueError(f"set only one of api_key, api_key_env, api_key_file (got {given})")
        if not _reading_keys.get():
            raw: str | None = None
        elif self.api_key_env:
            raw = os.environ[self.api_key_env]
        elif self.api_key_file:
            raw = self.api_key_file.read_text(encoding="utf-8")
        else:
            raw = self.api_key.get_secret_value() if self.api_key else None
        if raw is not None:
            raw = raw.strip().lstrip("\ufeff").strip()  # a file saved with a BOM, a newline
            if not raw or not raw.isascii() or not raw.isprintable():
                # Never echo it: say only what is wrong.
                raise ValueError("the API key is empty or holds characters a header cannot carry")
        self._key = SecretStr(raw) if raw is not None else None
        if self.quota is not None and (self.rpm is not None or self.tpm is not None):
            raise ValueError("set either rpm/tpm (a private quota) or quota (a shared one)")
        _check_window(self.rpm_window, self.rpm, "set rpm (or the window in [quotas])")
        return self


class QuotaConfig(_Strict):
    """A quota several sources share, e.g. one provider key used by two models."""

    rpm: int | None = Field(None, ge=1, le=MAX_RPM, description="requests per minute")
    tpm: int | None = Field(None, ge=1, le=MAX_TPM, description="tokens per minute")
    rpm_window: RpmWindow | None = Field(None, description=RPM_WINDOW_HELP)

    @model_validator(mode="after")
    def _window_needs_rpm(self) -> Self:
        _check_window(self.rpm_window, self.rpm, "set rpm")
        return self


class ScopeSettings(_Strict):
    """Scope settings that `scope_defaults` may set for every scope."""

    max_attempts: int = Field(
        3, ge=1, le=100, description="attempts that burn the retry budget, per call"
    )
    stall_window_s: Seconds = Field(
        300.0,
        ge=0.01,
        le=DAY,
        description="non-productive waiting per call before a stalled verdict "
        "(a governed Celery task's scope: 60 unless set)",
    )
    max_call_s: Seconds | None = Field(
        None,
        ge=0.01,
        le=WEEK,
        description="hard deadline of a call "
        "(default: max_attempts * max source timeout_s + 2 * stall_window_s)",
    )
    backoff_base_s: Seconds = Field(
        2.0, ge=0.01, le=HOUR, description="first backoff after a failure"
    )
    backoff_max_s: Seconds = Field(
        60.0, ge=0.01, le=DAY, description="cap of the exponential backoff"
    )
    poll_interval_s: Seconds = Field(
        1.0,
        ge=0.01,
        le=60,
        description="wait between looks for a runnable source (jittered x0.5-1.0)",
    )
    retry_after_cap_s: Seconds = Field(
        3600.0, ge=0.01, le=WEEK, description="upper clamp of retry_after_s on a verdict"
    )
    rate_limit_exempt: bool | None = Field(
        None, description="a 429 does not burn the retry budget (default: chat yes, others no)"
    )
    same_source_retries: int = Field(
        1,
        ge=0,
        le=100,
        description="retries of a source right after its 5xx or connection error, before "
        "another source is tried (a timeout, a malformed answer or a rejection moves at once)",
    )
    wait_out_retry_after_s: Seconds = Field(
        5.0,
        ge=0,
        le=HOUR,
        description="a Retry-After up to this long on the scope's first source is waited out "
        "on it; a longer one fails over to the next source",
    )
    outage_is_waiting: bool | None = Field(
        None,
        description="a transient failure while no call of the scope succeeds is charged to "
        "waiting, not to the retry budget, so an outage defers tasks (false: every transient "
        "failure burns the retry budget; unset: true in governed Celery tasks, which park; for "
        "a direct Gateway call, which cannot, only while the failing source's breaker is open)",
    )


class ScopeConfig(ScopeSettings):
    """A named pool of interchangeable sources of one kind, in priority order."""

    kind: Kind = Field(description="chat, embedding or ocr")
    sources: list[Name] = Field(min_length=1, description="source names, best first")

    @field_validator("sources")
    @classmethod
    def _distinct(cls, names: list[str]) -> list[str]:
        if len(set(names)) != len(names):
            raise ValueError("a source is listed twice")
        return names


class DeferralConfig(_Strict):
    """How a Celery task whose scope is unavailable is deferred, and for how long at most."""

    strategy: Literal["park", "countdown"] = Field(
        "park",
        description="park: a Redis parking lot, released when due (default); "
        "countdown: a Celery countdown (held by a worker until due)",
    )
    growth: float = Field(
        2.0,
        ge=1,
        le=10,
        allow_inf_nan=False,
        description="delay factor per earlier deferral that waited out an estimate "
        "(a rate-limit reset is neither grown nor counted)",
    )
    min_delay_s: Seconds = Field(1.0, ge=0.01, le=DAY, description="shortest deferral")
    max_delay_s: Seconds = Field(3600.0, ge=0.01, le=WEEK, description="longest deferral")
    jitter: float = Field(
        0.25,
        ge=0,
        le=1,
        description="delays are stretched by up to this fraction, at random "
        "(a rate-limit reset by 1 s at most)",
    )
    max_deferrals: int = Field(25, ge=0, le=10_000, description="deferrals before FAILURE")
    max_defer_age_s: Seconds = Field(
        86_400.0, ge=1, le=MONTH, description="time since the first deferral before FAILURE"
    )
    release_interval_s: Seconds = Field(
        0.2, ge=0.01, le=60, description="how often a worker releases parked tasks that are due"
    )
    release_batch: int = Field(200, ge=1, le=10_000, description="parked tasks released per round")
    claim_lease_s: Seconds = Field(
        30.0,
        ge=0.1,
        le=HOUR,
        description="a release in progress; another worker takes over after this",
    )
    reuse_ttl_s: Seconds = Field(
        86_400.0,
        ge=1,
        le=MONTH,
        description="how long paid results are kept for a deferred task's next run",
    )
    redelivery_cap: int = Field(
        10,
        ge=1,
        le=1000,
        description="redeliveries of one message (a worker lost each time) before FAILURE",
    )
    release_check_s: Seconds = Field(
        300.0,
        ge=0.1,
        le=DAY,
        description="a released task whose run has not begun after this long is released "
        "again (its message was lost in delivery), each later time after twice as long as the "
        "time before (at most 32 x); a copy is dropped by its run's guard",
    )
    heartbeat_s: Seconds = Field(
        2.0,
        ge=0.1,
        le=60,
        description="how often a worker marks its governed runs alive; a run whose marker "
        "misses five beats counts as dead, and a copy of its message may run",
    )
