"""Celery edge: the priority class and the tenant of a governed task's calls (SPEC §8).

A task's calls are in the class its ``@governed(priority=...)`` names, unless its
message's header ``polygate_priority`` names another for that one message; their
tenant is the value of the body's argument that ``tenant_arg`` names, else the
message's header ``polygate_tenant``, else none. A call's own ``priority=`` and
``tenant=`` override both. They are read once per run, before the body runs, and
checked against the configuration: an undeclared class or a malformed tenant
fails the task (FAILURE, a `ConfigError` naming the task and where the value came
from), never defers it. A deferral republishes the message's headers and
arguments, so the class and tenant hold in every later run.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from celery import Celery, Task

from polygate_celery.celery.registry import governed_priorities
from polygate_celery.config.gateway import GatewayConfig
from polygate_celery.errors import ConfigError

PRIORITY_HEADER = "polygate_priority"
TENANT_HEADER = "polygate_tenant"
_PASSED_AS_A_WHOLE = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


@dataclass(frozen=True, slots=True)
class RunStanding:
    """The class (None: the configuration's default) and the tenant (None: none) of a
    run's calls, unless a call names its own."""

    priority: str | None = None
    tenant: str | None = None


NAMED_NONE = RunStanding()


class TenantArgument:
    """Where a task body's tenant is among its arguments: found once, when `@governed`
    decorates. `parameters` are the body's as Celery calls it (``self`` first when bound,
    without the handle); those before `first` (``self``) are not the task's arguments.

    Raises:
        TypeError: The body has no such parameter (``*args`` and ``**kwargs`` do not count).
    """

    def __init__(
        self, parameters: Sequence[inspect.Parameter], first: int, name: str, owner: str
    ) -> None:
        found = [
            (position, parameter)
            for position, parameter in enumerate(parameters)
            if position >= first and parameter.name == name
        ]
        if not found or found[0][1].kind in _PASSED_AS_A_WHOLE:
            raise TypeError(f"@governed(tenant_arg={name!r}): {owner} has no parameter {name!r}")
        position, parameter = found[0]
        self.name = name
        keyword_only = parameter.kind is inspect.Parameter.KEYWORD_ONLY
        self.position: int | None = None if keyword_only else position
        empty = parameter.default is inspect.Parameter.empty
        self.default: Any = None if empty else parameter.default

    def value(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """The argument's value in a call of the body (its default when not given)."""
        if self.name in kwargs:
            return kwargs[self.name]
        if self.position is not None and self.position < len(args):
            return args[self.position]
        return self.default


def run_standing(
    task: Task[Any, Any],
    config: GatewayConfig,
    priority: str | None,
    tenant_arg: TenantArgument | None,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> RunStanding:
    """The class and tenant of this run's calls: `priority` (the decorator's) unless the
    message's `PRIORITY_HEADER` names one; the `tenant_arg` argument's value unless it is
    None, else the message's `TENANT_HEADER`. An integer tenant (a customer id) is taken
    as its digits.

    Raises:
        ConfigError: The class is not declared, or the tenant is not a tenant (1 to 64
            letters, digits or ``_ . : @ -``): the message names the task and where the
            value came from.
    """
    headers = task.request.headers or {}
    named: Any = priority
    class_from = "@governed(priority=...)"
    if headers.get(PRIORITY_HEADER) is not None:
        named, class_from = headers[PRIORITY_HEADER], f"header {PRIORITY_HEADER}"
    tenant: Any = None
    tenant_from = ""
    if tenant_arg is not None:
        tenant, tenant_from = tenant_arg.value(args, kwargs), f"argument {tenant_arg.name!r}"
    if tenant is None and headers.get(TENANT_HEADER) is not None:
        tenant, tenant_from = headers[TENANT_HEADER], f"header {TENANT_HEADER}"
    if named is None and tenant is None:
        return NAMED_NONE
    if isinstance(tenant, int) and not isinstance(tenant, bool):
        tenant = str(tenant)
    try:
        if named is not None and not isinstance(named, str):
            raise ConfigError("priority", "a priority class is named by a string")
        config.standing(named, tenant)
    except ConfigError as exc:
        where = class_from if exc.field == "priority" else tenant_from
        raise ConfigError(exc.field, f"task {task.name!r}, {where}: {exc.message}") from exc
    return RunStanding(named, tenant)


def check_task_classes(app: Celery, config: GatewayConfig) -> None:
    """Refuse a governed task of `app` whose ``@governed(priority=...)`` names a class
    `config` does not declare (each of its runs would fail). The tasks are those the app
    has: all of them once it is finalized (the worker finalizes it as it starts; it is not
    finalized here, which would evaluate its tasks early). The worker's start checks them
    all again (`unknown_classes`, logged).

    Raises:
        ConfigError: ``priority``, naming the first such task and its class.
    """
    if not getattr(app, "finalized", False):
        return
    problems = unknown_classes(governed_priorities(app), config)
    if problems:
        raise ConfigError("priority", problems[0], [("priority", p) for p in problems])


def unknown_classes(priorities: Mapping[str, str], config: GatewayConfig) -> list[str]:
    """A line for each task (name -> the class its decorator names) whose class `config`
    does not declare."""
    declared = ", ".join(config.priorities) or "none: [priorities] declares no class"
    return [
        f"task {name!r} is @governed(priority={priority!r}), a class the configuration "
        f"does not declare (classes: {declared}): fix the name, or add [priorities.{priority}]"
        for name, priority in sorted(priorities.items())
        if priority not in config.priorities
    ]
