"""Closing a gateway closes what it built (the configuration's store and sources), and
leaves alone what it was given."""

from __future__ import annotations

from typing import Any

import pytest

from polygate_celery import Gateway, MemoryStore
from polygate_celery.testing import VirtualClock
from tests.conftest import make_config


class Closing:
    """Stands for a store or a source built from the configuration: it says when closed."""

    def __init__(self, closed: list[str], name: str) -> None:
        self.closed, self.name = closed, name

    async def aclose(self) -> None:
        self.closed.append(self.name)


class ClosingStore(Closing, MemoryStore):
    def __init__(self, clock: VirtualClock, closed: list[str]) -> None:
        MemoryStore.__init__(self, clock)
        Closing.__init__(self, closed, "store")


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch, clock: VirtualClock) -> list[str]:
    """What the gateway builds from the configuration, and the list of what was closed."""
    closed: list[str] = []

    def store_from_config(*_: Any, **__: Any) -> MemoryStore:
        return ClosingStore(clock, closed)

    def sources_from_config(config: Any) -> dict[str, Any]:
        return {"a": Closing(closed, "a"), "b": Closing(closed, "b"), "c": Closing(closed, "c")}

    monkeypatch.setattr("polygate_celery.governance.gateway.store_from_config", store_from_config)
    monkeypatch.setattr(
        "polygate_celery.governance.gateway.sources_from_config", sources_from_config
    )
    return closed


CONFIG = make_config("chat", {"a": {}, "b": {}, "c": {}})


async def test_a_gateway_closes_the_store_and_the_sources_it_built(
    built: list[str], clock: VirtualClock
) -> None:
    gateway = Gateway(CONFIG, clock=clock)
    await gateway.aclose()
    assert built == ["store", "a", "b", "c"]


async def test_a_gateway_leaves_a_store_and_sources_it_was_given_open(
    built: list[str], clock: VirtualClock
) -> None:
    closed: list[str] = []
    sources = {"a": Closing(closed, "a"), "b": Closing(closed, "b"), "c": Closing(closed, "c")}
    gateway = Gateway(CONFIG, sources, store=ClosingStore(clock, closed), clock=clock)  # type: ignore[arg-type]
    await gateway.aclose()
    assert closed == []
    assert built == []


async def test_the_adapters_a_configuration_builds_can_all_be_closed() -> None:
    config = make_config(
        "chat",
        {
            "http": {"base_url": "http://127.0.0.1:9", "model": "m"},
            "other": {"base_url": "http://127.0.0.1:9", "model": "m"},
        },
    )
    gateway = Gateway(config)
    await gateway.aclose()  # the memory store and the HTTP adapters: nothing held, no error
    assert isinstance(gateway.store, MemoryStore)
