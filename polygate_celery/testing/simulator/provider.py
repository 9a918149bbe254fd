"""Testing: `SimulatedProvider`, the simulator served from a background thread with its own loop.

The server runs in a thread so that synchronous tests, Celery workers and
benchmarks can all call it, and so that its timing is not at the mercy of the
caller's event loop. What the test thread reads (journal, in-flight counts) is
guarded by locks.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from types import TracebackType

from polygate_celery.blocks import EndsWithBlock
from polygate_celery.testing.simulator.admission import Admission
from polygate_celery.testing.simulator.behaviour import ModelBehaviour
from polygate_celery.testing.simulator.journal import JournalEntry
from polygate_celery.testing.simulator.server import Simulator

_START_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 10.0


class SimulatedProvider(EndsWithBlock):
    """A real OpenAI-compatible HTTP server (on 127.0.0.1 by default), for the models given.

    Use it as a context manager (``with`` or ``async with``)::

        with SimulatedProvider({"gpt-sim": ModelBehaviour(rpm=2)}) as provider:
            httpx.post(f"{provider.url}/chat/completions", json=...)
            provider.journal[-1].outcome   # "ok", "429-rpm", ...
    """

    def __init__(
        self,
        models: Mapping[str, ModelBehaviour],
        *,
        port: int = 0,
        seed: int = 0,
        host: str = "127.0.0.1",
        any_model: ModelBehaviour | None = None,
    ) -> None:
        """
        Args:
            models: Each model name's behaviour.
            port: The port to listen on (0: a free one, see `url`).
            seed: The seed of its random draws (latencies, error rates).
            host: The address to listen on.
            any_model: The behaviour of a model name not in `models` (else a 404).
        """
        self._simulator = Simulator(models, seed=seed, any_model=any_model)
        self._requested_port = port
        self._host = host
        self._port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The base URL, ``http://127.0.0.1:<port>/v1``, once started."""
        if self._port is None:
            raise RuntimeError("the simulated provider is not running")
        return f"http://127.0.0.1:{self._port}/v1"

    @property
    def journal(self) -> list[JournalEntry]:
        """A snapshot of every request so far, in the order their outcomes were known."""
        return self._simulator.journal.entries()

    def since_start(self) -> float:
        """Now on the journal's clock: seconds since the server started."""
        return self._simulator.since_start()

    def first_request_at(self, model: str) -> float | None:
        """When `model` was first asked for (seconds since the server started), if ever."""
        return self._simulator.first_request_at.get(model)

    def reset_journal(self) -> None:
        self._simulator.journal.clear()

    def in_flight(self, model: str) -> int:
        """Requests for `model` being served now (admitted, not yet answered)."""
        return self._admission(model).in_flight

    def peak(self, model: str) -> int:
        """The most requests for `model` ever served at once."""
        return self._admission(model).peak

    def _admission(self, model: str) -> Admission:
        try:
            return self._simulator.admissions[model]
        except KeyError:
            raise KeyError(f"no simulated model named {model!r}") from None

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the simulated provider is already running")
        ready = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(
            target=self._run, args=(ready, failure), name="polygate-simulator", daemon=True
        )
        self._thread.start()
        if not ready.wait(_START_TIMEOUT_S):
            raise RuntimeError("the simulated provider did not start in time")
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]

    def stop(self) -> None:
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(_STOP_TIMEOUT_S)
        self._thread = self._loop = None
        self._port = None

    def _run(self, ready: threading.Event, failure: list[BaseException]) -> None:
        loop = asyncio.new_event_loop()
        try:
            try:
                runner, self._port = loop.run_until_complete(
                    self._simulator.start(self._requested_port, self._host)
                )
            except BaseException as exc:
                failure.append(exc)
                return
            finally:
                self._loop = loop
                ready.set()
            loop.run_forever()
            loop.run_until_complete(runner.cleanup())
        finally:
            _cancel_leftovers(loop)
            loop.close()

    def __enter__(self) -> SimulatedProvider:
        self.start()
        return self

    def _block_ended(self, exc_type: type[BaseException] | None) -> None:
        self.stop()

    async def __aenter__(self) -> SimulatedProvider:
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.stop)


def _cancel_leftovers(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what shutdown left running, so closing the loop destroys no pending task."""
    pending = asyncio.all_tasks(loop)
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
