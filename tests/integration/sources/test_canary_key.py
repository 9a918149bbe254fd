"""The canary API key every simulated source uses appears nowhere a user or operator looks."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from polygate_celery import Gateway, PolygateError, parse_config
from polygate_celery.sources import close_http_client
from polygate_celery.telemetry import Event
from polygate_celery.testing.simulator import SimulatedProvider
from tests.conftest import CANARY_KEY
from tests.integration.sources.conftest import MODELS

FAULTS = [m for m in MODELS if m not in {"ok", "fallback", "slow"}]


async def test_the_canary_key_never_leaks(
    provider: SimulatedProvider, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, httpx and httpcore included, even
    for name in ("httpx", "httpcore"):  # where a worker's start quieted them earlier
        caplog.set_level(logging.DEBUG, logger=name)
    events: list[Event] = []
    seen: list[str] = []
    for fault in FAULTS:
        for stream in (False, True):
            source = {
                "base_url": provider.url,
                "api_key": CANARY_KEY,
                "timeout_s": 1.0,
                "stream": stream,
                "stream_idle_timeout_s": 0.3,
                "ttft_timeout_s": 0.3,
            }
            config = parse_config(
                {
                    "include_bodies": True,  # even with provider bodies in reasons
                    "sources": {"only": {**source, "model": fault}},
                    "scopes": {
                        "s": {
                            "kind": "chat",
                            "sources": ["only"],
                            "max_attempts": 2,
                            "stall_window_s": 0.5,
                            "poll_interval_s": 0.05,
                            "backoff_base_s": 0.05,
                        }
                    },
                }
            )
            gateway = Gateway(config, hooks=[events.append])
            seen += [repr(config), config.model_dump_json(), repr(gateway.plan("s"))]
            try:
                result = await gateway.chat("s", [{"role": "user", "content": "hi"}])
                seen += [repr(result), json.dumps([a.as_dict() for a in result.attempts])]
            except PolygateError as exc:
                seen += [repr(exc), str(exc), json.dumps(exc.args, default=str)]
                seen += [repr(getattr(exc, "trail", ""))]
            await gateway.aclose()
    await close_http_client()

    seen += [repr(event) for event in events]
    seen += [caplog.text] + [repr(r.__dict__) for r in caplog.records]
    assert len(events) > 50
    assert len(caplog.records) > 50  # the scan had logs to look at
    leaks = [text for text in seen if CANARY_KEY in text or CANARY_KEY[3:] in text]
    assert not leaks, leaks[0][:500]


def test_a_source_adapter_repr_holds_no_key() -> None:
    from polygate_celery.sources import source_from_config  # noqa: PLC0415

    config = parse_config(
        {"sources": {"a": {"base_url": "http://x/v1", "model": "m", "api_key": CANARY_KEY}}}
    )
    adapter: Any = source_from_config("a", config.sources["a"])
    assert CANARY_KEY not in repr(adapter) + str(vars(adapter))
