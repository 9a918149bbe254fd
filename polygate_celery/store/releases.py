"""Store layer: per-process release watches, shared by every store.

In one process (the in-memory store), a released permit wakes the oldest watch
of its source, not every waiter: with dozens of callers queued on a source,
waking all of them for one permit would turn each release into a burst of
refused admissions. A watch that was woken but closed without using the wake-up
(its caller got a permit anyway) hands it to the next watch, so no wake-up is
lost. Across a fleet (the Redis store), a release hands its permit to one
waiting call, and that call's watch alone is woken (`ReleaseHub.wake_call`). Watches start when
they are created, synchronously, so a caller that opens one before asking for a
permit misses no release that follows the refusal. A call waiting for a quota slot
it booked is told on its watch when a call served before it took the slot and it was
booked another (`ReleaseHub.move_call`, `Watch.moved`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from polygate_celery.blocks import EndsWithBlock


class ReleaseHub:
    """The watches of one process: those of callers that do not queue, oldest first per
    source, and those of queued calls by call id (a call has one watch at a time), so
    each wake-up costs the same however many calls wait."""

    def __init__(self) -> None:
        self._anonymous: dict[str, dict[Watch, None]] = {}  # by source, oldest first
        self._calls: dict[str, Watch] = {}  # call id -> its watch, oldest first

    def watch(self, sources: Iterable[str], call_id: str = "") -> Watch:
        watch = Watch(self, tuple(sources), call_id)
        if call_id:
            self._calls[call_id] = watch
        else:
            for name in watch.sources:
                self._anonymous.setdefault(name, {})[watch] = None
        return watch

    def released(self, source: str) -> None:
        """A permit of `source` was released and no queued call was handed it: wake the
        oldest watch not yet woken of a caller that does not queue (one without a call
        id: a queued caller is woken by `wake_call` alone)."""
        for watch in self._anonymous.get(source, ()):
            if watch.woken_by is None:
                watch.wake(source)
                return

    def wake_call(self, call_id: str, source: str) -> None:
        """A permit of `source` was handed to the call `call_id`: wake its watch, if it
        still watches (else the permit returns when the call's claim ends)."""
        watch = self._calls.get(call_id)
        if watch is not None and source in watch.sources:
            watch.wake(source, handed=True)

    def move_call(self, call_id: str, source: str, in_s: float) -> None:
        """The slot the call `call_id` booked on `source`'s quota was taken and it was
        booked another, `in_s` seconds ahead: tell its watch, if it still watches (else
        it finds out when it asks at its old slot)."""
        watch = self._calls.get(call_id)
        if watch is not None and source in watch.sources:
            watch.move(in_s)

    def note_queued(self, call_id: str) -> None:
        """The call `call_id` was just queued for a permit (refused for capacity)."""
        watch = self._calls.get(call_id)
        if watch is not None:
            watch.queued = True

    def queued_calls(self) -> dict[str, list[str]]:
        """The calls waiting in a queue and not woken yet, by source (for a process that
        begins to hear hand-overs: one sent before could not be heard)."""
        calls: dict[str, list[str]] = {}
        for call_id, watch in self._calls.items():
            if watch.queued and watch.woken_by is None:
                for source in watch.sources:
                    calls.setdefault(source, []).append(call_id)
        return calls

    def waiting(self, source: str) -> int:
        """Watches of `source` not yet woken (for tests and status views)."""
        anonymous = self._anonymous.get(source, {})
        queued = (w for w in self._calls.values() if source in w.sources)
        return sum(1 for w in (*anonymous, *queued) if w.woken_by is None)

    def _remove(self, watch: Watch) -> None:
        if watch.call_id:
            if self._calls.get(watch.call_id) is watch:
                del self._calls[watch.call_id]
            return
        for name in watch.sources:
            watches = self._anonymous.get(name)
            if watches is not None:
                watches.pop(watch, None)
                if not watches:
                    del self._anonymous[name]


class Watch(EndsWithBlock):
    """One caller's watch; see `Store.watch_releases`."""

    def __init__(self, hub: ReleaseHub, sources: tuple[str, ...], call_id: str = "") -> None:
        self.sources = sources
        self.call_id = call_id
        self.woken_by: str | None = None
        self.queued = False  # its call waits in a queue (see `ReleaseHub.note_queued`)
        self._handed = False
        self._moved_in_s: float | None = None
        self._hub = hub
        self._event = asyncio.Event()
        self._used = False

    def wake(self, source: str, *, handed: bool = False) -> None:
        self.woken_by = source
        self._handed = handed  # a permit handed to this call is no one else's to use
        self._event.set()

    def move(self, in_s: float) -> None:
        self._moved_in_s = in_s  # (the latest move counts)
        self._event.set()

    def moved(self) -> float | None:
        """Seconds until the slot its call was moved to, if it was moved since it last
        asked (`ReleaseHub.move_call`) and no release woke it (it asks at once then); a
        later wait waits again."""
        in_s, self._moved_in_s = self._moved_in_s, None
        if in_s is None or self.woken_by is not None:
            return None
        self._event.clear()
        return in_s

    async def wait(self) -> None:
        await self._event.wait()
        self._used = True

    def _block_ended(self, exc_type: type[BaseException] | None) -> None:
        self._hub._remove(self)
        if self.woken_by is not None and not self._used and not self._handed:
            self._hub.released(self.woken_by)  # hand the unused wake-up on
