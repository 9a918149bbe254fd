"""Edge (CLI): `polygate-celery check-config FILE`, the configuration as workers will see it.

Validates the file (with ``POLYGATE_*`` environment variables on top, as
`load_config` reads it), prints every scope and source with its settings
resolved (defaults merged, derived values computed, secrets redacted), the
settings `configure_worker` would apply (for the broker given, else
``$CELERY_BROKER_URL``, else the store's Redis URL, else Celery's ``amqp://``; the
output says which), and the warnings with their reasons. Connects nowhere.
"""

from __future__ import annotations

import argparse
import json
import os
import textwrap
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, SecretStr

from polygate_celery.cli.config_warnings import Advice, config_warnings
from polygate_celery.cli.context import (
    DEFAULT_CONFIG_FILE,
    config_error,
    config_file,
    no_configuration,
)
from polygate_celery.cli.errors import Commands, positive_int
from polygate_celery.cli.redaction import MASK, redact_url
from polygate_celery.config.gateway import GatewayConfig
from polygate_celery.config.loading import CONFIG_PATH_ENV, load_config
from polygate_celery.config.urls import check_broker_url
from polygate_celery.core.policy import policy_for
from polygate_celery.errors import ConfigError

Entry = tuple[str, Any, str]  # key, value (None: unset), comment
BROKER_ENV = "CELERY_BROKER_URL"
AMQP_DEFAULT = "amqp://"
NOT_GIVEN = f"neither --broker nor ${BROKER_ENV} is given"
STORE_BROKER = f"assumed: the store's store.redis_url, as {NOT_GIVEN}"
DEFAULT_BROKER = f"assumed: Celery's default, as {NOT_GIVEN} and the store has no redis_url"
UNUSABLE_STORE_BROKER = (
    f"assumed: Celery's default, as {NOT_GIVEN} and kombu cannot take store.redis_url for a broker"
)


def add_command(commands: Commands) -> None:
    parser = commands.add_parser(
        "check-config", help="validate a configuration and show what it resolves to"
    )
    parser.add_argument(
        "file",
        metavar="FILE",
        nargs="?",
        help=f"the TOML configuration file (default: ${CONFIG_PATH_ENV}, "
        f"else ./{DEFAULT_CONFIG_FILE})",
    )
    parser.add_argument(
        "--calls-per-task",
        type=positive_int,
        default=1,
        metavar="N",
        help="governed calls one task makes, for the time limits (default 1)",
    )
    parser.add_argument(
        "--broker",
        metavar="URL",
        help="the workers' Celery broker (default: $CELERY_BROKER_URL, else the store's "
        "store.redis_url, else Celery's amqp://)",
    )
    parser.add_argument(
        "--consumer-timeout-s",
        type=float,
        default=1800.0,
        metavar="S",
        help="RabbitMQ's consumer_timeout for the workers' queues, in s (default 1800)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    path = config_file(args.file)
    if not path:
        raise no_configuration("FILE")
    try:
        config = load_config(path)
        worker = worker_text(config, args)
    except ConfigError as exc:
        raise config_error(exc) from None
    print(f"# {path}: valid. The effective configuration (the file, then POLYGATE_*")
    print("# environment variables; defaults merged; secrets redacted):\n")
    print(effective_configuration(config))
    print()
    print(worker)
    print()
    print(warnings_text(config_warnings(config)))
    return 0


def worker_text(config: GatewayConfig, args: argparse.Namespace) -> str:
    """The worker section for the broker `assumed_broker` finds. A store URL kombu would not
    take for a broker (one only the store reads, e.g. with ``?password=``) is no mistake of
    the user's: the section is then computed for Celery's default, and says so."""
    broker, origin = assumed_broker(config, args.broker)
    calls, consumer_timeout_s = args.calls_per_task, args.consumer_timeout_s
    try:
        check_broker(broker)
        return worker_section(config, calls, broker, consumer_timeout_s, broker_origin=origin)
    except ConfigError as exc:
        if exc.field != "broker_url" or origin != STORE_BROKER:
            raise
    return worker_section(
        config, calls, AMQP_DEFAULT, consumer_timeout_s, broker_origin=UNUSABLE_STORE_BROKER
    )


def assumed_broker(config: GatewayConfig, given: str | None) -> tuple[str, str]:
    """The broker the worker settings are computed for, and where it came from: `given`
    (``--broker``), else ``$CELERY_BROKER_URL``, else the store's Redis URL (a fleet often
    uses one Redis for both), else Celery's default, ``amqp://``."""
    if given:
        return given, "--broker"
    if os.environ.get(BROKER_ENV):
        return os.environ[BROKER_ENV], f"${BROKER_ENV}"
    if config.store.redis_url is not None:
        return config.store.redis_url.get_secret_value(), STORE_BROKER
    return AMQP_DEFAULT, DEFAULT_BROKER


def check_broker(url: str | None) -> None:
    """Refuse (`ConfigError`, quoting no part of it) a broker URL that does not parse as
    written, before anything is printed."""
    if url:
        try:
            check_broker_url(url)
        except ValueError as exc:
            raise ConfigError("broker_url", str(exc)) from None


def effective_configuration(config: GatewayConfig) -> str:
    url = config.store.redis_url
    sections = [
        _section(None, [("include_bodies", config.include_bodies, "")]),
        _section(
            "store",
            _entries(
                config.store,
                {
                    "redis_url": (
                        redact_url(url.get_secret_value()) if url else None,
                        "" if url or config.store.shared else "in-memory store: one process only",
                    )
                },
            ),
        ),
        _section("deferral", _entries(config.deferral)),
    ]
    for name, source in config.sources.items():
        resolved: dict[str, tuple[Any, str]] = {
            "stream": (source.ttft_timeout_s is not None, "unset: streams when ttft_timeout_s is"),
            "aimd.initial_limit": (source.max_concurrency, "unset: the cap"),
        }
        if source.quota is not None:
            shared = config.quotas[source.quota]
            limits = ", ".join(
                f"{k} {v}" for k, v in (("rpm", shared.rpm), ("tpm", shared.tpm)) if v
            )
            if shared.rpm:
                limits += {
                    "sliding": " (rpm in a sliding window)",
                    "bucket": " (rpm as a bucket)",
                    None: " (rpm as a bucket, or the provider's windows when it shows them)",
                }[shared.rpm_window]
            notes = {"quota": f"shared: {limits or 'no limit'}"}
        else:
            notes = {}
        sections.append(_section(f"sources.{name}", _entries(source, resolved, notes)))
    for name, quota in config.quotas.items():
        sections.append(_section(f"quotas.{name}", _entries(quota)))
    governed = config.for_governed_tasks()
    for name, scope in config.scopes.items():
        default_exempt = policy_for(scope.kind).rate_limit_exempt
        resolved = {
            "max_call_s": (
                config.max_call_s(name),
                "derived: max_attempts x largest timeout_s + 2 x stall_window_s",
            ),
            "rate_limit_exempt": (default_exempt, f"the default for {scope.kind}"),
        }
        notes = {}
        task_window = governed.scopes[name].stall_window_s
        if task_window != scope.stall_window_s:
            notes["stall_window_s"] = (
                f"unset: a direct Gateway call's; governed tasks use {task_window:g} s "
                f"(max_call_s {governed.max_call_s(name):g} s)"
            )
        sections.append(_section(f"scopes.{name}", _entries(scope, resolved, notes)))
    return "\n\n".join(s for s in sections if s)


def worker_section(
    config: GatewayConfig,
    calls_per_task: int,
    broker: str | None = None,
    consumer_timeout_s: float = 1800.0,
    *,
    broker_origin: str = "",
) -> str:
    """What `configure_worker` applies, computed on a throwaway Celery app for `broker`
    (no connection); `broker_origin` says where that broker came from. Raises
    `ConfigError` for settings `configure_worker` would refuse."""
    try:
        from celery import Celery  # noqa: PLC0415 - the celery extra is optional here

        from polygate_celery.celery.worker import (  # noqa: PLC0415
            governed_time_limits,
            worker_settings,
        )
    except ImportError:
        return "# worker settings: not computed (pip install 'polygate_celery[celery]')"
    app = Celery("polygate-check-config", set_as_current=False, broker=broker)
    settings = worker_settings(
        app, config, calls_per_task=calls_per_task, consumer_timeout_s=consumer_timeout_s
    )
    soft, hard = governed_time_limits(app, config, calls_per_task)
    entries = [(key, value, "") for key, value in settings.items()]
    entries += [
        ("governed tasks' soft_time_limit", soft, "each governed task without its own"),
        ("governed tasks' time_limit", hard, "other tasks keep Celery's (none by default)"),
    ]
    url = app.conf.broker_url or AMQP_DEFAULT
    note = f"what configure_worker(app, config, calls_per_task={calls_per_task}) sets"
    note += f" for broker {url if url == AMQP_DEFAULT else redact_url(url)}"
    if broker_origin:
        note += f" ({broker_origin})"
    return _section("worker", entries, note)


def warnings_text(advice: list[Advice]) -> str:
    if not advice:
        return "no warnings"
    lines = [f"{len(advice)} warning{'s' if len(advice) > 1 else ''}:"]
    for item in advice:
        lines.append(f"- {item.what}")
        lines += textwrap.wrap(item.why, 88, initial_indent="    ", subsequent_indent="    ")
    return "\n".join(lines)


def _entries(
    model: BaseModel,
    resolved: Mapping[str, tuple[Any, str]] | None = None,
    notes: Mapping[str, str] | None = None,
    prefix: str = "",
) -> list[Entry]:
    """`model`'s fields as dotted keys; an unset (or secret) field `resolved` names shows its value.

    Any other secret shows as ``***``: a secret field added later is redacted too.
    `notes` comment on fields that are set.
    """
    resolved, notes = resolved or {}, notes or {}
    entries: list[Entry] = []
    for field in type(model).model_fields:
        key, value = f"{prefix}{field}", getattr(model, field)
        if isinstance(value, BaseModel):
            entries += _entries(value, resolved, notes, f"{key}.")
        elif key in resolved and (value is None or isinstance(value, SecretStr)):
            entries.append((key, *resolved[key]))
        elif isinstance(value, SecretStr):
            entries.append((key, MASK, "redacted"))
        else:
            entries.append((key, value, notes.get(key, "") if value is not None else ""))
    return entries


def _section(title: str | None, entries: list[Entry], note: str = "") -> str:
    shown = [(key if value is not None else f"# {key}", value, c) for key, value, c in entries]
    width = max((len(key) for key, _, _ in shown), default=0)
    lines = [f"[{title}]" + (f"  # {note}" if note else "")] if title else []
    for key, value, comment in shown:
        text = "(unset)" if value is None else _value(value)
        lines.append(f"{key.ljust(width)} = {text}" + (f"  # {comment}" if comment else ""))
    return "\n".join(lines)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{k} = {_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return json.dumps(str(value))
