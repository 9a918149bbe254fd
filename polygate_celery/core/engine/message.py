"""Decision core: `message`, how the engine's actions and events are declared.

A call exchanges about a dozen of them with its driver. Each is a frozen record to
the type checker (`dataclass_transform(frozen_default=True)`: ``mypy --strict``
refuses an assignment to a field) but is built as a plain slotted dataclass: a
frozen dataclass's `__init__` sets its fields one `object.__setattr__` at a time,
which costs some three times as much. They hash and compare by value, as frozen ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar, dataclass_transform

T = TypeVar("T")


@dataclass_transform(frozen_default=True)
def message(cls: type[T]) -> type[T]:
    """Declare `cls` an engine message: fields as in a frozen dataclass."""
    return dataclass(slots=True, unsafe_hash=True)(cls)
