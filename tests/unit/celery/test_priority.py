"""A governed task's priority class and tenant: from its decorator, its argument and its
message's headers, a call's own over them all; checked once per run, and a class or
tenant the configuration refuses fails the task (never retried nor deferred)."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from celery import Celery

from polygate_celery import ConfigError, parse_config
from polygate_celery.celery import AsyncGovernedCalls, GovernedCalls, configure_worker, governed
from polygate_celery.celery.priority import PRIORITY_HEADER, TENANT_HEADER
from polygate_celery.celery.runtime import forget_config
from polygate_celery.celery.task import check_governed_tasks
from polygate_celery.telemetry import CallEvent, VerdictEvent
from polygate_celery.testing import ScriptedSource, VirtualClock, steps
from polygate_celery.testing.celery import governed_tasks
from tests.conftest import Recorder

CONFIG = parse_config(
    {
        "sources": {"vllm": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}},
        "scopes": {
            "chat": {"kind": "chat", "sources": ["vllm"]},
            "vectors": {"kind": "embedding", "sources": ["vllm"]},
        },
        "priorities": {"interactive": {}, "batch": {"min_share": 0.1, "default": True}},
        "tenants": {"acme": {"weight": 5}},
    }
)
HELLO = [{"role": "user", "content": "hello"}]
_apps = itertools.count()


def new_app() -> Celery:
    """An app of the test's own; its tasks are not shared with other apps (shared=False)."""
    return Celery(f"priority-{next(_apps)}", set_as_current=False)


@contextmanager
def eager(app: Celery, clock: VirtualClock, recorder: Recorder) -> Iterator[None]:
    """`app`'s governed tasks run here, eagerly, in virtual time, their events recorded."""
    source = ScriptedSource.always(clock, steps.chat("fine"))
    with governed_tasks(app, CONFIG, {"vllm": source}, clock=clock, hooks=[recorder]):
        yield


def standings(recorder: Recorder) -> list[tuple[str | None, str | None]]:
    """(class, tenant) of each call made, in order."""
    return [(e.priority, e.tenant) for e in recorder.of(CallEvent)]


@pytest.fixture
def app() -> Celery:
    return new_app()


def test_the_decorator_names_the_class_and_a_header_overrides_it_for_its_message(
    app: Celery, clock: VirtualClock, recorder: Recorder
) -> None:
    @app.task(name="summarise", shared=False)
    @governed("chat", priority="batch")
    def summarise(calls: GovernedCalls) -> str:
        return str(calls.chat(HELLO).value.text)

    with eager(app, clock, recorder):
        assert summarise.delay().get() == "fine"
        summarise.apply_async(headers={PRIORITY_HEADER: "interactive"}).get()
    assert standings(recorder) == [("batch", None), ("interactive", None)]


def test_without_a_class_the_calls_are_in_the_default_one(
    app: Celery, clock: VirtualClock, recorder: Recorder
) -> None:
    @app.task(name="plain", shared=False)
    @governed("chat")
    def plain(calls: GovernedCalls) -> None:
        calls.chat(HELLO)

    with eager(app, clock, recorder):
        plain.delay().get()
    assert standings(recorder) == [("batch", None)]  # the class marked default
    (verdict,) = recorder.of(VerdictEvent)
    assert (verdict.priority, verdict.tenant) == ("batch", None)


def test_the_tenant_argument_by_position_keyword_or_default_then_the_header(
    app: Celery, clock: VirtualClock, recorder: Recorder
) -> None:
    @app.task(name="for_customer", shared=False, bind=True)
    @governed("chat", tenant_arg="customer")
    def for_customer(self: Any, calls: GovernedCalls, doc: str, customer: Any = None) -> str:
        return str(calls.chat(HELLO).value.text)

    with eager(app, clock, recorder):
        for_customer.delay("d", "acme").get()  # by position (after self)
        for_customer.delay("d", customer="customer-7").get()  # by keyword
        for_customer.delay("d", 1042).get()  # an integer id: its digits
        for_customer.apply_async(("d",), headers={TENANT_HEADER: "from-header"}).get()  # None
        for_customer.delay("d").get()  # neither: no tenant
        for_customer.apply_async(("d", "acme"), headers={TENANT_HEADER: "other"}).get()
    assert standings(recorder) == [
        ("batch", "acme"),
        ("batch", "customer-7"),
        ("batch", "1042"),
        ("batch", "from-header"),
        ("batch", None),
        ("batch", "acme"),  # the argument wins over the header
    ]


def test_a_keyword_only_tenant_argument_and_the_header_without_one(
    app: Celery, clock: VirtualClock, recorder: Recorder
) -> None:
    @app.task(name="keyed", shared=False)
    @governed("chat", tenant_arg="tenant")
    def keyed(calls: GovernedCalls, *, tenant: str = "default-co") -> None:
        calls.chat(HELLO)

    @app.task(name="headed", shared=False)
    @governed("chat")
    def headed(calls: GovernedCalls) -> None:
        calls.chat(HELLO)

    with eager(app, clock, recorder):
        keyed.delay().get()
        keyed.delay(tenant="acme").get()
        headed.apply_async(headers={TENANT_HEADER: "acme", PRIORITY_HEADER: "interactive"}).get()
    assert standings(recorder) == [
        ("batch", "default-co"),
        ("batch", "acme"),
        ("interactive", "acme"),
    ]


def test_a_call_s_own_class_and_tenant_win_over_the_task_s(
    app: Celery, clock: VirtualClock, recorder: Recorder
) -> None:
    @app.task(name="mixed", shared=False)
    @governed("chat", priority="batch", tenant_arg="customer")
    def mixed(calls: GovernedCalls, customer: str) -> None:
        calls.chat(HELLO)
        calls.chat(HELLO, priority="interactive")
        calls.chat(HELLO, tenant="acme")
        calls.embed("text", scope="vectors", priority="interactive", tenant="acme")
        calls.call({"messages": HELLO}, tenant="someone-else")

    @app.task(name="mixed_async", shared=False)
    @governed("chat", tenant_arg="customer")
    async def mixed_async(calls: AsyncGovernedCalls, customer: str) -> None:
        await calls.chat(HELLO)
        await calls.chat(HELLO, priority="interactive", tenant="acme")

    with eager(app, clock, recorder):
        mixed.apply_async(("customer-1",), headers={PRIORITY_HEADER: "interactive"}).get()
        mixed_async.delay("customer-2").get()
    assert standings(recorder) == [
        ("interactive", "customer-1"),  # the header's class, the argument's tenant
        ("interactive", "customer-1"),
        ("interactive", "acme"),
        ("interactive", "acme"),
        ("interactive", "someone-else"),
        ("batch", "customer-2"),
        ("interactive", "acme"),
    ]


@pytest.mark.parametrize(
    ("headers", "args", "field", "where"),
    [
        ({PRIORITY_HEADER: "urgent"}, ("acme",), "priority", f"header {PRIORITY_HEADER}"),
        ({PRIORITY_HEADER: 3}, ("acme",), "priority", f"header {PRIORITY_HEADER}"),
        ({}, ("not a tenant!",), "tenant", "argument 'customer'"),
        ({TENANT_HEADER: "x" * 65}, (None,), "tenant", f"header {TENANT_HEADER}"),
        ({TENANT_HEADER: ["acme"]}, (None,), "tenant", f"header {TENANT_HEADER}"),
    ],
)
def test_a_class_or_tenant_the_configuration_refuses_fails_the_task_before_its_body(
    app: Celery,
    clock: VirtualClock,
    recorder: Recorder,
    headers: dict[str, Any],
    args: tuple[Any, ...],
    field: str,
    where: str,
) -> None:
    ran = []

    # autoretry_for=(Exception,) would retry it forever (max_retries=None): it is not retried.
    @app.task(name="refused", shared=False, autoretry_for=(Exception,), max_retries=None)
    @governed("chat", tenant_arg="customer")
    def refused(calls: GovernedCalls, customer: str | None) -> None:
        ran.append(customer)
        calls.chat(HELLO)

    with eager(app, clock, recorder), pytest.raises(ConfigError) as raised:
        refused.apply_async(args, headers=headers).get()
    assert raised.value.field == field
    assert f"task 'refused', {where}: " in str(raised.value)
    assert ran == []  # the body never started
    assert recorder.events == []  # no call was made


def test_a_call_s_own_undeclared_class_fails_the_task_without_a_retry(
    app: Celery, clock: VirtualClock, recorder: Recorder
) -> None:
    runs = []

    @app.task(name="typo", shared=False, autoretry_for=(Exception,), max_retries=None)
    @governed("chat")
    def typo(calls: GovernedCalls) -> None:
        runs.append(1)
        calls.chat(HELLO, priority="interactve")

    with eager(app, clock, recorder), pytest.raises(ConfigError, match="interactve"):
        typo.delay().get()
    assert runs == [1]


def test_a_tenant_argument_that_is_no_parameter_is_refused_when_decorating(app: Celery) -> None:
    with pytest.raises(TypeError, match=r"tenant_arg='customer'.*has no parameter 'customer'"):

        @app.task(name="no_such", shared=False)
        @governed("chat", tenant_arg="customer")
        def no_such(calls: GovernedCalls, client: str) -> None:  # pragma: no cover
            pass

    for name in ("calls", "rest", "options"):  # the handle, *args, **kwargs
        with pytest.raises(TypeError, match="has no parameter"):

            @governed("chat", tenant_arg=name)
            def loose(calls: GovernedCalls, *rest: Any, **options: Any) -> None:  # pragma: no cover
                pass


def test_configure_worker_refuses_a_task_whose_class_is_not_declared(app: Celery) -> None:
    @app.task(name="typo_class", shared=False)
    @governed("chat", priority="bulk")
    def typo_class(calls: GovernedCalls) -> None:  # pragma: no cover
        pass

    @app.task(name="fine_class", shared=False)
    @governed("chat", priority="batch")
    def fine_class(calls: GovernedCalls) -> None:  # pragma: no cover
        pass

    app.finalize()  # the app's tasks are known (a worker finalizes it as it starts)
    with pytest.raises(ConfigError) as raised:
        configure_worker(app, CONFIG)
    assert raised.value.field == "priority"
    assert raised.value.message == (
        "task 'typo_class' is @governed(priority='bulk'), a class the configuration does not "
        "declare (classes: interactive, batch): fix the name, or add [priorities.bulk]"
    )
    forget_config(app)


def test_a_declared_class_passes_and_an_unfinalized_app_is_checked_at_worker_start(
    app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    @app.task(name="later", shared=False)
    @governed("chat", priority="bulk")
    def later(calls: GovernedCalls) -> None:  # pragma: no cover
        pass

    configure_worker(app, CONFIG)  # its tasks are not evaluated yet: not finalized here
    assert not app.finalized
    with caplog.at_level(logging.ERROR, "polygate_celery"):
        problems = check_governed_tasks(app)  # at worker start
    assert problems == [
        "task 'later' is @governed(priority='bulk'), a class the configuration does not "
        "declare (classes: interactive, batch): fix the name, or add [priorities.bulk]"
    ]
    assert problems == caplog.messages
    forget_config(app)

    declared = new_app()

    @declared.task(name="declared", shared=False)
    @governed("chat", priority="interactive")
    def in_class(calls: GovernedCalls) -> None:  # pragma: no cover
        pass

    declared.finalize()
    configure_worker(declared, CONFIG)
    assert check_governed_tasks(declared) == []
    forget_config(declared)


def test_without_classes_declared_a_decorator_class_is_refused(app: Celery) -> None:
    @app.task(name="classy", shared=False)
    @governed("chat", priority="batch")
    def classy(calls: GovernedCalls) -> None:  # pragma: no cover
        pass

    plain = parse_config(
        {
            "sources": {"vllm": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}},
            "scopes": {"chat": {"kind": "chat", "sources": ["vllm"]}},
        }
    )
    app.finalize()
    with pytest.raises(ConfigError, match=r"classes: none: \[priorities\] declares no class"):
        configure_worker(app, plain)
    forget_config(app)
