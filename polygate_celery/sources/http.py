"""Source layer: OpenAI-compatible HTTP sources over one shared `httpx.AsyncClient`.

One adapter serves every kind: a `ChatRequest` goes to ``/chat/completions``
(streamed or not), an `EmbeddingRequest` to ``/embeddings``, an `OcrRequest` to a
vision chat request or to a JSON OCR endpoint. Each attempt has one total
deadline, the loop's `timeout_s`; a streamed answer also has a first-token
limit (`ttft_timeout_s`) and an idle limit between chunks. Whatever the provider
does comes back as an `Outcome` (see `classify`); only cancellation passes
through.
"""

from __future__ import annotations

import asyncio
import base64
import os
import weakref
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
from polygate_celery.sources.stream import MalformedChunk, StreamAssembly

DEFAULT_OCR_PROMPT = "Transcribe all the text in this image, exactly as written."
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
    weakref.WeakKeyDictionary()
)


def http_client() -> httpx.AsyncClient:
    """The process's shared client for the running event loop (created on first use).

    Connection pools belong to a loop, so each loop gets its own; a forked
    worker starts with none of its parent's.
    """
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None or client.is_closed:
        client = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=512, max_keepalive_connections=128),
            timeout=httpx.Timeout(60.0),
        )
        _clients[loop] = client
    return client


async def close_http_client() -> None:
    """Close the running loop's shared client (before the loop itself ends)."""
    client = _clients.pop(asyncio.get_running_loop(), None)
    if client is not None:
        await client.aclose()


os.register_at_fork(after_in_child=_clients.clear)


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

    def __repr__(self) -> str:
        return f"OpenAIHttpSource(base_url={self.base_url!r}, model={self.model!r})"

    async def send(self, payload: Any, *, timeout_s: float) -> Outcome:
        try:
            async with asyncio.timeout(timeout_s):
                return await self._dispatch(payload, timeout_s)
        except TimeoutError:
            return Outcome.timeout(f"no complete answer within {timeout_s:g} s")
        except httpx.TimeoutException:
            return Outcome.timeout(f"no complete answer within {timeout_s:g} s")
        except httpx.HTTPError as exc:
            return Outcome.transient(f"connection failed: {type(exc).__name__}")

    async def _dispatch(self, payload: Any, timeout_s: float) -> Outcome:
        if isinstance(payload, ChatRequest):
            streamed = self.stream if payload.stream is None else payload.stream
            if streamed:
                return await self._stream_chat(payload, timeout_s)
            return await self._chat(payload, timeout_s)
        if isinstance(payload, EmbeddingRequest):
            return await self._embed(payload, timeout_s)
        if isinstance(payload, OcrRequest):
            return await self._ocr(payload, timeout_s)
        return Outcome.fatal(f"this source cannot take a {type(payload).__name__}")

    # -- requests ------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        if self._key is None:
            return {}
        return {"Authorization": f"Bearer {self._key.get_secret_value()}"}

    @property
    def _secrets(self) -> tuple[str, ...]:
        return (self._key.get_secret_value(),) if self._key is not None else ()

    async def _post(self, path: str, body: dict[str, Any], timeout_s: float) -> httpx.Response:
        client = self._client or http_client()
        return await client.post(
            self.base_url + path, json=body, headers=self._headers(), timeout=timeout_s
        )

    def _error(self, response: httpx.Response) -> Outcome:
        outcome = classify_error(
            response.status_code, response.headers, response.text, secrets=self._secrets
        )
        return self._with_body(outcome, response.text)

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
        response = await self._post("/chat/completions", body, timeout_s)
        if not response.is_success:
            return self._error(response)
        try:
            data = response.json()
            choice = data["choices"][0]
            text = choice["message"]["content"]
            if not isinstance(text, str):
                raise TypeError("no text content")
        except (ValueError, KeyError, IndexError, TypeError):
            return self._malformed("chat completion", response.text)
        finish = choice.get("finish_reason")
        return _success(ChatResult(text, finish if isinstance(finish, str) else None), data)

    async def _stream_chat(self, request: ChatRequest, timeout_s: float) -> Outcome:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": list(request.messages),
            **request.params,
            "stream": True,
        }
        if self.stream_usage:
            body["stream_options"] = {"include_usage": True}
        loop = asyncio.get_running_loop()
        started = loop.time()
        client = self._client or http_client()
        async with client.stream(
            "POST",
            self.base_url + "/chat/completions",
            json=body,
            headers=self._headers(),
            timeout=timeout_s,
        ) as response:
            if not response.is_success:
                await response.aread()
                return self._error(response)
            assembly = StreamAssembly(want_usage=self.stream_usage)
            lines = response.aiter_lines()
            while True:
                first = not assembly.first_token and self.ttft_timeout_s is not None
                wait = (
                    started + self.ttft_timeout_s - loop.time()
                    if first and self.ttft_timeout_s is not None
                    else self.stream_idle_timeout_s
                )
                try:
                    line = await asyncio.wait_for(anext(lines), timeout=max(wait, 0.0))
                    assembly.feed(line)
                except TimeoutError:
                    if assembly.whole:
                        return assembly.outcome()
                    what = "no first token within ttft_timeout_s" if first else "stream went idle"
                    return Outcome.timeout(what)
                except (StopAsyncIteration, httpx.TransportError):
                    if assembly.whole:
                        return assembly.outcome()
                    return Outcome.transient("stream cut before its final chunk")
                except MalformedChunk as exc:
                    if assembly.whole:
                        return assembly.outcome()
                    return Outcome.transient(f"malformed stream: {exc}")
                if assembly.error is not None:
                    message = assembly.error.get("message")
                    said = short(str(message), self._secrets) if message else "error in stream"
                    return Outcome.transient(said)
                if assembly.done:
                    return assembly.outcome()

    async def _embed(self, request: EmbeddingRequest, timeout_s: float) -> Outcome:
        body = {"model": self.model, "input": list(request.inputs)}
        response = await self._post("/embeddings", body, timeout_s)
        if not response.is_success:
            return self._error(response)
        try:
            data = response.json()
            items = sorted(data["data"], key=lambda item: int(item["index"]))
            vectors = [[float(x) for x in item["embedding"]] for item in items]
            if len(vectors) != len(request.inputs):
                raise ValueError("one vector per input")
        except (ValueError, KeyError, IndexError, TypeError):
            return self._malformed("embeddings", response.text)
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
        response = await self._post(self.ocr_endpoint, body, timeout_s)
        if not response.is_success:
            return self._error(response)
        try:
            data = response.json()
            text = data["text"]
            if not isinstance(text, str):
                raise TypeError("no text")
        except (ValueError, KeyError, TypeError):
            return self._malformed("OCR answer", response.text)
        return _success(OcrResult(text), data)


def _success(value: Any, data: dict[str, Any]) -> Outcome:
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    assert usage is not None

    def count(key: str) -> int | None:
        found = usage.get(key)
        return found if isinstance(found, int) and not isinstance(found, bool) else None

    model = data.get("model")
    return Outcome.success(
        value,
        status=200,
        model=model if isinstance(model, str) else None,
        prompt_tokens=count("prompt_tokens"),
        completion_tokens=count("completion_tokens"),
    )
