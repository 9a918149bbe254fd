"""Configuration: where governance state lives (Redis in one of three forms, or memory)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator

from polygate_celery.config.fields import HOUR, MAX_DB, Seconds, _Strict
from polygate_celery.config.urls import check_redis_url


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
    db: int = Field(
        0, ge=0, le=MAX_DB, description="Redis database (sentinels; a cluster has only 0)"
    )
    key_prefix: str = Field(
        "polygate", pattern=r"^[A-Za-z0-9_.:-]{1,64}$", description="prefix (hash tag) of keys"
    )
    lease_s: Seconds = Field(
        30.0,
        ge=1,
        le=HOUR,
        description="permit lease; a dead worker's permit returns after at most this",
    )
    socket_timeout_s: Seconds = Field(
        2.0,
        ge=0.01,
        le=300,
        description="Redis reply timeout: a call fails closed within about this",
    )
    connect_timeout_s: Seconds = Field(2.0, ge=0.01, le=300, description="Redis connect timeout")

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
