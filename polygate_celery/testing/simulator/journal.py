"""Testing: the simulator's journal — one frozen entry per request, readable from any thread.

Entries never hold the API key or the Authorization header: only whether the
bearer matched (`authorized`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from polygate_celery.testing.simulator.prompts import Prompt


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """What happened to one request.

    `at` is when it arrived, in seconds since the server started; the entry is
    appended once its outcome is known (a stall is journalled when it begins).
    `outcome` names the path taken: "ok", "429-capacity", "429-rpm", "429-tpm",
    "429-queued", "503-outage", "<status>-error" (error_rates), "<status>-<reject>",
    "401-auth", "404-model_not_found", "400-bad_request", "malformed-body", the
    stream faults ("stall", "cut", "malformed", "no_done", "slow_first_token"),
    or "client-gone" (the client left first; status 499 when no answer was sent).
    `authorized` is None when the model has no `api_key`. `ended` is when the entry was
    appended (an answer's end: the request held its slot from `at` to then).
    """

    at: float
    model: str
    path: str
    stream: bool
    status: int
    outcome: str
    prompt_tokens: int
    completion_tokens: int
    authorized: bool | None
    ended: float | None = None


@dataclass(slots=True)
class Visit:
    """What the server has learnt so far about one request; becomes its `JournalEntry`."""

    at: float
    path: str
    model: str = ""
    stream: bool = False
    authorized: bool | None = None
    prompt: Prompt | None = None
    answered: int | None = None  # the status, once headers have been sent
    recorded: bool = False


class Journal:
    """A list of entries guarded by a lock: the server thread writes, the test thread reads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: list[JournalEntry] = []

    def append(self, entry: JournalEntry) -> None:
        with self._lock:
            self._entries.append(entry)

    def entries(self) -> list[JournalEntry]:
        """A snapshot: later requests do not change the list returned."""
        with self._lock:
            return list(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
