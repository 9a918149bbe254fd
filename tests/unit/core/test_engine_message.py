"""The engine's messages (`core.engine.message`): records that compare and hash by value,
built without a frozen dataclass's per-field `object.__setattr__`, and slotted."""

from __future__ import annotations

import dataclasses

from polygate_celery.core import engine
from polygate_celery.store import Denial


def test_messages_compare_and_hash_by_value() -> None:
    first = engine.Wait("backoff", 1.0, True, 5.0)
    same = engine.Wait("backoff", 1.0, True, 5.0)
    assert first == same
    assert hash(first) == hash(same)
    assert {first, same} == {first}
    assert first != engine.Wait("backoff", 2.0, True, 5.0)
    assert engine.Granted("a") != engine.Granted("b")


def test_messages_are_slotted_dataclasses_with_their_fields() -> None:
    message = engine.Send("a", 1.0, 0.0, frozenset())
    assert not hasattr(message, "__dict__")
    assert [f.name for f in dataclasses.fields(message)] == [
        "source",
        "timeout_s",
        "asked_at",
        "excluded",
    ]


def test_a_stores_denial_is_the_engines_refusal() -> None:
    denial = Denial(1.0, (("a", "at_capacity"),))
    assert isinstance(denial, engine.Refused)
    assert hash(denial) == hash(Denial(1.0, (("a", "at_capacity"),)))
    assert not hasattr(denial, "__dict__")
