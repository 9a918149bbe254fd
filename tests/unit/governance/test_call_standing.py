"""A call's priority class and tenant, resolved once by the gateway, reach the store with
every admission it asks for (`AdmitRequest.standing`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from polygate_celery import ConfigError, Gateway, Outcome, parse_config
from polygate_celery.config import GatewayConfig
from polygate_celery.core.standing import PLAIN, Standing
from polygate_celery.testing import ScriptedSource, VirtualClock, steps
from tests.conftest import GatewayFactory, make_config
from tests.unit.governance.recording import Answers, RecordingStore


def classes_config(**source: Any) -> GatewayConfig:
    """One chat scope "s" over source "a", classes interactive > batch (with a floor) >
    bulk, and tenant "acme" weighted 5."""
    return parse_config(
        {
            "sources": {"a": source},
            "scopes": {"s": {"kind": "chat", "sources": ["a"]}},
            "priorities": {"interactive": {}, "batch": {"min_share": 0.2}, "bulk": {}},
            "tenants": {"acme": {"weight": 5}},
        }
    )


async def standings_asked(
    clock: VirtualClock,
    gateway: GatewayFactory,
    config: GatewayConfig,
    *calls: dict[str, str],
) -> list[Standing]:
    """The standing each admission of `calls` (their `priority` and `tenant`) carried."""
    store = RecordingStore(clock)
    gw = gateway(config, {"a": Answers(Outcome.success("ok"))}, store=store)
    for options in calls:
        await gw.call("s", "x", **options)
    await gw.aclose()
    return [request.standing for request in store.asked]


async def test_a_calls_class_and_tenant_reach_the_store(
    clock: VirtualClock, own_store_gateway: GatewayFactory
) -> None:
    (standing,) = await standings_asked(
        clock, own_store_gateway, classes_config(), {"priority": "batch", "tenant": "acme"}
    )
    assert standing == Standing(rank=1, tenant="acme", weight=5.0, floors=(0.0, 0.2, 0.0))


async def test_a_call_naming_neither_is_in_the_default_class_with_no_tenant(
    clock: VirtualClock, own_store_gateway: GatewayFactory
) -> None:
    first, second = await standings_asked(
        clock, own_store_gateway, classes_config(), {}, {"tenant": "someone"}
    )
    assert first == Standing(rank=2, tenant="", weight=1.0, floors=(0.0, 0.2, 0.0))
    assert second == Standing(rank=2, tenant="someone", weight=1.0, floors=(0.0, 0.2, 0.0))


async def test_without_classes_or_tenant_every_call_carries_the_shared_plain_standing(
    clock: VirtualClock, own_store_gateway: GatewayFactory
) -> None:
    standings = await standings_asked(clock, own_store_gateway, make_config("chat"), {}, {})
    assert standings == [PLAIN, PLAIN]
    assert all(standing is PLAIN for standing in standings)


async def test_the_standing_is_resolved_once_per_call_not_per_admission(
    clock: VirtualClock, own_store_gateway: GatewayFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queued call asks again after its refusal: both requests carry the one standing
    the gateway resolved when the call began."""
    store = RecordingStore(clock)
    config = classes_config(max_concurrency=1)
    source = ScriptedSource.always(clock, steps.ok(duration_s=30))
    gw = own_store_gateway(config, {"a": source}, store=store)
    holder = asyncio.ensure_future(gw.call("s", "holder", priority="interactive"))
    await clock.sleep(0.5)
    resolved: list[Standing] = []
    standing = GatewayConfig.standing

    def counted(self: GatewayConfig, priority: str | None, tenant: str | None) -> Standing:
        resolved.append(standing(self, priority, tenant))
        return resolved[-1]

    monkeypatch.setattr(GatewayConfig, "standing", counted)
    await gw.call("s", "queued", priority="bulk", tenant="acme")
    await holder
    queued = store.asked[1:]
    assert len(queued) >= 2  # refused while the holder ran, then granted
    (once,) = resolved
    assert all(request.standing is once for request in queued)
    assert once == Standing(rank=2, tenant="acme", weight=5.0, floors=(0.0, 0.2, 0.0))
    await gw.aclose()


EntryPoint = Callable[[Gateway], Awaitable[object]]
ENTRY_POINTS: dict[str, EntryPoint] = {
    "call": lambda gw: gw.call("s", "x", priority="batch", tenant="acme"),
    "chat": lambda gw: gw.chat(
        "s", [{"role": "user", "content": "hi"}], priority="batch", tenant="acme"
    ),
    "embed": lambda gw: gw.embed("s", ["hi"], priority="batch", tenant="acme"),
    "ocr": lambda gw: gw.ocr("s", b"\x89PNG", priority="batch", tenant="acme"),
}


@pytest.mark.parametrize("entry", ENTRY_POINTS)
async def test_every_entry_point_carries_the_class_and_tenant(
    clock: VirtualClock, own_store_gateway: GatewayFactory, entry: str
) -> None:
    store = RecordingStore(clock)
    source = Answers(Outcome.success("ok"))
    gw = own_store_gateway(classes_config(), {"a": source}, store=store)
    await ENTRY_POINTS[entry](gw)
    (request,) = store.asked
    assert (request.standing.rank, request.standing.tenant) == (1, "acme")
    await gw.aclose()


async def test_chat_keeps_priority_and_tenant_out_of_the_providers_parameters(
    clock: VirtualClock, own_store_gateway: GatewayFactory
) -> None:
    sent: list[Any] = []

    class Keeps:
        async def send(self, payload: object, *, timeout_s: float) -> Outcome:
            sent.append(payload)
            return Outcome.success("ok")

    gw = own_store_gateway(classes_config(), {"a": Keeps()}, store=RecordingStore(clock))
    await gw.chat("s", [], priority="batch", tenant="acme", temperature=0.5)
    assert sent[0].params == {"temperature": 0.5}
    await gw.aclose()


@pytest.mark.parametrize(
    ("priority", "tenant", "field"),
    [("urgent", None, "priority"), (None, "a tenant", "tenant"), (None, "", "tenant")],
)
async def test_an_unknown_class_or_a_malformed_tenant_fails_before_any_admission(
    clock: VirtualClock,
    own_store_gateway: GatewayFactory,
    priority: str | None,
    tenant: str | None,
    field: str,
) -> None:
    store = RecordingStore(clock)
    source = Answers(Outcome.success("ok"))
    gw = own_store_gateway(classes_config(), {"a": source}, store=store)
    with pytest.raises(ConfigError) as error:
        await gw.call("s", "x", priority=priority, tenant=tenant)
    assert error.value.field == field
    assert store.asked == []
    await gw.aclose()
