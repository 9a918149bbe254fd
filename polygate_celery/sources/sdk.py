"""Source layer: an existing `openai.AsyncOpenAI` client as a source (the `openai` extra).

The client's own retries are turned off (the loop decides what is retried), and
its errors are read through the same classification as the HTTP adapter: the
SDK's status errors carry the HTTP response, so a 429's Retry-After, a context
length or a content policy answer come out exactly as they do over plain HTTP.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from polygate_celery.core.outcome import Outcome
from polygate_celery.sources.classify import classify_error
from polygate_celery.sources.http import DEFAULT_OCR_PROMPT
from polygate_celery.sources.payloads import (
    ChatRequest,
    ChatResult,
    EmbeddingRequest,
    EmbeddingResult,
    OcrRequest,
    OcrResult,
)
from polygate_celery.sources.stream import StreamAssembly

if TYPE_CHECKING:
    from openai import AsyncOpenAI


def openai_module() -> Any:
    try:
        import openai  # noqa: PLC0415 - an optional extra
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the openai SDK adapter needs: pip install 'polygate_celery[openai]'"
        ) from exc
    return openai


class OpenAISDKSource:
    """Sends through `client` (retries off) to `model`; the same outcomes as over HTTP."""

    def __init__(
        self,
        client: AsyncOpenAI,
        *,
        model: str,
        stream: bool = False,
        stream_usage: bool = True,
        ttft_timeout_s: float | None = None,
        stream_idle_timeout_s: float = 30.0,
        ocr_prompt: str = DEFAULT_OCR_PROMPT,
    ) -> None:
        self._openai = openai_module()
        self._client = client.with_options(max_retries=0)
        self._secrets = tuple(k for k in [getattr(client, "api_key", None)] if isinstance(k, str))
        self.model = model
        self.stream = stream
        self.stream_usage = stream_usage
        self.ttft_timeout_s = ttft_timeout_s
        self.stream_idle_timeout_s = stream_idle_timeout_s
        self.ocr_prompt = ocr_prompt

    def __repr__(self) -> str:
        return f"OpenAISDKSource(model={self.model!r})"

    async def send(self, payload: Any, *, timeout_s: float) -> Outcome:
        openai = self._openai
        client = self._client.with_options(timeout=timeout_s)
        try:
            async with asyncio.timeout(timeout_s):
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
        except (openai.APIError, ValueError, KeyError, IndexError, TypeError, AttributeError):
            return Outcome.transient("malformed answer", status=200)

    async def _dispatch(self, client: Any, payload: Any) -> Outcome:
        if isinstance(payload, ChatRequest):
            streamed = self.stream if payload.stream is None else payload.stream
            if streamed:
                return await self._stream_chat(client, payload)
            return await self._chat(client, payload)
        if isinstance(payload, EmbeddingRequest):
            response = await client.embeddings.create(model=self.model, input=list(payload.inputs))
            items = sorted(response.data, key=lambda item: item.index)
            vectors = [[float(x) for x in item.embedding] for item in items]
            if len(vectors) != len(payload.inputs):
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
                return _success(OcrResult(outcome.value.text), None, outcome)
            return outcome
        return Outcome.fatal(f"this source cannot take a {type(payload).__name__}")

    async def _chat(self, client: Any, request: ChatRequest) -> Outcome:
        response = await client.chat.completions.create(
            model=self.model, messages=list(request.messages), **request.params
        )
        choice = response.choices[0]
        text = choice.message.content
        if not isinstance(text, str):
            return Outcome.transient("malformed chat completion", status=200)
        return _success(ChatResult(text, choice.finish_reason), response)

    async def _stream_chat(self, client: Any, request: ChatRequest) -> Outcome:
        extra = {"stream_options": {"include_usage": True}} if self.stream_usage else {}
        loop = asyncio.get_running_loop()
        started = loop.time()
        stream = await client.chat.completions.create(
            model=self.model,
            messages=list(request.messages),
            stream=True,
            **extra,
            **request.params,
        )
        assembly = StreamAssembly(want_usage=self.stream_usage)
        chunks = stream.__aiter__()
        try:
            while not assembly.done:
                first = not assembly.first_token and self.ttft_timeout_s is not None
                wait = (
                    started + self.ttft_timeout_s - loop.time()
                    if first and self.ttft_timeout_s is not None
                    else self.stream_idle_timeout_s
                )
                try:
                    chunk = await asyncio.wait_for(anext(chunks), timeout=max(wait, 0.0))
                    assembly.take(chunk.model_dump())
                except TimeoutError:
                    if assembly.whole:
                        break
                    what = "no first token within ttft_timeout_s" if first else "stream went idle"
                    return Outcome.timeout(what)
                except StopAsyncIteration:
                    break
                except Exception:
                    if assembly.whole:
                        break
                    return Outcome.transient("stream cut or malformed before its final chunk")
        finally:
            await stream.close()
        if not assembly.whole:
            return Outcome.transient("stream cut before its final chunk")
        return assembly.outcome()


def _success(value: Any, response: Any, based_on: Outcome | None = None) -> Outcome:
    if based_on is not None:
        return Outcome.success(
            value,
            status=200,
            model=based_on.model,
            prompt_tokens=based_on.prompt_tokens,
            completion_tokens=based_on.completion_tokens,
        )
    usage = getattr(response, "usage", None)
    return Outcome.success(
        value,
        status=200,
        model=getattr(response, "model", None),
        prompt_tokens=getattr(usage, "prompt_tokens", None),
        completion_tokens=getattr(usage, "completion_tokens", None),
    )
