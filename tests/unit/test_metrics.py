"""Prometheus metrics: the hook's counters, the collector's gauges, multiprocess mode, the extra."""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from polygate_celery import AllSourcesExhausted, GatewayConfig, SourceFatalError, parse_config
from polygate_celery.celery import configure_worker
from polygate_celery.celery.runtime import forget_config
from polygate_celery.core.standing import named_for
from polygate_celery.governance.plan import source_terms
from polygate_celery.metrics import GovernanceCollector, PrometheusHook
from polygate_celery.store import AdmitRequest, Grant, Store
from polygate_celery.store.redis import RedisStore
from polygate_celery.telemetry import DeferralEvent, SourceAlertEvent, WaitEvent
from polygate_celery.testing import ScriptedSource, VirtualClock, steps
from tests.conftest import GatewayFactory, Recorder, make_config, unique_prefix

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def hook(registry: CollectorRegistry) -> PrometheusHook:
    return PrometheusHook(registry)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


async def test_the_hook_counts_what_governed_calls_do(
    clock: VirtualClock,
    gateway: GatewayFactory,
    recorder: Recorder,
    hook: PrometheusHook,
    registry: CollectorRegistry,
) -> None:
    source = ScriptedSource(
        clock,
        [
            steps.server_error(),
            steps.ok(),  # call 1: a failure, a backoff, a success
            steps.fatal("PROMPT-7c1 was refused"),  # call 2: fatal at once
            steps.rate_limited(),
            steps.rate_limited(),  # call 3: embeddings burn the budget on 429s
        ],
    )
    gw = gateway(
        make_config("embedding", max_attempts=2, backoff_base_s=1, stall_window_s=60),
        {"a": source},
        hooks=[recorder, hook],
    )

    await gw.call("s", "PROMPT-7c1")
    with pytest.raises(SourceFatalError):
        await gw.call("s", "PROMPT-7c1")
    with pytest.raises(AllSourcesExhausted):
        await gw.call("s", "PROMPT-7c1")

    attempts = "polygate_attempts_total"
    assert value(registry, attempts, scope="s", source="a", outcome="transient") == 1
    assert value(registry, attempts, scope="s", source="a", outcome="success") == 1
    assert value(registry, attempts, scope="s", source="a", outcome="fatal") == 1
    assert value(registry, attempts, scope="s", source="a", outcome="rate_limited") == 2
    unnamed = {"priority": "", "tenant": ""}  # no class declared, no tenant
    assert value(registry, "polygate_verdicts_total", scope="s", verdict="success", **unnamed) == 1
    assert value(registry, "polygate_verdicts_total", scope="s", verdict="fatal", **unnamed) == 1
    exhausted = value(
        registry, "polygate_verdicts_total", scope="s", verdict="retry_exhausted", **unnamed
    )
    assert exhausted == 1
    backoffs = [e for e in recorder.of(WaitEvent) if e.cause == "backoff"]
    assert backoffs
    assert value(registry, "polygate_waits_total", scope="s", cause="backoff") == len(backoffs)
    assert value(
        registry, "polygate_wait_seconds_total", scope="s", cause="backoff"
    ) == pytest.approx(sum(e.seconds for e in backoffs))
    exposed = generate_latest(registry).decode()
    assert "PROMPT-7c1" not in exposed  # neither the payload nor a provider's reason


def test_the_hook_counts_deferrals_and_source_alerts(
    hook: PrometheusHook, registry: CollectorRegistry
) -> None:
    hook(DeferralEvent("s", "stalled", 1, 2.5, "park", 2.0))
    hook(DeferralEvent("s", "stalled", 2, 5.0, "park", 2.0))
    hook(DeferralEvent(None, "backend_error", 1, 1.0, "countdown"))
    hook(SourceAlertEvent("a", "credentials rejected", 600.0))

    deferrals = "polygate_deferrals_total"
    assert value(registry, deferrals, scope="s", reason="stalled", strategy="park") == 2
    assert value(registry, deferrals, scope="-", reason="backend_error", strategy="countdown") == 1
    assert (
        value(registry, "polygate_source_alerts_total", source="a", reason="credentials rejected")
        == 1
    )


async def test_verdicts_are_labelled_by_class_and_by_declared_tenants_alone(
    clock: VirtualClock, gateway: GatewayFactory, registry: CollectorRegistry
) -> None:
    config = parse_config(
        {
            "sources": {"a": {}},
            "scopes": {"s": {"kind": "chat", "sources": ["a"]}},
            "priorities": {"interactive": {}, "batch": {"default": True}},
            "tenants": {"acme": {"weight": 5}, "globex": {}},
        }
    )
    hook = PrometheusHook(registry, tenants=["acme"])
    hook.declare_tenants(config.tenants)  # as configure_worker does: acme and globex
    gw = gateway(config, {"a": ScriptedSource.always(clock, steps.ok())}, hooks=[hook])
    messages = [{"role": "user", "content": "hi"}]
    await gw.chat("s", messages, priority="interactive", tenant="acme")
    await gw.chat("s", messages, tenant="globex")
    for customer in ("customer-1", "customer-2", "customer-3"):
        await gw.chat("s", messages, tenant=customer)
    await gw.chat("s", messages)

    def verdicts(priority: str, tenant: str) -> float | None:
        labels = {"scope": "s", "verdict": "success", "priority": priority, "tenant": tenant}
        return value(registry, "polygate_verdicts_total", **labels)

    assert verdicts("interactive", "acme") == 1
    assert verdicts("batch", "globex") == 1
    assert verdicts("batch", "other") == 3  # undeclared tenants: one label value
    assert verdicts("batch", "") == 1  # no tenant
    assert "customer-1" not in generate_latest(registry).decode()


def test_configure_worker_tells_the_hook_the_declared_tenants(registry: CollectorRegistry) -> None:
    config = parse_config(
        {
            "sources": {"a": {}},
            "scopes": {"s": {"kind": "chat", "sources": ["a"]}},
            "tenants": {"acme": {"weight": 5}},
        }
    )
    hook = PrometheusHook(registry)
    assert hook.tenant_label("acme") == "other"
    app = Celery("metrics-tenants", set_as_current=False)
    configure_worker(app, config, hooks=[hook])
    forget_config(app)
    assert (hook.tenant_label("acme"), hook.tenant_label("initech")) == ("acme", "other")
    assert hook.tenant_label(None) == ""


def test_a_second_hook_needs_a_registry_of_its_own(registry: CollectorRegistry) -> None:
    PrometheusHook(registry)
    with pytest.raises(ValueError, match="Duplicated"):
        PrometheusHook(registry)
    PrometheusHook(CollectorRegistry())


# -- the collector -----------------------------------------------------------------------


def fleet_config() -> GatewayConfig:
    return parse_config(
        {
            "sources": {
                "a": {"max_concurrency": 4, "breaker": {"failure_threshold": 1}},
                "b": {"max_concurrency": 2},
                "c": {"max_concurrency": 3, "aimd": {"initial_limit": 2}},
            },
            "scopes": {
                "s": {"kind": "chat", "sources": ["a", "b"], "backoff_base_s": 1},
                "t": {"kind": "chat", "sources": ["c"]},
            },
        }
    )


class ReadingClock:
    """The test's virtual time, for a store on the collector's thread, which must not move it."""

    def __init__(self, clock: VirtualClock) -> None:
        self._clock = clock

    def now(self) -> float:
        return self._clock.now()

    async def sleep(self, seconds: float) -> None:
        raise AssertionError("the collector never sleeps")


@pytest.fixture
def collector_store(request: pytest.FixtureRequest, store: Store, clock: VirtualClock) -> Store:
    """The store as an exporter sees it: for Redis, a client of its own on the same keys."""
    if isinstance(store, RedisStore):
        url = request.getfixturevalue("redis_url")
        return RedisStore.from_url(url, prefix=store.keys.prefix, clock=ReadingClock(clock))
    return store


@contextlib.contextmanager
def registered(config: GatewayConfig, store: Store) -> Iterator[CollectorRegistry]:
    """A registry whose collector reads `store` on each scrape, closed afterwards."""
    collector = GovernanceCollector(config, store=store)
    registry = CollectorRegistry()
    registry.register(collector)
    try:
        yield registry
    finally:
        collector.close()


async def test_the_collector_reports_the_store_state(
    clock: VirtualClock, gateway: GatewayFactory, store: Store, collector_store: Store
) -> None:
    config = fleet_config()
    a = ScriptedSource(clock, [steps.server_error()])
    b = ScriptedSource(clock, [steps.ok()])
    c = ScriptedSource(clock, [])
    gw = gateway(config, {"a": a, "b": b, "c": c})
    await gw.call("s", "x")  # a fails (its breaker opens), b succeeds
    clock.advance(5)
    await store.pause_source("b", 30)
    held = await store.admit(AdmitRequest("t", (source_terms(config, "c"),), "p1"))
    assert isinstance(held, Grant)

    with registered(config, collector_store) as registry:
        assert value(registry, "polygate_store_up") == 1
        for name, cap, limit, in_use, breaker, failures, paused in [
            ("a", 4, 4, 0, 2, 1, 0),
            ("b", 2, 2, 0, 0, 0, 30),
            ("c", 3, 2, 1, 0, 0, 0),
        ]:
            assert value(registry, "polygate_permit_cap", source=name) == cap
            assert value(registry, "polygate_permit_limit", source=name) == limit
            assert value(registry, "polygate_permits_in_use", source=name) == in_use
            assert value(registry, "polygate_breaker_state", source=name) == breaker
            assert value(registry, "polygate_breaker_failures", source=name) == failures
            paused_s = value(registry, "polygate_source_paused_seconds", source=name)
            assert paused_s == pytest.approx(paused)
        age = value(registry, "polygate_scope_progress_age_seconds", scope="s")
        assert age == pytest.approx(5)
        assert value(registry, "polygate_scope_progress_age_seconds", scope="t") == math.inf


async def test_the_collector_reports_the_calls_waiting_for_a_source_by_class(
    store: Store, collector_store: Store
) -> None:
    config = parse_config(
        {
            "sources": {"a": {"max_concurrency": 1}},
            "scopes": {"s": {"kind": "chat", "sources": ["a"]}},
            "priorities": {"interactive": {}, "batch": {"default": True}},
        }
    )
    terms = source_terms(config, "a")
    assert isinstance(await store.admit(AdmitRequest("s", (terms,), "held")), Grant)
    for call, priority in [("b1", "batch"), ("b2", "batch"), ("i1", "interactive")]:
        waiting = AdmitRequest(
            "s", (terms,), f"p-{call}", call_id=call, claim_s=30.0, queued=False,
            standing=config.standing(priority),
        )  # fmt: skip
        assert not isinstance(await store.admit(waiting), Grant)
    with registered(config, collector_store) as registry:
        assert value(registry, "polygate_source_waiting", source="a", priority="batch") == 2
        assert value(registry, "polygate_source_waiting", source="a", priority="interactive") == 1


async def test_the_collector_reports_each_declared_tenants_calls_and_the_others_summed(
    store: Store, collector_store: Store
) -> None:
    config = parse_config(
        {
            "sources": {"a": {"max_concurrency": 3}},
            "scopes": {"s": {"kind": "chat", "sources": ["a"]}},
            "tenants": {"acme": {"weight": 2}},
        }
    )
    terms = source_terms(config, "a")
    for permit, tenant in [("p1", "acme"), ("p2", "acme"), ("p3", "customer-7")]:
        request = AdmitRequest("s", (terms,), named_for(permit, tenant))
        assert isinstance(await store.admit(request), Grant)
    for call, tenant in [("w1", "acme"), ("w2", "customer-8"), ("w3", "customer-9")]:
        waiting = AdmitRequest(
            "s", (terms,), f"ask-{call}", call_id=named_for(call, tenant), claim_s=30.0,
            queued=False, standing=config.standing(tenant=tenant),
        )  # fmt: skip
        assert not isinstance(await store.admit(waiting), Grant)
    with registered(config, collector_store) as registry:
        assert value(registry, "polygate_tenant_in_flight", source="a", tenant="acme") == 2
        assert value(registry, "polygate_tenant_in_flight", source="a", tenant="other") == 1
        assert value(registry, "polygate_tenant_waiting", source="a", tenant="acme") == 1
        assert value(registry, "polygate_tenant_waiting", source="a", tenant="other") == 2


async def test_the_collector_reports_the_quota_slots_booked_at_a_source_by_class(
    store: Store, collector_store: Store
) -> None:
    config = parse_config(
        {
            "sources": {"a": {"max_concurrency": 100, "rpm": 60}},
            "scopes": {"s": {"kind": "chat", "sources": ["a"]}},
            "priorities": {"interactive": {}, "batch": {"default": True}},
        }
    )
    terms = source_terms(config, "a")
    n = 0
    while isinstance(await store.admit(AdmitRequest("s", (terms,), f"burst-{n}")), Grant):
        n += 1  # the bucket's burst spent
    for call, priority in [("b1", "batch"), ("b2", "batch"), ("i1", "interactive")]:
        waiting = AdmitRequest(
            "s", (terms,), f"p-{call}", call_id=call, claim_s=30.0, book_within_s=300.0,
            standing=config.standing(priority),
        )  # fmt: skip
        denial = await store.admit(waiting)
        assert not isinstance(denial, Grant)
        assert denial.booked_in_s is not None
    # i1 took b1's slot; b1 was booked anew at once (batch has no floor), after b2
    with registered(config, collector_store) as registry:
        assert value(registry, "polygate_source_booked", source="a", priority="batch") == 2
        assert value(registry, "polygate_source_booked", source="a", priority="interactive") == 1


async def test_the_collector_reports_parking_lots(redis_url: str) -> None:
    store = RedisStore.from_url(redis_url, prefix=unique_prefix())
    lot = store.keys.parked("pipeline")
    seconds, _ = await store.client.time()
    await store.client.zadd(lot, {"t1:1": seconds - 10, "t2:1": seconds + 600})
    await store.client.hset(f"{lot}:msg", mapping={"t1:1": "{}", "t2:1": "{}"})
    config = make_config()
    found = GovernanceCollector(
        config, store=RedisStore.from_url(redis_url, prefix=store.keys.prefix)
    )
    named = GovernanceCollector(
        config,
        store=RedisStore.from_url(redis_url, prefix=store.keys.prefix),
        apps=["pipeline", "other"],
    )
    try:
        for collector in (found, named):
            registry = CollectorRegistry()
            registry.register(collector)
            assert value(registry, "polygate_parked_tasks", app="pipeline") == 2
            assert value(registry, "polygate_parked_due_tasks", app="pipeline") == 1
        samples = [s for m in found.collect() for s in m.samples if "parked" in s.name]
        assert {s.labels["app"] for s in samples} == {"pipeline"}  # not :msg, not :claim
        registry = CollectorRegistry()
        registry.register(named)
        assert value(registry, "polygate_parked_tasks", app="other") == 0
    finally:
        found.close()
        named.close()
        await store.client.delete(lot, f"{lot}:msg")
        await store.aclose()


async def test_an_apps_lots_are_found_per_broker_and_a_scopes_index_is_no_lot(
    redis_url: str,
) -> None:
    store = RedisStore.from_url(redis_url, prefix=unique_prefix())
    lot = store.keys.parked("tasks@b1")  # as `celery.parking.lot_name` names a lot
    seconds, _ = await store.client.time()
    await store.client.zadd(lot, {"t1:1": seconds - 10})
    await store.client.zadd(f"{lot}:scope:summarise", {"t1:1": seconds})
    try:
        for apps in (None, ["tasks"]):
            reader = RedisStore.from_url(redis_url, prefix=store.keys.prefix)
            collector = GovernanceCollector(make_config(), store=reader, apps=apps)
            try:
                samples = {
                    sample.labels["app"]: sample.value
                    for family in collector.collect()
                    for sample in family.samples
                    if sample.name == "polygate_parked_tasks"
                }
            finally:
                collector.close()
            assert samples == {"tasks@b1": 1}
    finally:
        await store.client.delete(lot, f"{lot}:scope:summarise")
        await store.aclose()


def test_a_store_that_does_not_answer_is_reported_not_raised() -> None:
    config = make_config()
    store = RedisStore.from_url(
        "redis://127.0.0.1:1/0", socket_timeout_s=0.5, connect_timeout_s=0.5
    )
    collector = GovernanceCollector(config, store=store)
    registry = CollectorRegistry()
    registry.register(collector)
    try:
        assert value(registry, "polygate_store_up") == 0
        assert value(registry, "polygate_permits_in_use", source="a") is None
    finally:
        collector.close()


# -- multiprocess mode and the optional extra --------------------------------------------

WRITER = """
import json, sys
from polygate_celery.core.outcome import AttemptRecord
from polygate_celery.metrics import PrometheusHook
from polygate_celery.telemetry import AttemptEvent, DeferralEvent
hook = PrometheusHook()
for n in range(int(sys.argv[1])):
    hook(AttemptEvent("s", 1, AttemptRecord("a", "success", 0.1, 0.0)))
hook(DeferralEvent("s", "stalled", 1, 2.0, "park"))
"""


def test_counters_of_several_processes_add_up_in_multiprocess_mode(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for count in (2, 3):
        done = subprocess.run(
            [sys.executable, "-c", WRITER, str(count)], cwd=ROOT, env=env, check=False
        )
        assert done.returncode == 0
    assert len(list(tmp_path.glob("counter_*.db"))) == 2  # one file per process

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))
    attempts = {"scope": "s", "source": "a", "outcome": "success"}
    assert registry.get_sample_value("polygate_attempts_total", attempts) == 5
    deferrals = {"scope": "s", "reason": "stalled", "strategy": "park"}
    assert registry.get_sample_value("polygate_deferrals_total", deferrals) == 2


def test_without_the_extra_the_import_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.delitem(sys.modules, "polygate_celery.metrics")
    with pytest.raises(ImportError, match=r"pip install 'polygate_celery\[prometheus\]'"):
        importlib.import_module("polygate_celery.metrics")
