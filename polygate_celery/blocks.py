"""Beside the core: objects that last as long as the `with` block holding them.

A lease, a queue place, a release watch and the embedded Redis server all end
with their block and do nothing more on entry than hand themselves out, so the
two methods are written once here; each says only what its end does.
"""

from __future__ import annotations

from types import TracebackType
from typing import Self


class EndsWithBlock:
    """`with x:` hands out `x` and calls `x._block_ended` when the block ends.

    Slot-free, so a subclass with slots keeps them.
    """

    __slots__ = ()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._block_ended(exc_type)

    def _block_ended(self, exc_type: type[BaseException] | None) -> None:
        """End what the block held; `exc_type` is what ended the block, if it raised."""
        raise NotImplementedError
