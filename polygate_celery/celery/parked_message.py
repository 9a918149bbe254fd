"""Celery edge: a parked entry is checked as Celery's worker would read it, before release.

A parked entry is read back from Redis, where anything may have written it. Published
as it is, a body that is not Celery's shape makes the worker that receives it crash
(``Unrecoverable error``: the consumer unpacks the body outside the handlers that reject
invalid tasks), and every worker that takes it after a restart crashes again; a
serializer or compression kombu does not know, or an exchange of the wrong type, makes
the publish raise, every time; one to an exchange no queue is bound to is refused by
RabbitMQ and dropped by kombu's Redis transport. So an entry is checked as Celery's
worker would read it, and its route as the broker would take it, before it is
published: what fails goes to the dead letters, never to the broker. A publish that
fails anyway is told apart: the entry's own fault (it would fail again), or the
broker's (it may go out later). Nothing here logs or returns
any part of the body, headers or properties (they may hold task arguments): a reason
names the field and the expected type only.
"""

from __future__ import annotations

import contextlib
from datetime import datetime
from typing import Any

from celery import Celery
from kombu import compression
from kombu.exceptions import (
    ContentDisallowed,
    EncodeError,
    MessageStateError,
    OperationalError,
    SerializerNotInstalled,
)

# What a message keeps of Celery's publish arguments (the rest is per-publish plumbing).
PUBLISH_FIELDS = (
    "exchange",
    "routing_key",
    "serializer",
    "compression",
    "delivery_mode",
    "headers",
)
# The fields `publish_message` reads from an entry.
MESSAGE_FIELDS = ("body", *PUBLISH_FIELDS, "properties")
# Keyword arguments of kombu's `Producer.publish` that a message's properties must not
# repeat (a second value is a TypeError at publish) or set (a content type of its own
# would publish the body unserialized).
_RESERVED_PROPERTIES = frozenset(
    {
        *MESSAGE_FIELDS,
        "content_type",
        "content_encoding",
        "retry",
        "retry_policy",
        "declare",
        "timeout",
        "confirm_timeout",
    }
)
_PROPERTY_TYPES: dict[str, tuple[type, ...]] = {
    "correlation_id": (str,),
    "reply_to": (str,),
    "priority": (int,),
    "expiration": (int, float, str),
    "mandatory": (bool,),
    "immediate": (bool,),
    "message_id": (str,),
    "type": (str,),
    "user_id": (str,),
    "app_id": (str,),
    "timestamp": (int, float),
}
_EMBED_TYPES: dict[str, type] = {
    "callbacks": list,
    "errbacks": list,
    "chain": list,
    "chord": dict,
}
_ID_HEADERS = ("root_id", "parent_id", "group", "shadow", "argsrepr", "kwargsrepr", "origin")


def _type(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _is(value: Any, *types: type) -> bool:
    """`isinstance`, but a bool is not a number here (JSON tells them apart)."""
    if isinstance(value, bool):
        return bool in types
    return isinstance(value, types)


def malformed(message: Any) -> str | None:
    """Why `message` (a parked entry, decoded from JSON) is not a task message a Celery
    worker can take, or None."""
    if not isinstance(message, dict):
        return f"not a message object: {_type(message)}"
    missing = [name for name in MESSAGE_FIELDS if name not in message]
    if missing:
        return "missing " + ", ".join(missing)
    for check in (_publish_fields, _properties, _headers, _body):
        why = check(message)
        if why is not None:
            return why
    return None


def _publish_fields(message: dict[str, Any]) -> str | None:
    if message["serializer"] != "json":
        return "serializer must be json (a task message here is JSON only)"
    name = message["compression"]
    if name is not None:
        if not isinstance(name, str):
            return f"compression must be a string or null, not {_type(name)}"
        try:
            compression.get_encoder(name)
        except KeyError:
            return "compression is not one kombu knows"
    for field in ("exchange", "routing_key"):
        if not isinstance(message[field], str):
            return f"{field} must be a string, not {_type(message[field])}"
    mode = message["delivery_mode"]
    if _is(mode, bool) or (mode is not None and mode not in (1, 2, "transient", "persistent")):
        return "delivery_mode must be 1, 2, transient, persistent or null"
    return None


def _properties(message: dict[str, Any]) -> str | None:
    properties = message["properties"]
    if not isinstance(properties, dict):
        return f"properties must be an object, not {_type(properties)}"
    for name, value in properties.items():
        if name in _RESERVED_PROPERTIES:
            return f"properties may not set {name}"
        types = _PROPERTY_TYPES.get(name, (str, int, float, bool))  # others: kept as they are
        if value is not None and not _is(value, *types):
            expected = " or ".join(kind.__name__ for kind in types)
            return f"properties.{name} must be {expected} or null, not {_type(value)}"
    priority = properties.get("priority")
    if priority is not None and not 0 <= priority <= 255:
        return "properties.priority must be 0..255"
    return None


def _headers(message: dict[str, Any]) -> str | None:
    headers = message["headers"]
    if not isinstance(headers, dict):
        return f"headers must be an object, not {_type(headers)}"
    if "task" not in headers:  # protocol 1: the body says it all
        return None
    for name in ("task", "id"):
        if not isinstance(headers.get(name), str) or not headers[name]:
            return f"headers.{name} must be a non-empty string"
    for name in _ID_HEADERS:
        if headers.get(name) is not None and not isinstance(headers[name], str):
            return f"headers.{name} must be a string or null, not {_type(headers[name])}"
    for name in ("eta", "expires"):
        if headers.get(name) is not None and not _iso_time(headers[name]):
            return f"headers.{name} must be an ISO 8601 time or null"
    retries = headers.get("retries", 0)
    if not _is(retries, int):
        return f"headers.retries must be an integer, not {_type(retries)}"
    timelimit = headers.get("timelimit")
    if timelimit is not None and not (
        isinstance(timelimit, list)
        and len(timelimit) == 2
        and all(limit is None or _is(limit, int, float) for limit in timelimit)
    ):
        return "headers.timelimit must be [soft, hard] (numbers or null) or null"
    return None


def _iso_time(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    with contextlib.suppress(ValueError):
        datetime.fromisoformat(value)
        return True
    return False


def _body(message: dict[str, Any]) -> str | None:
    body = message["body"]
    if "task" in message["headers"]:  # protocol 2: [args, kwargs, embed]
        if not isinstance(body, list) or len(body) != 3:
            return f"body must be [args, kwargs, embed] (protocol 2), not {_type(body)}"
        args, kwargs, embed = body
        return _arguments(args, kwargs) or _embed(embed)
    if not isinstance(body, dict):  # protocol 1: the task message is the body
        return f"body must be an object (protocol 1), not {_type(body)}"
    for name in ("task", "id"):
        if not isinstance(body.get(name), str) or not body[name]:
            return f"body.{name} must be a non-empty string (protocol 1)"
    return _arguments(body.get("args", []), body.get("kwargs", {}))


def _arguments(args: Any, kwargs: Any) -> str | None:
    if not isinstance(args, list):
        return f"the task's args must be a list, not {_type(args)}"
    if not isinstance(kwargs, dict):
        return f"the task's kwargs must be an object, not {_type(kwargs)}"
    return None


def _embed(embed: Any) -> str | None:
    if embed is None:
        return None
    if not isinstance(embed, dict):
        return f"the body's embed must be an object or null, not {_type(embed)}"
    for name, kind in _EMBED_TYPES.items():
        value = embed.get(name)
        if value is None:
            continue
        if not isinstance(value, kind):
            return f"embed.{name} must be {kind.__name__} or null, not {_type(value)}"
        if isinstance(value, list) and not all(isinstance(item, dict) for item in value):
            return f"embed.{name} must hold signatures (objects)"
    return None


# Publish errors that are the message's own: publishing it again fails the same way.
ENTRY_ERRORS: tuple[type[BaseException], ...] = (
    EncodeError,
    SerializerNotInstalled,
    ContentDisallowed,
    MessageStateError,
    TypeError,
    ValueError,
    KeyError,
    AttributeError,
    UnicodeError,
)


# RabbitMQ's channel errors that are the message's: no such exchange, content too large
# (kombu may wrap the second in an OperationalError: its cause keeps the code).
_ENTRY_CODES = frozenset({404, 311})


def entry_error(exc: BaseException) -> bool:
    """Whether a publish failed for the message's own fault (it would fail again)."""
    if isinstance(exc, ENTRY_ERRORS):
        return True
    return any(getattr(e, "code", None) in _ENTRY_CODES for e in (exc, exc.__cause__))


def no_route(app: Celery, exchange: str, routing_key: str) -> str | None:
    """Why the broker would take no message to `exchange` with `routing_key`, where it
    can tell; else None. The default exchange ("") takes every message.

    RabbitMQ refuses a publish to an exchange that does not exist (404, closing the
    channel); kombu's Redis transport drops one that no queue's binding matches, silently.
    Only an answer is a verdict: a broker that cannot be asked is not the entry's fault.
    """
    if not exchange:
        return None
    with app.connection_for_write() as connection:
        try:
            connection.connect()  # once: a broker that does not answer is no verdict
            return _route_missing(connection, exchange, routing_key)
        except connection.connection_errors as exc:
            raise OperationalError(f"{type(exc).__name__}: {exc}") from exc


def _route_missing(connection: Any, exchange: str, routing_key: str) -> str | None:
    channel = connection.channel()
    if connection.transport.driver_type == "amqp":
        try:
            channel.exchange_declare(exchange=exchange, type="direct", passive=True)
        except Exception as exc:  # 404 NOT_FOUND is a channel error (its code says)
            if getattr(exc, "code", None) == 404:
                return "the exchange does not exist on the broker"
            raise
        return None
    if hasattr(channel, "get_table") and hasattr(channel, "typeof"):  # kombu's virtual ones
        table = channel.get_table(exchange)
        if not channel.typeof(exchange).lookup(table, exchange, routing_key, None):
            return "no queue is bound to the exchange for its routing key"
    return None
