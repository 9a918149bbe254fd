"""Source layer: a plain async callable as a source.

For a model reached some other way (a local function, an in-house client). The
callable gets the payload and the attempt's deadline; what it returns is the
answer, unless it returns an `Outcome` itself. Whatever it raises is classified
rather than crashing the call: `TimeoutError` is a timeout, anything else a
transient failure named by its type (the message may hold a prompt, so it is
left out). Cancellation passes through.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from polygate_celery.clock import Clock, SystemClock, within
from polygate_celery.core.outcome import Outcome

AsyncModel = Callable[[Any, float], Awaitable[Any]]


class CallableSource:
    """Wraps ``async def model(payload, timeout_s) -> answer``; `clock` bounds its deadline."""

    def __init__(self, model: AsyncModel, *, clock: Clock | None = None) -> None:
        self._model = model
        self._clock = clock or SystemClock()

    def __repr__(self) -> str:
        return f"CallableSource({getattr(self._model, '__qualname__', self._model)!r})"

    async def send(self, payload: Any, *, timeout_s: float) -> Outcome:
        try:
            finished, answer = await within(self._clock, timeout_s, self._model(payload, timeout_s))
        except TimeoutError:
            return Outcome.timeout()
        except Exception as exc:
            return Outcome.transient(f"the model raised {type(exc).__name__}")
        if not finished:
            return Outcome.timeout(f"no answer within {timeout_s:g} s")
        return answer if isinstance(answer, Outcome) else Outcome.success(answer)
