"""What a parked entry must be before it is published: a message Celery's worker can
take (checked field by field, each refusal naming the field), never one that crashes it."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from celery import Celery

from polygate_celery.celery.parked_message import malformed
from polygate_celery.celery.parking import capture_message

app = Celery("message-check")


@app.task
def add(x: int, y: int = 1) -> int:
    return x + y


def captured(signature: Any = None) -> dict[str, Any]:
    """A message as its lot gives it back: what Celery publishes, through JSON."""
    if signature is None:
        signature = add.s(1, y=2).set(queue="q", expires=30, priority=3, link=add.s())
    message: dict[str, Any] = json.loads(json.dumps(capture_message(signature)))
    return message


def test_what_celery_publishes_passes() -> None:
    assert malformed(captured()) is None
    assert malformed(captured(add.s(1).set(countdown=5))) is None


def test_a_protocol_1_message_passes() -> None:
    message = {**captured(), "headers": {}}
    message["body"] = {"task": "add", "id": "t-1", "args": [1], "kwargs": {}}
    assert malformed(message) is None


def changed(path: str, value: Any) -> dict[str, Any]:
    message = copy.deepcopy(captured())
    *parents, last = path.split(".")
    where: Any = message
    for name in parents:
        where = where[int(name)] if isinstance(where, list) else where[name]
    if value is KeyError:
        del where[last]
    elif isinstance(where, list):
        where[int(last)] = value
    else:
        where[last] = value
    return message


@pytest.mark.parametrize(
    ("path", "value", "names"),
    [
        ("body", "x", "body"),
        ("body", [[], {}], "body"),
        ("body.0", "args", "args"),
        ("body.1", [], "kwargs"),
        ("body.2", [], "embed"),
        ("body.2.callbacks", {"task": "x"}, "embed.callbacks"),
        ("body.2.callbacks", ["x"], "embed.callbacks"),
        ("body.2.chord", [], "embed.chord"),
        ("serializer", "pickle", "serializer"),
        ("serializer", "yaml", "serializer"),
        ("compression", "bogus", "compression"),
        ("compression", 5, "compression"),
        ("exchange", None, "exchange"),
        ("routing_key", 7, "routing_key"),
        ("delivery_mode", True, "delivery_mode"),
        ("delivery_mode", 3, "delivery_mode"),
        ("headers", [], "headers"),
        ("headers.id", KeyError, "headers.id"),
        ("headers.id", 5, "headers.id"),
        ("headers.task", "", "headers.task"),
        ("headers.eta", "tomorrow", "headers.eta"),
        ("headers.expires", 5, "headers.expires"),
        ("headers.retries", "1", "headers.retries"),
        ("headers.timelimit", [1], "headers.timelimit"),
        ("headers.parent_id", 5, "headers.parent_id"),
        ("properties", "x", "properties"),
        ("properties.priority", "3", "properties.priority"),
        ("properties.priority", 256, "properties.priority"),
        ("properties.content_type", "application/json", "content_type"),
        ("properties.exchange", "", "exchange"),
        ("properties.custom", {"nested": 1}, "properties.custom"),
        ("routing_key", KeyError, "routing_key"),
    ],
)
def test_a_field_of_the_wrong_shape_is_refused_by_name(path: str, value: Any, names: str) -> None:
    why = malformed(changed(path, value))
    assert why is not None
    assert names in why


def test_a_protocol_1_body_of_the_wrong_shape_is_refused() -> None:
    message = {**captured(), "headers": {}}
    for body, names in (
        ([1, {}, None], "body"),
        ({"task": "add", "args": []}, "body.id"),
        ({"task": "add", "id": "t", "kwargs": []}, "kwargs"),
    ):
        why = malformed({**message, "body": body})
        assert why is not None, body
        assert names in why, (body, why)


def test_a_reason_never_quotes_the_entry() -> None:
    why = malformed(changed("body.1", ["sk-secret"]))
    assert why is not None
    assert "sk-secret" not in why
