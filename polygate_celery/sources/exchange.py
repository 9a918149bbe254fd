"""Source layer: the one core of the OpenAI-style adapters (plain HTTP and the openai SDK).

An adapter says how a request reaches the provider (`_open`: an OpenAI-style
body in, an answer out whose body is not read yet) and how its HTTP library
reports a broken connection (`_failure`). Everything else is here, once:
deadlines, reading within `max_body_bytes` and decoding within a budget
(`polygate_celery.sources.decode`), classifying the answer, naming what went
wrong, and the provider's rate-limit headers on every outcome built from an
answer. Reading a stream is in `polygate_celery.sources.streamed`.

Deadlines: `timeout_s` bounds the whole attempt, headers included (with a
quarter-second grace at most, so that an answer sent at the deadline, such as
a queueing gateway's 429, is read as what it is). A stream also has
`ttft_timeout_s`, from sending the request to the first token of any kind
(text, reasoning, refusal or tool call), and `stream_idle_timeout_s` between
data chunks once tokens flow; keep-alive comments do not count as progress.
The first-token limit is a failover trigger (SPEC §3 rule 17): the loop lifts
it per attempt (`first_token_limit=False`) on the last source left, whose
first token is then waited for up to `timeout_s`.

Whatever the provider does comes back as an `Outcome`, never as an exception,
and no exception message is ever quoted (one may hold a key): only
cancellation passes through.
"""

from __future__ import annotations

import asyncio
import base64
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from typing import Any, Literal, TypedDict, Unpack

from polygate_celery.core.outcome import Outcome
from polygate_celery.sources import answers
from polygate_celery.sources.answers import MalformedAnswer
from polygate_celery.sources.body import Answer, BodyTooLarge, read_text
from polygate_celery.sources.classify import STATUS_ONLY, classify_error, rate_limits, short
from polygate_celery.sources.connection import Failure
from polygate_celery.sources.decode import (
    Budget,
    Undecodable,
    budget_for,
    discard,
    read_json,
)
from polygate_celery.sources.payloads import (
    ChatRequest,
    ChatResult,
    EmbeddingRequest,
    OcrRequest,
    OcrResult,
)
from polygate_celery.sources.streamed import Attempt, StreamLimits, cut, read_stream

DEFAULT_OCR_PROMPT = "Transcribe all the text in this image, exactly as written."
MAX_BODY_BYTES = 64 * 1024 * 1024
# What precedes a provider body's excerpt in a failure's reason (with `include_bodies`).
BODY_MARK = " [provider body, truncated]: "
TIE_GRACE_S = 0.25
USAGE_GRACE_S = 2.0

Route = Literal["chat", "embeddings", "ocr"]
Reader = Callable[[Any, Budget], Awaitable[Outcome]]


class Unsendable(Exception):
    """The request cannot leave this process; `outcome` says why (never chained)."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.reason)
        self.outcome = outcome


class Settings(TypedDict, total=False):
    """How an OpenAI-style adapter asks and reads, whichever way it reaches the provider.

    stream (False): stream chat answers unless a request says otherwise.
    stream_usage (True): ask a stream for its usage chunk.
    ttft_timeout_s (None): limit from sending to the first token of a stream.
    stream_idle_timeout_s (30): limit between a stream's data chunks.
    ocr_prompt: what a vision chat is asked for an `OcrRequest` without a prompt.
    include_bodies (False): add an excerpt of the provider's body to a failure's reason.
    max_body_bytes (64 MiB): the most of one answer read, after content decoding;
        its decoded JSON may take 3.5 times as much (`polygate_celery.sources.decode`).
    """

    stream: bool
    stream_usage: bool
    ttft_timeout_s: float | None
    stream_idle_timeout_s: float
    ocr_prompt: str
    include_bodies: bool
    max_body_bytes: int


class OpenAIStyleSource(ABC):
    """A source speaking the OpenAI API: chat (streamed or not), embeddings and OCR."""

    ocr_endpoint: str | None = None

    def __init__(self, *, model: str, **settings: Unpack[Settings]) -> None:
        self.model = model
        self.stream = settings.get("stream", False)
        self.stream_usage = settings.get("stream_usage", True)
        self.ttft_timeout_s = settings.get("ttft_timeout_s")
        self.stream_idle_timeout_s = settings.get("stream_idle_timeout_s", 30.0)
        self.ocr_prompt = settings.get("ocr_prompt", DEFAULT_OCR_PROMPT)
        self.include_bodies = settings.get("include_bodies", False)
        self.max_body_bytes = settings.get("max_body_bytes", MAX_BODY_BYTES)

    # -- what an adapter provides ---------------------------------------------------

    @abstractmethod
    def _open(
        self, route: Route, body: dict[str, Any], timeout_s: float
    ) -> AbstractAsyncContextManager[Answer]:
        """Send `body` to `route`; the answer, of any status, with its body unread."""

    @abstractmethod
    def _failure(self, exc: Exception) -> Failure | None:
        """How `exc` says the connection failed; None if it says nothing of the kind."""

    @property
    def _secrets(self) -> tuple[str, ...]:
        return ()

    async def aclose(self) -> None:  # noqa: B027 - a default, not an abstract method
        """Close the clients this source made for the running event loop (by default it
        made none: a shared or given client is not its own)."""

    # -- one attempt ----------------------------------------------------------------

    def limits_first_token(self, payload: Any) -> bool:
        """Whether `payload` is a chat request this source streams with a first-token
        limit (`polygate_celery.sources.base.FirstTokenSource`)."""
        return self.ttft_timeout_s is not None and self._streams(payload)

    def _streams(self, payload: Any) -> bool:
        return isinstance(payload, ChatRequest) and (
            self.stream if payload.stream is None else payload.stream
        )

    async def send(
        self, payload: Any, *, timeout_s: float, first_token_limit: bool = True
    ) -> Outcome:
        loop = asyncio.get_running_loop()
        allowed = timeout_s + min(TIE_GRACE_S, 0.05 * timeout_s)  # an answer sent at the deadline
        deadline = loop.time() + allowed
        streamed = self._streams(payload)
        attempt = Attempt(streamed)
        try:
            if streamed:
                ttft_s = self.ttft_timeout_s if first_token_limit else None
                outcome = await self._stream_chat(payload, deadline, attempt, ttft_s)
            else:
                async with asyncio.timeout_at(deadline):
                    outcome = await self._dispatch(payload, allowed, attempt)
        except TimeoutError:
            outcome = Outcome.timeout(f"no complete answer within {timeout_s:g} s")
        except Unsendable as exc:
            outcome = exc.outcome
        except BodyTooLarge as exc:
            if exc.headers is not None and attempt.limits is None:
                attempt.limits = rate_limits(exc.headers)
            outcome = Outcome.transient(f"an answer larger than {self.max_body_bytes} bytes")
        except Exception as exc:  # a provider's answer must never crash the call
            outcome = self._broken(exc, attempt, timeout_s)
        return outcome if attempt.limits is None else replace(outcome, limits=attempt.limits)

    def _broken(self, exc: Exception, attempt: Attempt, timeout_s: float) -> Outcome:
        """Name what happened to a connection, by how far the attempt had got."""
        failure = self._failure(exc)
        if failure is None:
            return Outcome.transient(f"unreadable answer: {type(exc).__name__}")
        if failure is Failure.TIMEOUT:
            return Outcome.timeout(f"no complete answer within {timeout_s:g} s")
        if failure is Failure.POOL:
            return Outcome.transient(failure.value)
        if failure is Failure.OTHER:
            return Outcome.transient(f"{failure.value}: {type(exc).__name__}")
        if not attempt.answered:
            if failure is Failure.CLOSED:
                return Outcome.transient("connection closed before any answer byte")
            return Outcome.transient(failure.value)
        return Outcome.transient(cut(attempt))

    async def _dispatch(self, payload: Any, timeout_s: float, attempt: Attempt) -> Outcome:
        if isinstance(payload, ChatRequest):
            return await self._chat(payload, timeout_s, attempt)
        if isinstance(payload, EmbeddingRequest):
            body = {"model": self.model, "input": list(payload.inputs)}
            expected = len(payload.inputs)
            return await self._call(
                "embeddings",
                body,
                timeout_s,
                attempt,
                lambda data, budget: answers.embeddings(data, budget, expected),
            )
        if isinstance(payload, OcrRequest):
            return await self._ocr(payload, timeout_s, attempt)
        return Outcome.fatal(f"this source cannot take a {type(payload).__name__}")

    async def _chat(self, request: ChatRequest, timeout_s: float, attempt: Attempt) -> Outcome:
        body = {"model": self.model, "messages": list(request.messages), **request.params}
        return await self._call("chat", body, timeout_s, attempt, answers.completion)

    async def _ocr(self, request: OcrRequest, timeout_s: float, attempt: Attempt) -> Outcome:
        if self.ocr_endpoint is None:
            content = [
                {"type": "text", "text": request.prompt or self.ocr_prompt},
                {"type": "image_url", "image_url": {"url": request.data_url()}},
            ]
            chat = ChatRequest([{"role": "user", "content": content}], stream=False)
            outcome = await self._chat(chat, timeout_s, attempt)
            if isinstance(outcome.value, ChatResult):
                return replace(outcome, value=OcrResult(outcome.value.text))
            return outcome
        body = {"model": self.model, "image": base64.b64encode(request.image).decode()}
        if request.prompt:
            body["prompt"] = request.prompt
        return await self._call("ocr", body, timeout_s, attempt, answers.ocr)

    async def _call(
        self,
        route: Route,
        body: dict[str, Any],
        timeout_s: float,
        attempt: Attempt,
        read: Reader,
    ) -> Outcome:
        async with self._open(route, body, timeout_s) as answer:
            return await self._whole(answer, attempt, read)

    async def _whole(self, answer: Answer, attempt: Attempt, read: Reader) -> Outcome:
        """Classify an answer read whole: an error, or a 2xx body `read` understands.

        A 2xx body is decoded as it arrives, within its budget
        (`polygate_celery.sources.decode`); what the result does not keep of it
        is let go of a slice at a time.
        """
        attempt.answer(answer)
        status = answer.status_code
        if status in STATUS_ONLY:
            return classify_error(status, answer.headers, "")
        if not 200 <= status < 300:
            text = await read_text(answer, self.max_body_bytes)
            outcome = classify_error(status, answer.headers, text, secrets=self._secrets)
            return self._with_body(outcome, text)
        budget = budget_for(self.max_body_bytes)
        try:
            data, excerpt = await read_json(answer, self.max_body_bytes, budget)
        except Undecodable as exc:
            return self._with_body(_malformed(exc), exc.excerpt)
        try:
            return await read(data, budget)
        except MalformedAnswer as exc:
            return self._with_body(Outcome.transient(f"malformed {exc.what}", status=200), excerpt)
        except Undecodable as exc:
            return self._with_body(_malformed(exc), excerpt)
        finally:
            box = [data]
            del data
            await discard(box, keep_shared=True)

    def _with_body(self, outcome: Outcome, body: str) -> Outcome:
        """With `include_bodies`, add a marked, truncated excerpt of the provider's body."""
        if not self.include_bodies or not body:
            return outcome
        excerpt = f"{outcome.reason}{BODY_MARK}{short(body, self._secrets)}"
        return replace(outcome, reason=excerpt)

    async def _stream_chat(
        self, request: ChatRequest, deadline: float, attempt: Attempt, ttft_s: float | None
    ) -> Outcome:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": list(request.messages),
            **request.params,
            "stream": True,
        }
        if self.stream_usage:
            body["stream_options"] = {"include_usage": True}
        limits = StreamLimits(
            self.stream_usage, self.stream_idle_timeout_s, self.max_body_bytes, self._secrets
        )
        return await read_stream(
            lambda timeout_s: self._open("chat", body, timeout_s),
            lambda answer: self._whole(answer, attempt, answers.completion),
            attempt,
            deadline,
            ttft_s,
            limits,
        )


def _malformed(exc: Undecodable) -> Outcome:
    return Outcome.transient(f"malformed answer: {exc.why}", status=200)
