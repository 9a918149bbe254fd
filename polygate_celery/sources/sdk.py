"""Source layer: an `openai.AsyncOpenAI` client as a source (the `openai` extra).

The client's own retries are turned off (the loop decides what is retried), and
its errors are read through the same classification as the HTTP adapter: the
SDK's status errors carry the HTTP response, so a 429's Retry-After, a context
length or a content policy answer come out exactly as they do over plain HTTP.
Streams follow the HTTP adapter's deadlines (see `polygate_celery.sources.http`).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from polygate_celery.core.outcome import Outcome
from polygate_celery.sources.classify import classify_error
from polygate_celery.sources.http import (
    DEFAULT_OCR_PROMPT,
    TIE_GRACE_S,
    USAGE_GRACE_S,
    _chat_result,
    embedding_vectors,
)
from polygate_celery.sources.payloads import (
    ChatRequest,
    ChatResult,
    EmbeddingRequest,
    EmbeddingResult,
    OcrRequest,
    OcrResult,
)
from polygate_celery.sources.stream import StreamAssembly, count

if TYPE_CHECKING:
    from openai import AsyncOpenAI


def openai_module() -> Any:
    try:
        import openai  # noqa: PLC0415 - an optional extra
    except ImportError as exc:  # pragma: no cover - depends on the environment
        hint = "the openai SDK adapter needs: pip install 'polygate_celery[openai]'"
        raise ImportError(hint) from exc
    return openai


class OpenAISDKSource:
    """Sends through an `AsyncOpenAI` client (retries off) to `model`.

    Give either `client` (yours, used as it is) or `client_factory`, called
    once per event loop (a client's connections belong to the loop that made
    them).
    """

    def __init__(
        self,
        client: AsyncOpenAI | None = None,
        *,
        model: str,
        client_factory: Callable[[], AsyncOpenAI] | None = None,
        stream: bool = False,
        stream_usage: bool = True,
        ttft_timeout_s: float | None = None,
        stream_idle_timeout_s: float = 30.0,
        ocr_prompt: str = DEFAULT_OCR_PROMPT,
    ) -> None:
        if (client is None) == (client_factory is None):
            raise ValueError("give either client or client_factory")
        self._openai = openai_module()
        self._given = client.with_options(max_retries=0) if client is not None else None
        self._factory = client_factory
        self._clients: dict[int, tuple[asyncio.AbstractEventLoop, Any]] = {}
        key = getattr(client, "api_key", None) if client is not None else None
        self._secret = SecretStr(key) if isinstance(key, str) else None
        self.model = model
        self.stream = stream
        self.stream_usage = stream_usage
        self.ttft_timeout_s = ttft_timeout_s
        self.stream_idle_timeout_s = stream_idle_timeout_s
        self.ocr_prompt = ocr_prompt

    def __repr__(self) -> str:
        return f"OpenAISDKSource(model={self.model!r})"

    def _client(self) -> Any:
        if self._given is not None:
            return self._given
        assert self._factory is not None
        loop = asyncio.get_running_loop()
        found = self._clients.get(id(loop))
        if found is None or found[0] is not loop:
            client = self._factory().with_options(max_retries=0)
            key = getattr(client, "api_key", None)
            self._secret = SecretStr(key) if isinstance(key, str) else self._secret
            self._clients = {k: v for k, v in self._clients.items() if not v[0].is_closed()}
            self._clients[id(loop)] = (loop, client)
            return client
        return found[1]

    @property
    def _secrets(self) -> tuple[str, ...]:
        return (self._secret.get_secret_value(),) if self._secret is not None else ()

    async def send(self, payload: Any, *, timeout_s: float) -> Outcome:
        openai = self._openai
        loop = asyncio.get_running_loop()
        allowed = timeout_s + min(TIE_GRACE_S, 0.05 * timeout_s)  # an answer sent at the deadline
        deadline = loop.time() + allowed
        try:
            client = self._client().with_options(timeout=allowed)
            if isinstance(payload, ChatRequest):
                streamed = self.stream if payload.stream is None else payload.stream
                if streamed:
                    return await self._stream_chat(client, payload, deadline)
            async with asyncio.timeout_at(deadline):
                return await self._dispatch(client, payload)
        except openai.APIStatusError as exc:
            response = exc.response
            return classify_error(
                response.status_code, response.headers, response.text, secrets=self._secrets
            )
        except (TimeoutError, openai.APITimeoutError):
            return Outcome.timeout(f"no complete answer within {timeout_s:g} s")
        except openai.APIConnectionError as exc:
            return Outcome.transient(f"connection failed: {type(exc).__name__}")
        except Exception as exc:  # a provider's answer must never crash the call
            return Outcome.transient(f"unreadable answer: {type(exc).__name__}")

    async def _dispatch(self, client: Any, payload: Any) -> Outcome:
        if isinstance(payload, ChatRequest):
            return await self._chat(client, payload)
        if isinstance(payload, EmbeddingRequest):
            response = await client.embeddings.create(model=self.model, input=list(payload.inputs))
            try:
                items = [item.model_dump() for item in response.data]
                vectors = embedding_vectors(items, len(payload.inputs))
            except (ValueError, KeyError, TypeError):
                return Outcome.transient("malformed embeddings", status=200)
            return _success(EmbeddingResult(vectors), response)
        if isinstance(payload, OcrRequest):
            content = [
                {"type": "text", "text": payload.prompt or self.ocr_prompt},
                {"type": "image_url", "image_url": {"url": payload.data_url()}},
            ]
            chat = ChatRequest([{"role": "user", "content": content}], stream=False)
            outcome = await self._chat(client, chat)
            if isinstance(outcome.value, ChatResult):
                return Outcome.success(
                    OcrResult(outcome.value.text),
                    status=200,
                    model=outcome.model,
                    prompt_tokens=outcome.prompt_tokens,
                    completion_tokens=outcome.completion_tokens,
                )
            return outcome
        return Outcome.fatal(f"this source cannot take a {type(payload).__name__}")

    async def _chat(self, client: Any, request: ChatRequest) -> Outcome:
        response = await client.chat.completions.create(
            model=self.model, messages=list(request.messages), **request.params
        )
        choice = response.choices[0]
        result = _chat_result(choice.message.model_dump(), choice.finish_reason)
        if result is None:
            if choice.finish_reason == "content_filter":
                return Outcome.fatal(
                    "the provider's content filter withheld the answer", status=200
                )
            return Outcome.transient("malformed chat completion (no answer in it)", status=200)
        return _success(result, response)

    async def _stream_chat(self, client: Any, request: ChatRequest, deadline: float) -> Outcome:
        extra = {"stream_options": {"include_usage": True}} if self.stream_usage else {}
        loop = asyncio.get_running_loop()
        first_by = loop.time() + self.ttft_timeout_s if self.ttft_timeout_s else math.inf
        assembly = StreamAssembly(want_usage=self.stream_usage)
        phase = "first token"
        try:
            async with asyncio.timeout_at(min(deadline, first_by)) as limit:
                stream = await client.chat.completions.create(
                    model=self.model,
                    messages=list(request.messages),
                    stream=True,
                    **extra,
                    **request.params,
                )
                try:
                    async for chunk in stream:
                        assembly.take(chunk.model_dump())
                        if assembly.done:
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
                    await stream.close()
        except TimeoutError:
            if assembly.whole:
                return assembly.outcome()
            if phase == "first token" and loop.time() < deadline:
                return Outcome.timeout("no first token within ttft_timeout_s")
            if phase == "idle" and loop.time() < deadline:
                return Outcome.timeout("stream went idle")
            return Outcome.timeout("no complete answer within the attempt's deadline")
        except self._openai.APIStatusError:
            raise
        except Exception:
            if assembly.whole:
                return assembly.outcome()
            return Outcome.transient("stream cut or malformed before its final chunk")
        if not assembly.whole:
            return Outcome.transient("stream cut before its final chunk")
        return assembly.outcome()


def _success(value: Any, response: Any) -> Outcome:
    usage = getattr(response, "usage", None)
    model = getattr(response, "model", None)
    return Outcome.success(
        value,
        status=200,
        model=model if isinstance(model, str) else None,
        prompt_tokens=count(getattr(usage, "prompt_tokens", None)),
        completion_tokens=count(getattr(usage, "completion_tokens", None)),
    )
