"""Edge (observability): Prometheus metrics, the optional ``prometheus`` extra.

Two parts, because they come from two places:

- `PrometheusHook`, a telemetry hook: counters of what the governed calls of
  this process did (attempts, verdicts, waits, deferrals, source alerts).
  Under Celery's prefork pool each worker process counts for itself; with
  ``PROMETHEUS_MULTIPROC_DIR`` set in the workers' environment (an empty
  directory, wiped before the workers start, set before anything imports
  prometheus_client) prometheus_client writes the counters to files there,
  which one exporter sums up.
- `GovernanceCollector`, a custom collector that reads the store on each scrape:
  gauges of the fleet's governance state (permits, AIMD limits, breakers, pauses,
  waiters by class and tenant, scope progress, parked backlog), the same whichever
  process reads it.

`serve(config, port)` runs both behind one HTTP endpoint, on the workers' host
(``polygate-celery metrics --port 9464``, or ``python -m polygate_celery.metrics``).
Labels hold only configured names (scope, source, app, priority class, declared
tenant) and fixed vocabularies (outcome, verdict, cause, reason, strategy): never a
key, a URL or a prompt. A tenant the configuration does not declare is counted as
`OTHER_TENANT`: tenants are often customer ids, which would make the label's values
unbounded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import os
import sys
import threading
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, start_http_server
    from prometheus_client.core import GaugeMetricFamily, Metric
    from prometheus_client.multiprocess import MultiProcessCollector
except ImportError as exc:  # pragma: no cover - exercised by a test that hides the module
    MISSING = (
        "polygate_celery.metrics needs prometheus-client: pip install 'polygate_celery[prometheus]'"
    )
    if __name__ == "__main__":  # python -m polygate_celery.metrics: the line, no traceback
        print(f"error: {MISSING}", file=sys.stderr)
        raise SystemExit(2) from None
    raise ImportError(MISSING, name=exc.name) from exc

from polygate_celery.config.gateway import GatewayConfig
from polygate_celery.core.terms import SourceTerms
from polygate_celery.governance.plan import source_terms
from polygate_celery.store.base import SourceSnapshot, Store
from polygate_celery.store.factory import store_from_config
from polygate_celery.store.redis import RedisStore
from polygate_celery.store.redis.lots import read_lots
from polygate_celery.telemetry import (
    AttemptEvent,
    DeferralEvent,
    Event,
    SourceAlertEvent,
    VerdictEvent,
    WaitEvent,
)

logger = logging.getLogger("polygate_celery")
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
DEFAULT_PORT = 9464
NO_SCOPE = "-"  # a deferral whose verdict named no scope (the store failed first)
OTHER_TENANT = "other"  # the tenant label of every tenant the configuration does not declare
BREAKER_STATES = {"closed": 0.0, "half_open": 1.0, "open": 2.0}


class PrometheusHook:
    """A telemetry hook counting events; make one per process and pass it as a hook.

    ``configure_worker(app, config, hooks=[PrometheusHook()])`` counts every
    worker process's calls and deferrals. A second hook on the same registry
    would register the same metric names again: pass a fresh `registry` to it.

    Verdicts are labelled with the call's priority class ("" when the configuration
    declares none) and its tenant: its name for the `tenants` declared in
    ``[tenants.<name>]``, `OTHER_TENANT` for any other, "" for a call without one.
    `configure_worker` adds its configuration's tenants (`declare_tenants`); beside a
    `Gateway` alone, pass them: ``PrometheusHook(tenants=config.tenants)``.
    """

    def __init__(
        self, registry: CollectorRegistry | None = REGISTRY, *, tenants: Collection[str] = ()
    ) -> None:
        self.tenants = frozenset(tenants)

        def counter(name: str, doc: str, labels: Sequence[str]) -> Counter:
            return Counter(name, doc, labels, registry=registry)

        self.attempts = counter(
            "polygate_attempts",
            "Attempts sent to a source, by outcome "
            "(success, rate_limited, transient, source_rejected, fatal)",
            ("scope", "source", "outcome"),
        )
        self.verdicts = counter(
            "polygate_verdicts",
            "Governed calls ended, by verdict (success, fatal, or the exhaustion reason: "
            "stalled, retry_exhausted, fail_fast, deadline), priority class and tenant "
            '(declared tenants by name, the others as "other")',
            ("scope", "verdict", "priority", "tenant"),
        )
        self.waits = counter(
            "polygate_waits",
            "Waits inside governed calls: for a runnable source (no_runnable) or a backoff",
            ("scope", "cause"),
        )
        self.wait_seconds = counter(
            "polygate_wait_seconds",
            "Seconds governed calls spent waiting, by cause",
            ("scope", "cause"),
        )
        self.deferrals = counter(
            "polygate_deferrals",
            "Celery tasks deferred (re-enqueued to run later), by verdict reason and strategy",
            ("scope", "reason", "strategy"),
        )
        self.source_alerts = counter(
            "polygate_source_alerts",
            "Alerts an operator must see about a source, e.g. rejected credentials",
            ("source", "reason"),
        )

    def declare_tenants(self, tenants: Collection[str]) -> None:
        """Count `tenants` by name from now on, beside those declared before."""
        self.tenants = self.tenants | frozenset(tenants)

    def tenant_label(self, tenant: str | None) -> str:
        """A call's tenant as a label value: bounded by the declared tenants."""
        if tenant is None:
            return ""
        return tenant if tenant in self.tenants else OTHER_TENANT

    def __call__(self, event: Event) -> None:
        if isinstance(event, AttemptEvent):
            record = event.record
            self.attempts.labels(event.scope, record.source, record.outcome).inc()
        elif isinstance(event, VerdictEvent):
            tenant = self.tenant_label(event.tenant)
            self.verdicts.labels(event.scope, event.verdict, event.priority or "", tenant).inc()
        elif isinstance(event, WaitEvent):
            self.waits.labels(event.scope, event.cause).inc()
            self.wait_seconds.labels(event.scope, event.cause).inc(max(0.0, event.seconds))
        elif isinstance(event, DeferralEvent):
            scope = event.scope or NO_SCOPE
            self.deferrals.labels(scope, event.reason, event.strategy).inc()
        elif isinstance(event, SourceAlertEvent):
            self.source_alerts.labels(event.source, event.reason).inc()


@dataclass(frozen=True, slots=True)
class _Reading:
    sources: list[tuple[SourceTerms, SourceSnapshot]]
    progress: list[tuple[str, float]]
    parked: list[tuple[str, int, int]]


class GovernanceCollector:
    """Gauges of the store's governance state, read on each scrape.

    Reads run on the collector's own event loop, in a daemon thread of its own
    (never a worker runtime's loop), so `collect` can be called from any
    thread. `store` must be usable from that loop: a `MemoryStore`, or a
    `RedisStore` made for the collector (default: one from ``config.store``).
    `apps` names the Celery apps (their ``main`` name) whose parking lots are
    reported; by default they are found with a SCAN of the store's prefix on
    every scrape, and a lot that is empty (its key gone) is not reported.
    A scrape whose store does not answer within `timeout_s` reports
    ``polygate_store_up 0`` and no governance gauges.
    """

    def __init__(
        self,
        config: GatewayConfig,
        *,
        store: Store | None = None,
        apps: Sequence[str] | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self._config = config
        self._terms = [source_terms(config, name) for name in sorted(config.sources)]
        self._store = store
        self._apps = tuple(apps) if apps is not None else None
        self._timeout_s = timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def describe(self) -> Iterable[Metric]:
        """The metric families without reading the store (for the registry's name checks)."""
        return self._families(None)

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            future = asyncio.run_coroutine_threadsafe(self._read(), self._running_loop())
        try:
            reading: _Reading | None = future.result(self._timeout_s)
        except Exception as exc:
            future.cancel()
            logger.warning("metrics: reading the governance store failed (%s)", type(exc).__name__)
            reading = None
        return self._families(reading)

    def close(self) -> None:
        """Close a Redis store's connections (made on this loop) and stop the loop."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        if isinstance(self._store, RedisStore):
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._store.aclose(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        if not thread.is_alive():
            loop.close()

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(
                target=self._loop.run_forever, name="polygate-metrics", daemon=True
            )
            self._thread.start()
        return self._loop

    async def _read(self) -> _Reading:
        if self._store is None:
            self._store = store_from_config(self._config.store, groups_of=self._config)
        store = self._store
        sources = [(terms, await store.snapshot(terms)) for terms in self._terms]
        progress = [
            (scope, await store.progress_age_s(scope)) for scope in sorted(self._config.scopes)
        ]
        parked = await self._read_parked(store) if isinstance(store, RedisStore) else []
        return _Reading(sources, progress, parked)

    async def _read_parked(self, store: RedisStore) -> list[tuple[str, int, int]]:
        """(lot, parked, due now) per parking lot (of `apps`' when named: 0 for one with
        none); due in Redis TIME, as the lot keeps it."""
        lots = await read_lots(store, self._apps)
        has = {lot.app.partition("@")[0] for lot in lots} | {lot.app for lot in lots}
        empty = [(app, 0, 0) for app in self._apps or () if app not in has]
        return [(lot.app, lot.parked, lot.due) for lot in lots] + empty

    def _families(self, reading: _Reading | None) -> list[Metric]:
        def gauge(name: str, doc: str, *labels: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=labels)

        up = gauge("polygate_store_up", "1 if the governance store answered this scrape, else 0")
        up.add_metric([], 0.0 if reading is None else 1.0)
        in_use = gauge("polygate_permits_in_use", "Permits held at a source, fleet-wide", "source")
        limit = gauge(
            "polygate_permit_limit", "Adaptive (AIMD) concurrency limit of a source", "source"
        )
        cap = gauge("polygate_permit_cap", "Configured max_concurrency of a source", "source")
        breaker = gauge(
            "polygate_breaker_state",
            "Circuit breaker of a source: 0 closed, 1 half-open, 2 open",
            "source",
        )
        failures = gauge(
            "polygate_breaker_failures", "Consecutive transient failures of a source", "source"
        )
        paused = gauge(
            "polygate_source_paused_seconds",
            "Seconds until a source's fleet-wide pause ends (0: not paused)",
            "source",
        )
        per_class = "at a source, fleet-wide, by priority class"
        waiting = gauge("polygate_source_waiting", f"Calls awaiting permits {per_class}", *BY_CLASS)
        booked = gauge("polygate_source_booked", f"Quota slots booked ahead {per_class}", *BY_CLASS)
        per_tenant = 'at a source, fleet-wide, by tenant (undeclared ones as "other")'
        tenant_flying = gauge("polygate_tenant_in_flight", f"Calls holding permits {per_tenant}",
                              "source", "tenant")  # fmt: skip
        tenant_waiting = gauge("polygate_tenant_waiting", f"Calls awaiting permits {per_tenant}",
                               "source", "tenant")  # fmt: skip
        progress = gauge(
            "polygate_scope_progress_age_seconds",
            "Seconds since a scope's last success (+Inf: none in the last hour)",
            "scope",
        )
        parked = gauge(
            "polygate_parked_tasks", "Deferred Celery tasks waiting in an app's parking lot", "app"
        )
        due = gauge(
            "polygate_parked_due_tasks",
            "Parked tasks already due (or being released) in an app's parking lot",
            "app",
        )
        for terms, snap in reading.sources if reading else ():
            name = terms.name
            in_use.add_metric([name], snap.permits_in_use)
            limit.add_metric([name], snap.permit_limit)
            cap.add_metric([name], terms.max_concurrency)
            breaker.add_metric([name], BREAKER_STATES.get(snap.breaker, math.nan))
            failures.add_metric([name], snap.breaker_failures)
            paused.add_metric([name], snap.paused_for_s)
            for rank, count in enumerate(snap.waiting):  # ("" where no class is declared)
                waiting.add_metric([name, (*self._config.priorities, "")[rank]], count)
            for rank, count in enumerate(snap.booked):
                booked.add_metric([name, (*self._config.priorities, "")[rank]], count)
            by_tenant: dict[str, tuple[int, int]] = {}
            for t in snap.tenants:
                label = t.tenant if t.tenant in self._config.tenants else OTHER_TENANT
                flying, waits = by_tenant.get(label, (0, 0))
                by_tenant[label] = (flying + t.in_flight, waits + t.waiting)
            for label, (flying, waits) in sorted(by_tenant.items()):
                tenant_flying.add_metric([name, label], flying)
                tenant_waiting.add_metric([name, label], waits)
        for scope, age in reading.progress if reading else ():
            progress.add_metric([scope], age)
        for app, size, ready in reading.parked if reading else ():
            parked.add_metric([app], size)
            due.add_metric([app], ready)
        sources = [up, in_use, limit, cap, breaker, failures, paused, waiting, booked]
        sources += [tenant_flying, tenant_waiting]
        return [*sources, progress, parked, due]


BY_CLASS = ("source", "priority")  # the labels of the gauges by priority class


@dataclass
class Exporter:
    """A running metrics endpoint (see `serve`)."""

    server: WSGIServer
    thread: threading.Thread
    registry: CollectorRegistry
    collector: GovernanceCollector

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
        self.collector.close()


def serve(
    config: GatewayConfig,
    port: int = DEFAULT_PORT,
    addr: str = "0.0.0.0",
    *,
    apps: Sequence[str] | None = None,
) -> Exporter:
    """Serve ``/metrics`` on `port` from a daemon thread: counters plus the store's gauges.

    With ``PROMETHEUS_MULTIPROC_DIR`` set, the counters are the sum of every
    process that wrote to that directory (run this on the workers' host, with
    the same directory); without it, they are this process's own (an
    in-process exporter, e.g. beside a solo-pool worker). Port 0 picks a free one.
    """
    if not config.store.shared:
        logger.warning("metrics: no Redis store; the gauges show this process's memory store")
    registry = CollectorRegistry()
    if os.environ.get(MULTIPROC_ENV):
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    else:
        registry.register(REGISTRY)
    collector = GovernanceCollector(config, apps=apps)
    registry.register(collector)
    server, thread = start_http_server(port, addr, registry=registry)
    return Exporter(server, thread, registry, collector)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m polygate_celery.metrics``: ``polygate-celery metrics`` under its module
    name (its ``--help`` says what is exported and how to use it with several processes)."""
    from polygate_celery.cli import metrics as command  # noqa: PLC0415
    from polygate_celery.cli import run_command  # noqa: PLC0415
    from polygate_celery.cli.errors import ArgumentParser  # noqa: PLC0415

    parser = ArgumentParser(
        prog="python -m polygate_celery.metrics",
        description=command.DESCRIPTION,
        epilog=command.EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    command.add_arguments(parser)
    parser.set_defaults(program=parser.prog)
    return run_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
