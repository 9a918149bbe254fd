"""Shared fixtures: virtual time and small configurations built in one line."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from polygate_celery import Gateway, GatewayConfig, MemoryStore, parse_config
from polygate_celery.sources import Source
from polygate_celery.telemetry import Event
from polygate_celery.testing import VirtualClock


def make_config(
    kind: str = "chat",
    sources: Mapping[str, Mapping[str, Any]] | None = None,
    **scope: Any,
) -> GatewayConfig:
    """A gateway configuration with one scope named "s" over `sources` (default: one, "a")."""
    sources = dict(sources or {"a": {}})
    return parse_config(
        {
            "sources": {name: dict(settings) for name, settings in sources.items()},
            "scopes": {"s": {"kind": kind, "sources": list(sources), **scope}},
        }
    )


class Recorder:
    """A telemetry hook that keeps every event."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def __call__(self, event: Event) -> None:
        self.events.append(event)

    def of(self, kind: type[Any]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


GatewayFactory = Callable[..., Gateway]


@pytest.fixture
def gateway(clock: VirtualClock, recorder: Recorder) -> GatewayFactory:
    """Build a deterministic gateway: virtual clock, random source fixed at 0, events recorded."""

    def build(config: GatewayConfig, sources: Mapping[str, Source], **kwargs: Any) -> Gateway:
        kwargs.setdefault("store", MemoryStore(clock))
        kwargs.setdefault("random", lambda: 0.0)
        kwargs.setdefault("hooks", [recorder])
        return Gateway(config, sources, clock=clock, **kwargs)

    return build


@pytest.fixture
def no_real_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any test that sleeps for real: unit tests run in virtual time only."""
    real_sleep = asyncio.sleep

    async def guarded_sleep(delay: float, result: Any = None) -> Any:
        if delay > 0:
            raise AssertionError(f"a unit test slept for real: asyncio.sleep({delay})")
        return await real_sleep(delay, result)

    def guarded_time_sleep(seconds: float) -> None:
        raise AssertionError(f"a unit test slept for real: time.sleep({seconds})")

    monkeypatch.setattr(asyncio, "sleep", guarded_sleep)
    monkeypatch.setattr(time, "sleep", guarded_time_sleep)
