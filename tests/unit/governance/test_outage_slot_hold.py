"""A governed task holds its slot about a minute in an outage (SPEC §3 rule 16), virtual time.

Governed tasks run their scopes with a 60 s stall window unless one is set
(`governed_config`), and under the scope gate a backoff charged to waiting ends
by the end of the call's stall budget: every call of an outage ends `stalled`
within the window plus a poll and an attempt, however the jitter falls.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from polygate_celery import AllSourcesExhausted
from polygate_celery.celery.runtime import governed_config
from polygate_celery.config import parse_config
from polygate_celery.config.gateway import GOVERNED_STALL_WINDOW_S
from polygate_celery.testing import VirtualClock
from tests.conftest import GatewayFactory, make_config
from tests.unit.governance.test_outage_is_waiting import Refusing

SLOT_HOLD_LIMIT_S = 75.0  # the acceptance bound of issue 35 §1


def test_governed_tasks_default_to_a_one_minute_stall_window() -> None:
    config = governed_config(make_config("chat"))
    assert config.scopes["s"].stall_window_s == GOVERNED_STALL_WINDOW_S == 60.0
    # The derived call deadline follows the window it runs with.
    assert config.max_call_s("s") == 3 * config.sources["a"].timeout_s + 2 * 60.0


@pytest.mark.parametrize("where", ["scope", "scope_defaults"])
@pytest.mark.parametrize("window", [300.0, 30.0])
def test_a_stall_window_set_explicitly_is_honoured(where: str, window: float) -> None:
    data: dict[str, Any] = {
        "sources": {"a": {}},
        "scopes": {"s": {"kind": "chat", "sources": ["a"]}},
    }
    if where == "scope":
        data["scopes"]["s"]["stall_window_s"] = window
    else:
        data["scope_defaults"] = {"stall_window_s": window}
    assert governed_config(parse_config(data)).scopes["s"].stall_window_s == window


def test_the_governed_window_is_never_below_a_first_token_limit() -> None:
    config = governed_config(make_config("chat", {"a": {"ttft_timeout_s": 90, "timeout_s": 120}}))
    assert config.scopes["s"].stall_window_s == 90


async def _elapsed(clock: VirtualClock, call: Any) -> tuple[str, float]:
    started = clock.now()
    try:
        await call
    except AllSourcesExhausted as exc:
        return exc.reason, clock.now() - started
    return "success", clock.now() - started


@pytest.mark.parametrize("u", [0.0, 0.5, 0.999], ids=["jitter-low", "jitter-mid", "jitter-high"])
@pytest.mark.parametrize("calls", [1, 16])
async def test_an_outage_parks_every_call_within_about_a_minute(
    clock: VirtualClock, gateway: GatewayFactory, calls: int, u: float
) -> None:
    source = Refusing()
    gw = gateway(
        governed_config(make_config("chat")), {"a": source}, scope_gate=True, random=lambda: u
    )
    found = await asyncio.gather(*(_elapsed(clock, gw.call("s", f"p{n}")) for n in range(calls)))
    assert [reason for reason, _ in found] == ["stalled"] * calls
    worst = max(seconds for _, seconds in found)
    assert worst <= SLOT_HOLD_LIMIT_S, found


@pytest.mark.parametrize("u", [0.0, 0.999], ids=["jitter-low", "jitter-high"])
async def test_a_long_backoff_never_puts_the_verdict_off(
    clock: VirtualClock, gateway: GatewayFactory, u: float
) -> None:
    """A lone call whose backoffs grow to `backoff_max_s` (the breaker never opens): its
    verdict still comes within one poll of its stall budget's end."""
    source = Refusing()
    config = governed_config(make_config("chat", {"a": {"breaker": {"failure_threshold": 1000}}}))
    gw = gateway(config, {"a": source}, scope_gate=True, random=lambda: u)
    reason, seconds = await _elapsed(clock, gw.call("s", "p"))
    assert reason == "stalled"
    assert seconds <= 60.0 + config.scopes["s"].poll_interval_s + 1.0
