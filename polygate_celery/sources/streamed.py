"""Source layer: reading a streamed chat answer within its deadlines.

A stream has three limits on top of the attempt's deadline: from sending to the
first token (`ttft_timeout_s`, lifted on the last source left), between data
chunks once tokens flow (`stream_idle_timeout_s`), and a short grace for the
usage chunk once the answer is whole. Which one ran out names the timeout. An
answer that is not a stream after all (an error, or a plain completion) is read
whole by the adapter (`polygate_celery.sources.exchange`); a stream's chunks are
decoded within the answer's budget and given to a `StreamAssembly`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from polygate_celery.core.outcome import Outcome, RateLimits
from polygate_celery.sources.body import Answer, LineTooLong, sse_lines
from polygate_celery.sources.classify import rate_limits, short
from polygate_celery.sources.decode import (
    STEP,
    Undecodable,
    budget_for,
    check_charset,
    discard,
    loads,
)
from polygate_celery.sources.stream import DONE, MalformedChunk, StreamAssembly, data_of

USAGE_GRACE_S = 2.0


@dataclass
class Attempt:
    """What one attempt got as far as: an answer's headers, and stream chunks."""

    streamed: bool
    answered: bool = False
    chunks: int = 0
    limits: RateLimits | None = None

    def answer(self, answer: Answer) -> None:
        self.answered = True
        self.limits = rate_limits(answer.headers)


@dataclass(frozen=True, slots=True)
class StreamLimits:
    """What a stream is read within, and whether its usage chunk was asked for."""

    want_usage: bool
    idle_s: float  # between data chunks once tokens flow
    max_body_bytes: int
    secrets: tuple[str, ...]  # never quoted from a provider's error


async def read_stream(
    open_answer: Callable[[float], AbstractAsyncContextManager[Answer]],
    read_whole: Callable[[Answer], Awaitable[Outcome]],
    attempt: Attempt,
    deadline: float,
    ttft_s: float | None,
    limits: StreamLimits,
) -> Outcome:
    """Send the request (`open_answer`, given the seconds left) and read its stream; an
    answer that is not one goes to `read_whole`. `deadline` is on the loop's clock."""
    loop = asyncio.get_running_loop()
    first_by = loop.time() + ttft_s if ttft_s else math.inf
    assembly = StreamAssembly(want_usage=limits.want_usage)
    phase = "first token"
    status: int | None = None  # the stream's own (2xx): a malformed one is no 5xx
    try:
        async with (
            asyncio.timeout_at(min(deadline, first_by)) as limit,
            open_answer(deadline - loop.time()) as answer,
        ):
            streamed = answer.status_code // 100 == 2 and "application/json" not in (
                answer.headers.get("content-type", "")
            )
            if not streamed:  # an error, or a plain completion
                attempt.streamed = False
                return await read_whole(answer)
            attempt.answer(answer)
            status = answer.status_code
            check_charset(answer.headers)
            lines = sse_lines(answer, limits.max_body_bytes)
            async with contextlib.aclosing(lines):
                async for line in lines:
                    data = data_of(line)
                    if data is None:
                        continue  # a keep-alive comment is not progress
                    await _take(assembly, data, limits.max_body_bytes)
                    attempt.chunks += 1
                    if assembly.error is not None or assembly.done:
                        break
                    if assembly.whole:
                        phase = "usage"
                        limit.reschedule(min(deadline, loop.time() + USAGE_GRACE_S))
                    elif assembly.first_token:
                        phase = "idle"
                        limit.reschedule(min(deadline, loop.time() + limits.idle_s))
    except TimeoutError:
        if assembly.whole:
            return assembly.outcome()
        if phase == "first token" and loop.time() < deadline:
            return Outcome.timeout("no first token within ttft_timeout_s", first_token_cut=True)
        if phase == "idle" and loop.time() < deadline:
            return Outcome.timeout("stream went idle")
        return Outcome.timeout("no complete answer within the attempt's deadline")
    except (MalformedChunk, LineTooLong, Undecodable, UnicodeDecodeError) as exc:
        if assembly.whole:
            return assembly.outcome()
        return Outcome.transient(f"malformed stream: {_why(exc)}", status=status)
    except Exception:
        if assembly.whole:
            return assembly.outcome()
        raise
    if assembly.whole:
        return assembly.outcome()
    if assembly.error is not None:
        message = assembly.error.get("message")
        said = short(str(message), limits.secrets) if message else "error in stream"
        return Outcome.transient(said)
    return Outcome.transient(cut(attempt))


async def _take(assembly: StreamAssembly, data: str, max_body_bytes: int) -> None:
    """Give a `data:` line to the assembly, its JSON decoded within the answer's budget."""
    if data == DONE:
        assembly.sentinel()
        return
    try:
        chunk = await loads(data, budget_for(max_body_bytes))
    except Undecodable as exc:
        if exc.why == "not JSON":
            raise MalformedChunk("a chunk that is not JSON") from None
        raise
    try:
        assembly.take_data(chunk)
    finally:
        if len(data) > STEP:  # a chunk this large may hold millions of objects
            box = [chunk]
            del chunk
            await discard(box, keep_shared=True)


def _why(exc: Exception) -> str:
    if isinstance(exc, Undecodable):
        return exc.why
    if isinstance(exc, UnicodeDecodeError):
        return "not valid UTF-8"
    return str(exc)


def cut(attempt: Attempt) -> str:
    """What a connection that ended after the answer began cut short."""
    if not attempt.streamed:
        return "connection closed mid-answer"
    if attempt.chunks:
        return "stream cut before its final chunk"
    return "stream closed before its first chunk"
