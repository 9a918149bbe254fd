"""The store's three Redis forms (one server, Sentinel, Cluster) and every mistake in them,
each a ConfigError naming its field, never quoting a secret."""

from __future__ import annotations

from typing import Any

import pytest

from polygate_celery import parse_config
from polygate_celery.config.loading import load_config
from polygate_celery.errors import ConfigError

SECRET = "s3cret-pw-7f1c"


def store(**fields: Any) -> Any:
    return parse_config({"store": fields}).store


def mistake(**fields: Any) -> tuple[str, str]:
    with pytest.raises(ConfigError) as caught:
        store(**fields)
    assert SECRET not in str(caught.value)
    assert len(caught.value.problems) == 1, caught.value.problems
    return caught.value.problems[0]


def test_sentinel_form() -> None:
    config = store(
        sentinels=["s1:26379", "[::1]:26380"],
        service_name="mymaster",
        password=SECRET,
        sentinel_password=SECRET,
        username="gov",
        db=3,
    )
    assert config.topology == "sentinel"
    assert config.shared
    assert SECRET not in repr(config)


def test_cluster_form() -> None:
    config = store(cluster_nodes=["r1:7000"], password=SECRET)
    assert config.topology == "cluster"
    assert config.shared


def test_the_forms_read_comma_separated_addresses_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("POLYGATE_CONFIG", raising=False)
    monkeypatch.setenv("POLYGATE_STORE__SENTINELS", "s1:26379, s2:26379")
    monkeypatch.setenv("POLYGATE_STORE__SERVICE_NAME", "mymaster")
    assert load_config().store.sentinels == ["s1:26379", "s2:26379"]


@pytest.mark.parametrize(
    ("fields", "field", "says"),
    [
        ({"sentinels": ["s1:26379"]}, "store.service_name", "required with store.sentinels"),
        ({"service_name": "m"}, "store.service_name", "applies with store.sentinels only"),
        (
            {"sentinels": ["s1"], "service_name": "m"},
            "store.sentinels",
            "'s1' is not host:port",
        ),
        (
            {"sentinels": ["s1:99999"], "service_name": "m"},
            "store.sentinels",
            "is not host:port",
        ),
        ({"sentinels": [], "service_name": "m"}, "store.sentinels", "at least 1"),
        ({"cluster_nodes": ["r1:x"]}, "store.cluster_nodes", "is not host:port"),
        (
            {"redis_url": "redis://h:6379/0", "sentinels": ["s:1"], "service_name": "m"},
            "store.sentinels",
            "set one of store.redis_url, store.sentinels, store.cluster_nodes",
        ),
        (
            {"sentinels": ["s:1"], "service_name": "m", "cluster_nodes": ["c:1"]},
            "store.cluster_nodes",
            "store.sentinels is set too",
        ),
        (
            {"redis_url": "redis://h:6379/0", "password": SECRET},
            "store.password",
            "store.redis_url carries its own",
        ),
        ({"password": SECRET}, "store.password", "applies with store.sentinels or"),
        (
            {"cluster_nodes": ["c:1"], "sentinel_password": SECRET},
            "store.sentinel_password",
            "applies with store.sentinels only",
        ),
        ({"cluster_nodes": ["c:1"], "db": 2}, "store.db", "a Redis Cluster has only database 0"),
        ({"redis_url": "redis://h:6379/0", "db": 2}, "store.db", "applies with store.sentinels"),
        (
            {"redis_url": f"sentinel://:{SECRET}@s:26379"},
            "store.redis_url",
            "set store.sentinels and store.service_name instead",
        ),
        (
            {"redis_url": "redis+cluster://c:7000"},
            "store.redis_url",
            "set store.cluster_nodes instead",
        ),
    ],
)
def test_each_mistake_names_its_field(fields: dict[str, Any], field: str, says: str) -> None:
    path, message = mistake(**fields)
    assert path == field
    assert says in message
