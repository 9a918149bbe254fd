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
from pathlib import Path
from typing import Annotated, Any, Literal, Self
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)
from redis.connection import parse_url

from polygate_celery.core.policy import Kind
from polygate_celery.core.terms import RpmWindow

Name = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")]
"""Source, scope and quota names: lowercase (environment keys are case-folded), key-safe."""

PositiveSeconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeSeconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]


def _check_window(window: RpmWindow, rpm: int | None, remedy: str) -> None:
    """A window other than the default must have an rpm of its own to count."""
    if window != "bucket" and rpm is None:
        raise ValueError(f"rpm_window applies to rpm: {remedy}")


RPM_WINDOW_HELP = (
    "how rpm is counted: bucket (a minute's worth at once, then evenly, as providers that "
    "refill continuously count) or sliding (at most rpm in any minute: for a provider "
    "that counts in fixed windows)"
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class BreakerConfig(_Strict):
    failure_threshold: int = Field(
        5, ge=1, description="consecutive transient failures that open it"
    )
    cooldown_s: PositiveSeconds = Field(
        10.0,
        description="open time before one half-open probe (a recovered source gets traffic "
        "back within about this long; failing probes stay one per cooldown, fleet-wide)",
    )
    auth_cooldown_s: PositiveSeconds = Field(
        600.0, description="open time after the source rejected its credentials (401/403)"
    )


class AimdConfig(_Strict):
    increase: float = Field(1.0, gt=0, allow_inf_nan=False, description="added on each success")
    decrease_factor: float = Field(0.5, gt=0, lt=1, description="multiplied on a 429 or timeout")
    initial_limit: int | None = Field(None, ge=1, description="starting limit (default: the cap)")


class SourceSettings(_Strict):
    """Source settings that `source_defaults` may set for every source."""

    timeout_s: PositiveSeconds = Field(
        60.0, description="total deadline of one attempt (streaming: the whole stream)"
    )
    ttft_timeout_s: PositiveSeconds | None = Field(
        None,
        description="streaming chat: limit until the first token of any kind, text, "
        "reasoning, refusal or tool call (unset: 15 s; a model that reasons silently "
        "before its first token needs its thinking time here, or timeout_s for no "
        "separate limit)",
    )
    stream_idle_timeout_s: PositiveSeconds = Field(30.0, description="longest gap between chunks")
    max_concurrency: int = Field(8, ge=1, description="fleet-wide cap on requests in flight")
    breaker: BreakerConfig = BreakerConfig()
    aimd: AimdConfig = AimdConfig()


class SourceConfig(SourceSettings):
    """One model endpoint. The API key comes from exactly one of three places."""

    base_url: str | None = Field(None, description="OpenAI-compatible base URL")
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
    api_key_file: Path | None = Field(None, description="file holding it (e.g. a mounted secret)")
    rpm: int | None = Field(None, ge=1, description="requests per minute (a private quota)")
    tpm: int | None = Field(None, ge=1, description="tokens per minute (a private quota)")
    rpm_window: RpmWindow = Field("bucket", description=RPM_WINDOW_HELP)
    quota: Name | None = Field(None, description="name of a shared quota in [quotas]")
    _key: SecretStr | None = PrivateAttr(None)

    @property
    def key(self) -> SecretStr | None:
        """The API key, from whichever of the three places holds it (read at load time)."""
        return self._key

    @field_validator("api_key_env")
    @classmethod
    def _env_is_set(cls, name: str | None) -> str | None:
        if name is not None and not os.environ.get(name):
            raise ValueError(f"environment variable {name!r} is not set")
        return name

    @field_validator("api_key_file")
    @classmethod
    def _file_is_readable(cls, path: Path | None) -> Path | None:
        if path is None:
            return None
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
        if self.api_key_env:
            raw: str | None = os.environ[self.api_key_env]
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

    rpm: int | None = Field(None, ge=1, description="requests per minute")
    tpm: int | None = Field(None, ge=1, description="tokens per minute")
    rpm_window: RpmWindow = Field("bucket", description=RPM_WINDOW_HELP)

    @model_validator(mode="after")
    def _window_needs_rpm(self) -> Self:
        _check_window(self.rpm_window, self.rpm, "set rpm")
        return self


class ScopeSettings(_Strict):
    """Scope settings that `scope_defaults` may set for every scope."""

    max_attempts: int = Field(3, ge=1, description="attempts that burn the retry budget, per call")
    stall_window_s: PositiveSeconds = Field(
        300.0, description="non-productive waiting per call before a stalled verdict"
    )
    max_call_s: PositiveSeconds | None = Field(
        None,
        description="hard deadline of a call "
        "(default: max_attempts * max source timeout_s + 2 * stall_window_s)",
    )
    backoff_base_s: PositiveSeconds = Field(2.0, description="first backoff after a failure")
    backoff_max_s: PositiveSeconds = Field(60.0, description="cap of the exponential backoff")
    poll_interval_s: PositiveSeconds = Field(
        1.0, description="wait between looks for a runnable source (jittered x0.5-1.0)"
    )
    retry_after_cap_s: PositiveSeconds = Field(
        3600.0, description="upper clamp of retry_after_s on a verdict"
    )
    rate_limit_exempt: bool | None = Field(
        None, description="a 429 does not burn the retry budget (default: chat yes, others no)"
    )
    same_source_retries: int = Field(
        1,
        ge=0,
        description="retries of a source right after its 5xx or connection error, before "
        "another source is tried (a timeout, a malformed answer or a rejection moves at once)",
    )
    wait_out_retry_after_s: NonNegativeSeconds = Field(
        5.0,
        description="a Retry-After up to this long on the scope's first source is waited out "
        "on it; a longer one fails over to the next source",
    )
    outage_is_waiting: bool = Field(
        True,
        description="a transient failure while no call of the scope succeeds is charged to "
        "waiting, not to the retry budget, so an outage defers tasks (false: every transient "
        "failure burns the retry budget)",
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


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """`override` on top of `base`, merging nested tables instead of replacing them."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


REDIS_SCHEMES = ("redis", "rediss", "unix")
_OTHER_FORMS = {
    "sentinel": "for Redis Sentinel set store.sentinels and store.service_name instead",
    "redis+sentinel": "for Redis Sentinel set store.sentinels and store.service_name instead",
    "redis+cluster": "for Redis Cluster set store.cluster_nodes instead",
    "rediss+cluster": "for Redis Cluster set store.cluster_nodes instead",
}


def check_redis_url(url: str) -> None:
    """Raise ValueError (never quoting the URL: it may hold a password) unless `url` is
    one redis-py can open: ``redis://``, ``rediss://`` (TLS) or ``unix://`` (a socket)."""
    example = "write redis://[:PASSWORD@]HOST:PORT/DB"
    scheme, sep, _ = url.partition("://")
    if not sep:
        raise ValueError(f"the URL has no scheme; {example}")
    if scheme.lower() in _OTHER_FORMS:
        raise ValueError(
            f"scheme {scheme!r} is not a URL the store opens; {_OTHER_FORMS[scheme.lower()]}"
        )
    if scheme.lower() not in REDIS_SCHEMES:
        raise ValueError(
            f"scheme {scheme!r} is not one the store can use (redis://, rediss://, unix://); "
            + example
        )
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parsing it is the check
    except ValueError:
        raise ValueError(
            "the URL does not parse (a password holding '#', '/', '?' or '@' must be "
            f"percent-encoded, e.g. '#' as %23); {example}"
        ) from None
    if scheme.lower() == "unix":
        if not parts.path:
            raise ValueError("a unix:// URL needs the socket's path: unix:///path/to/redis.sock")
    elif not parts.hostname:
        raise ValueError(f"the URL has no host; {example}")
    elif parts.path not in ("", "/") and not parts.path.lstrip("/").isdigit():
        raise ValueError(f"the database must be a number (the URL's path); {example}")
    try:
        parse_url(url)  # type: ignore[no-untyped-call]  # redis-py reads the query, too
    except ValueError as exc:
        raise ValueError(f"{exc} ({example})") from None


def parse_address(text: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for an IPv6 address) as (host, port); ValueError else."""
    host, sep, port = text.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not host:port (e.g. redis-1.internal:26379)")
    return host, int(port)


def _addresses(value: Any) -> Any:
    """A list of addresses, or one string of them separated by commas (an environment
    variable)."""
    if isinstance(value, str):
        return [part for part in (p.strip() for p in value.split(",")) if part]
    return value


Addresses = Annotated[list[str], Field(min_length=1)]


class StoreConfig(_Strict):
    """Where governance state lives: Redis for a fleet, memory for one process.

    One of three forms, or none (memory): `redis_url` (one server), `sentinels` with
    `service_name` (the master Redis Sentinel names), or `cluster_nodes` (Redis
    Cluster). `username`, `password` and `db` are the Redis server's for the last
    two forms (a URL carries its own).
    """

    redis_url: SecretStr | None = Field(
        None, description="Redis URL of the governance store (unset: in-memory, one process)"
    )
    sentinels: Addresses | None = Field(
        None, description="Redis Sentinel addresses, host:port each (with service_name)"
    )
    service_name: str | None = Field(
        None, min_length=1, description="the master's name in Sentinel (with sentinels)"
    )
    cluster_nodes: Addresses | None = Field(
        None, description="Redis Cluster nodes to start from, host:port each (any of them)"
    )
    username: str | None = Field(
        None, min_length=1, description="Redis ACL user (sentinels or cluster_nodes)"
    )
    password: SecretStr | None = Field(
        None, description="Redis password (sentinels or cluster_nodes; a URL has its own)"
    )
    sentinel_password: SecretStr | None = Field(
        None, description="the sentinels' own password, if they require one"
    )
    db: int = Field(0, ge=0, description="Redis database (sentinels; a cluster has only 0)")
    key_prefix: str = Field(
        "polygate", pattern=r"^[A-Za-z0-9_.:-]{1,64}$", description="prefix (hash tag) of keys"
    )
    lease_s: PositiveSeconds = Field(
        30.0, description="permit lease; a dead worker's permit returns after at most this"
    )
    socket_timeout_s: PositiveSeconds = Field(
        2.0, description="Redis reply timeout: a call fails closed within about this"
    )
    connect_timeout_s: PositiveSeconds = Field(2.0, description="Redis connect timeout")

    @field_validator("redis_url")
    @classmethod
    def _a_url_the_store_can_use(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            check_redis_url(value.get_secret_value())
        return value

    @field_validator("sentinels", "cluster_nodes", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        return _addresses(value)

    @field_validator("sentinels", "cluster_nodes")
    @classmethod
    def _one_form(cls, value: list[str] | None, info: ValidationInfo) -> list[str] | None:
        if value is None:
            return None
        for address in value:
            parse_address(address)
        others = [f for f in ("redis_url", "sentinels") if f != info.field_name]
        for other in others:
            if info.data.get(other) is not None:
                raise ValueError(
                    f"set one of store.redis_url, store.sentinels, store.cluster_nodes "
                    f"(store.{other} is set too)"
                )
        return value

    @field_validator("service_name")
    @classmethod
    def _named_with_sentinels(cls, value: str | None, info: ValidationInfo) -> str | None:
        if "sentinels" not in info.data:
            return value  # sentinels failed already: that is the mistake to show
        if info.data["sentinels"] is not None and value is None:
            raise ValueError(
                "required with store.sentinels: the master's name in Sentinel (e.g. mymaster)"
            )
        if info.data["sentinels"] is None and value is not None:
            raise ValueError("service_name applies with store.sentinels only")
        return value

    @field_validator("username", "password", "sentinel_password", "db")
    @classmethod
    def _with_its_form(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None or (info.field_name == "db" and value == 0):
            return value
        if info.field_name in {"sentinel_password", "db"}:
            forms: tuple[str, ...] = ("sentinels",)
        else:
            forms = ("sentinels", "cluster_nodes")
        if all(info.data.get(form) is None for form in forms):
            if info.field_name == "db" and info.data.get("cluster_nodes") is not None:
                raise ValueError("a Redis Cluster has only database 0")
            where = " or ".join(f"store.{form}" for form in forms)
            hint = (
                " (store.redis_url carries its own, in the URL)"
                if info.data.get("redis_url")
                else ""
            )
            raise ValueError(f"{info.field_name} applies with {where} only{hint}")
        return value

    @property
    def shared(self) -> bool:
        """Whether the store is Redis (any form), shared by the fleet."""
        return any(x is not None for x in (self.redis_url, self.sentinels, self.cluster_nodes))

    @property
    def topology(self) -> Literal["memory", "server", "sentinel", "cluster"]:
        if self.sentinels is not None:
            return "sentinel"
        if self.cluster_nodes is not None:
            return "cluster"
        return "memory" if self.redis_url is None else "server"


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
        allow_inf_nan=False,
        description="delay factor per earlier deferral that waited out an estimate "
        "(a rate-limit reset is neither grown nor counted)",
    )
    min_delay_s: PositiveSeconds = Field(1.0, description="shortest deferral")
    max_delay_s: PositiveSeconds = Field(3600.0, description="longest deferral")
    jitter: float = Field(
        0.25,
        ge=0,
        le=1,
        description="delays are stretched by up to this fraction, at random "
        "(a rate-limit reset by 1 s at most)",
    )
    max_deferrals: int = Field(25, ge=0, description="deferrals before FAILURE")
    max_defer_age_s: PositiveSeconds = Field(
        86_400.0, description="time since the first deferral before FAILURE"
    )
    release_interval_s: PositiveSeconds = Field(
        0.2, description="how often a worker releases parked tasks that are due"
    )
    release_batch: int = Field(200, ge=1, description="parked tasks released per round")
    claim_lease_s: PositiveSeconds = Field(
        30.0, description="a release in progress; another worker takes over after this"
    )
    reuse_ttl_s: PositiveSeconds = Field(
        86_400.0, description="how long paid results are kept for a deferred task's next run"
    )
    redelivery_cap: int = Field(
        10, ge=1, description="redeliveries of one message (a worker lost each time) before FAILURE"
    )
    release_check_s: PositiveSeconds = Field(
        300.0,
        description="a released task whose run has not begun after this long is released "
        "again (its message was lost in delivery), each later time after twice as long as the "
        "time before (at most 32 x); a copy is dropped by its run's guard",
    )
    heartbeat_s: PositiveSeconds = Field(
        2.0,
        description="how often a worker marks its governed runs alive; a run whose marker "
        "misses five beats counts as dead, and a copy of its message may run",
    )
