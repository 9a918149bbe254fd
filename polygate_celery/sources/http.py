"""Source layer: OpenAI-compatible HTTP sources over one shared `httpx.AsyncClient`.

One adapter serves every kind: a `ChatRequest` goes to ``/chat/completions``
(streamed or not), an `EmbeddingRequest` to ``/embeddings``, an `OcrRequest` to a
vision chat request or to a JSON OCR endpoint.

Deadlines: `timeout_s` bounds the whole attempt, headers included (with a
quarter-second grace at most, so that an answer sent at the deadline, such as
a queueing gateway's 429, is read as what it is). A stream also has
`ttft_timeout_s`, from sending the request to the first token of any kind
(text, reasoning, refusal or tool call), and `stream_idle_timeout_s` between
data chunks once tokens flow; keep-alive comments do not count as progress.

Whatever the provider does comes back as an `Outcome` (see `classify`), never
as an exception, and no exception message is ever quoted (one may hold a key):
only cancellation passes through.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import math
import os
from dataclasses import replace
from typing import Any

import httpx
from pydantic import SecretStr

from polygate_celery.core.outcome import Outcome
from polygate_celery.sources.classify import classify_error, short
from polygate_celery.sources.payloads import (
    ChatRequest,
    ChatResult,
    EmbeddingRequest,
    EmbeddingResult,
    OcrRequest,
    OcrResult,
)
from polygate_celery.sources.stream import MalformedChunk, StreamAssembly, count

DEFAULT_OCR_PROMPT = "Transcribe all the text in this image, exactly as written."
MAX_BODY_BYTES = 64 * 1024 * 1024
TIE_GRACE_S = 0.25
USAGE_GRACE_S = 2.0
_clients: dict[int, tuple[asyncio.AbstractEventLoop, httpx.AsyncClient]] = {}


def http_client() -> httpx.AsyncClient:
    """The process's shared client for the running event loop (created on first use).

    Connection pools belong to a loop, so each loop gets its own; clients of
    loops that have closed are dropped, and a forked worker starts with none.
    """
    loop = asyncio.get_running_loop()
    for key, (owner, _) in list(_clients.items()):
        if owner.is_closed():
            del _clients[key]
    found = _clients.get(id(loop))
    if found is None or found[0] is not loop or found[1].is_closed:
        client = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=512, max_keepalive_connections=128),
            timeout=httpx.Timeout(60.0),
        )
        _clients[id(loop)] = (loop, client)
        return client
    return found[1]


async def close_http_client() -> None:
    """Close the running loop's shared client (before the loop itself ends)."""
    found = _clients.pop(id(asyncio.get_running_loop()), None)
    if found is not None:
        await found[1].aclose()


os.register_at_fork(after_in_child=_clients.clear)


class _TooLarge(Exception):
    pass


class OpenAIHttpSource:
    """A model endpoint speaking the OpenAI HTTP API. The key is never in its repr."""

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: SecretStr | None = None,
        client: httpx.AsyncClient | None = None,
        stream: bool = False,
        stream_usage: bool = True,
        ttft_timeout_s: float | None = None,
        stream_idle_timeout_s: float = 30.0,
        ocr_endpoint: str | None = None,
        ocr_prompt: str = DEFAULT_OCR_PROMPT,
        include_bodies: bool = False,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._key = api_key
        self._client = client
        self.stream = stream
        self.stream_usage = stream_usage
        self.ttft_timeout_s = ttft_timeout_s
        self.stream_idle_timeout_s = stream_idle_timeout_s
        self.ocr_endpoint = ocr_endpoint
        self.ocr_prompt = ocr_prompt
        self.include_bodies = include_bodies
        self.max_body_bytes = max_body_bytes

    def __repr__(self) -> str:
        return f"OpenAIHttpSource(base_url={self.base_url!r}, model={self.model!r})"

    async def send(self, payload: Any, *, timeout_s: float) -> Outcome:
        loop = asyncio.get_running_loop()
        allowed = timeout_s + min(TIE_GRACE_S, 0.05 * timeout_s)  # an answer sent at the deadline
        deadline = loop.time() + allowed
        try:
            if isinstance(payload, ChatRequest):
                streamed = self.stream if payload.stream is None else payload.stream
                if streamed:
                    return await self._stream_chat(payload, deadline)
            async with asyncio.timeout_at(deadline):
                return await self._dispatch(payload, allowed)
        except TimeoutError:
            return Outcome.timeout(f"no complete answer within {timeout_s:g} s")
        except httpx.PoolTimeout:
            return Outcome.transient("no free connection in this process's pool")
        except httpx.TimeoutException:
            return Outcome.timeout(f"no complete answer within {timeout_s:g} s")
        except _TooLarge:
            return Outcome.transient(f"an answer larger than {self.max_body_bytes} bytes")
        except _BadKey:
            return Outcome.rejected(
                "the API key cannot be sent in a header", credentials_rejected=True
            )
        except httpx.HTTPError as exc:
            return Outcome.transient(f"connection failed: {type(exc).__name__}")
        except Exception as exc:  # a provider's answer must never crash the call
            return Outcome.transient(f"unreadable answer: {type(exc).__name__}")

    async def _dispatch(self, payload: Any, timeout_s: float) -> Outcome:
        if isinstance(payload, ChatRequest):
            return await self._chat(payload, timeout_s)
        if isinstance(payload, EmbeddingRequest):
            return await self._embed(payload, timeout_s)
        if isinstance(payload, OcrRequest):
            return await self._ocr(payload, timeout_s)
        return Outcome.fatal(f"this source cannot take a {type(payload).__name__}")

    # -- requests ------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self._key is not None:
            headers["Authorization"] = f"Bearer {self._key.get_secret_value()}"
        return headers

    @property
    def _secrets(self) -> tuple[str, ...]:
        return (self._key.get_secret_value(),) if self._key is not None else ()

    def _request(self, path: str, body: dict[str, Any], timeout_s: float) -> httpx.Request:
        try:
            content = json.dumps(body, allow_nan=False).encode()
        except (TypeError, ValueError, RecursionError) as exc:
            raise _Unencodable from exc  # the caller's parameters, not the source's fault
        client = self._client or http_client()
        try:
            return client.build_request(
                "POST",
                self.base_url + path,
                content=content,
                headers=self._headers(),
                timeout=timeout_s,
            )
        except UnicodeEncodeError:
            raise _BadKey from None  # never chained: the error's text holds the header

    async def _post(
        self, path: str, body: dict[str, Any], timeout_s: float
    ) -> tuple[int, Any, str]:
        """(status, headers, body text), the body read up to `max_body_bytes`."""
        request = self._request(path, body, timeout_s)
        client = self._client or http_client()
        response = await client.send(request, stream=True)
        try:
            text = await self._read(response)
        finally:
            await response.aclose()
        return response.status_code, response.headers, text

    async def _read(self, response: httpx.Response) -> str:
        length = response.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            raise _TooLarge
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise _TooLarge
            chunks.append(chunk)
        return b"".join(chunks).decode(response.encoding or "utf-8", errors="replace")

    def _error(self, status: int, headers: Any, text: str) -> Outcome:
        outcome = classify_error(status, headers, text, secrets=self._secrets)
        if outcome.credentials_rejected:
            return outcome  # a credentials error's body may echo part of the key: never quoted
        return self._with_body(outcome, text)

    def _malformed(self, what: str, body: str) -> Outcome:
        return self._with_body(Outcome.transient(f"malformed {what}", status=200), body)

    def _with_body(self, outcome: Outcome, body: str) -> Outcome:
        """With `include_bodies`, add a marked, truncated excerpt of the provider's body."""
        if not self.include_bodies or not body:
            return outcome
        excerpt = f"{outcome.reason} [provider body, truncated]: {short(body, self._secrets)}"
        return replace(outcome, reason=excerpt)

    async def _chat(self, request: ChatRequest, timeout_s: float) -> Outcome:
        body = {"model": self.model, "messages": list(request.messages), **request.params}
        try:
            status, headers, text = await self._post("/chat/completions", body, timeout_s)
        except _Unencodable:
            return Outcome.fatal("the request cannot be sent as JSON")
        if not 200 <= status < 300:
            return self._error(status, headers, text)
        return self._completion(text)

    def _completion(self, text: str) -> Outcome:
        try:
            data = json.loads(text)
            choice = data["choices"][0]
            message = choice["message"]
            result = _chat_result(message, choice.get("finish_reason"))
        except (ValueError, KeyError, IndexError, TypeError, RecursionError):
            return self._malformed("chat completion", text)
        if result is None:
            if choice.get("finish_reason") == "content_filter":
                return Outcome.fatal(
                    "the provider's content filter withheld the answer", status=200
                )
            return self._malformed("chat completion (no answer in it)", text)
        return _success(result, data)

    async def _stream_chat(self, request: ChatRequest, deadline: float) -> Outcome:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": list(request.messages),
            **request.params,
            "stream": True,
        }
        if self.stream_usage:
            body["stream_options"] = {"include_usage": True}
        loop = asyncio.get_running_loop()
        first_by = loop.time() + self.ttft_timeout_s if self.ttft_timeout_s else math.inf
        assembly = StreamAssembly(want_usage=self.stream_usage)
        phase = "first token"
        try:
            request_ = self._request("/chat/completions", body, deadline - loop.time())
        except _Unencodable:
            return Outcome.fatal("the request cannot be sent as JSON")
        client = self._client or http_client()
        try:
            async with asyncio.timeout_at(min(deadline, first_by)) as limit:
                response = await client.send(request_, stream=True)
                try:
                    if not response.is_success:
                        text = await self._read(response)
                        return self._error(response.status_code, response.headers, text)
                    if "application/json" in response.headers.get("content-type", ""):
                        return self._completion(await self._read(response))  # not streamed
                    async with contextlib.aclosing(_lines(response, self.max_body_bytes)) as lines:
                        async for line in lines:
                            if not assembly.feed(line):
                                continue  # a keep-alive comment is not progress
                            if assembly.error is not None or assembly.done:
                                break
                            if assembly.whole:
                                phase = "usage"
                                limit.reschedule(min(deadline, loop.time() + USAGE_GRACE_S))
                            elif assembly.first_token:
                                phase = "idle"
                                limit.reschedule(
                                    min(deadline, loop.time() + self.stream_idle_timeout_s)
                                )
                finally:
                    await response.aclose()
        except TimeoutError:
            if assembly.whole:
                return assembly.outcome()
            if phase == "first token" and loop.time() < deadline:
                return Outcome.timeout("no first token within ttft_timeout_s")
            if phase == "idle" and loop.time() < deadline:
                return Outcome.timeout("stream went idle")
            return Outcome.timeout("no complete answer within the attempt's deadline")
        except (httpx.TransportError, MalformedChunk) as exc:
            if assembly.whole:
                return assembly.outcome()
            if isinstance(exc, MalformedChunk):
                return Outcome.transient(f"malformed stream: {exc}")
            return Outcome.transient("stream cut before its final chunk")
        if assembly.whole:
            return assembly.outcome()
        if assembly.error is not None:
            message = assembly.error.get("message")
            said = short(str(message), self._secrets) if message else "error in stream"
            return Outcome.transient(said)
        return Outcome.transient("stream cut before its final chunk")

    async def _embed(self, request: EmbeddingRequest, timeout_s: float) -> Outcome:
        body = {"model": self.model, "input": list(request.inputs)}
        try:
            status, headers, text = await self._post("/embeddings", body, timeout_s)
        except _Unencodable:
            return Outcome.fatal("the request cannot be sent as JSON")
        if not 200 <= status < 300:
            return self._error(status, headers, text)
        try:
            data = json.loads(text)
            vectors = embedding_vectors(data["data"], len(request.inputs))
        except (ValueError, KeyError, IndexError, TypeError, RecursionError):
            return self._malformed("embeddings", text)
        return _success(EmbeddingResult(vectors), data)

    async def _ocr(self, request: OcrRequest, timeout_s: float) -> Outcome:
        if self.ocr_endpoint is None:
            prompt = request.prompt or self.ocr_prompt
            content = [
                {"type": "text", "text": prompt},
                {"type": "image_url", "image_url": {"url": request.data_url()}},
            ]
            chat = ChatRequest([{"role": "user", "content": content}], stream=False)
            outcome = await self._chat(chat, timeout_s)
            if isinstance(outcome.value, ChatResult):
                return replace(outcome, value=OcrResult(outcome.value.text))
            return outcome
        body = {"model": self.model, "image": base64.b64encode(request.image).decode()}
        if request.prompt:
            body["prompt"] = request.prompt
        try:
            status, headers, text = await self._post(self.ocr_endpoint, body, timeout_s)
        except _Unencodable:
            return Outcome.fatal("the request cannot be sent as JSON")
        if not 200 <= status < 300:
            return self._error(status, headers, text)
        try:
            data = json.loads(text)
            answer = data["text"]
            if not isinstance(answer, str):
                raise TypeError("no text")
        except (ValueError, KeyError, TypeError, RecursionError):
            return self._malformed("OCR answer", text)
        return _success(OcrResult(answer), data)


class _Unencodable(Exception):
    pass


class _BadKey(Exception):
    pass


async def _lines(response: httpx.Response, limit: int) -> Any:
    """The response's lines, refusing a stream larger than `limit` bytes in all."""
    size = 0
    async for line in response.aiter_lines():
        size += len(line) + 1
        if size > limit:
            raise _TooLarge
        yield line


def _chat_result(message: Any, finish: Any) -> ChatResult | None:
    """The answer in a completion's message, or None if it holds none."""
    if not isinstance(message, dict):
        raise TypeError("message is not an object")
    text = message.get("content")
    tools = message.get("tool_calls")
    refusal = message.get("refusal")
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    has_tools = isinstance(tools, list) and bool(tools)
    if not isinstance(text, str) and not has_tools and not isinstance(refusal, str):
        return None
    return ChatResult(
        text if isinstance(text, str) else "",
        finish if isinstance(finish, str) else None,
        tool_calls=[t for t in tools if isinstance(t, dict)] if isinstance(tools, list) else [],
        reasoning=reasoning if isinstance(reasoning, str) else None,
        refusal=refusal if isinstance(refusal, str) else None,
    )


def embedding_vectors(items: Any, expected: int) -> list[list[float]]:
    """One finite, same-length vector per input, in input order; ValueError otherwise."""
    if not isinstance(items, list) or len(items) != expected:
        raise ValueError("one vector per input")
    by_index: dict[int, list[float]] = {}
    for position, item in enumerate(items):
        index = item.get("index", position) if isinstance(item, dict) else None
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < expected:
            raise ValueError("a vector with a bad index")
        if index in by_index:
            raise ValueError("two vectors for one input")
        vector = [float(x) for x in item["embedding"]]
        if not vector or not all(math.isfinite(x) for x in vector):
            raise ValueError("an empty or non-finite vector")
        by_index[index] = vector
    vectors = [by_index[i] for i in range(expected)]
    if len({len(v) for v in vectors}) > 1:
        raise ValueError("vectors of different lengths")
    return vectors


def _success(value: Any, data: Any) -> Outcome:
    usage = data.get("usage") if isinstance(data, dict) else None
    usage = usage if isinstance(usage, dict) else {}
    model = data.get("model") if isinstance(data, dict) else None
    return Outcome.success(
        value,
        status=200,
        model=model if isinstance(model, str) else None,
        prompt_tokens=count(usage.get("prompt_tokens")),
        completion_tokens=count(usage.get("completion_tokens")),
    )
