"""Source layer: an `openai.AsyncOpenAI` client as a source (the `openai` extra).

The client builds and sends the request (its key, base URL, headers and own
HTTP settings), with its own retries off: the loop decides what is retried.
Its raw answer is then read by the same core as the HTTP adapter's
(`polygate_celery.sources.exchange`), through the SDK's streaming-response API,
so classification, deadlines, streams, reason texts and rate-limit headers come
out exactly as they do over plain HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Unpack, cast

import anyio
import httpx
from pydantic import SecretStr

from polygate_celery.core.outcome import Outcome
from polygate_celery.sources.body import Answer
from polygate_celery.sources.connection import Failure, library_failure
from polygate_celery.sources.exchange import (
    OpenAIStyleSource,
    Route,
    Settings,
    Unsendable,
)

if TYPE_CHECKING:
    from openai import AsyncOpenAI


def openai_module() -> Any:
    try:
        import openai  # noqa: PLC0415 - an optional extra
    except ImportError as exc:  # pragma: no cover - depends on the environment
        hint = "the openai SDK adapter needs: pip install 'polygate_celery[openai]'"
        raise ImportError(hint, name=exc.name) from exc
    return openai


class OpenAISDKSource(OpenAIStyleSource):
    """Sends through an `AsyncOpenAI` client (retries off) to `model`.

    Give either `client` (yours, used as it is) or `client_factory`, called
    once per event loop (a client's connections belong to the loop that made
    them). `settings` are the core's (`exchange.Settings`).

    Body limit: 2xx answers, streamed or not, are read by this adapter within
    `max_body_bytes`. An error answer's body is read by the SDK itself before
    it raises, so it is held to a limit only when the client's `http_client`
    carries `polygate_celery.sources.sdk_http.body_limit` (as
    `bounded_http_client` builds, and as sources built from a configuration
    have); with any other client, an error answer's body is read whole.
    """

    def __init__(
        self,
        client: AsyncOpenAI | None = None,
        *,
        model: str,
        client_factory: Callable[[], AsyncOpenAI] | None = None,
        **settings: Unpack[Settings],
    ) -> None:
        if (client is None) == (client_factory is None):
            raise ValueError("give either client or client_factory")
        super().__init__(model=model, **settings)
        self._openai = openai_module()
        self._given = client.with_options(max_retries=0) if client is not None else None
        self._factory = client_factory
        self._clients: dict[int, tuple[asyncio.AbstractEventLoop, Any]] = {}
        key = getattr(client, "api_key", None) if client is not None else None
        self._secret = SecretStr(key) if isinstance(key, str) else None

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

    async def aclose(self) -> None:
        """Close the client made for this event loop (a client given is the giver's)."""
        if self._factory is None:
            return
        found = self._clients.pop(id(asyncio.get_running_loop()), None)
        if found is not None:
            await found[1].close()

    @property
    def _secrets(self) -> tuple[str, ...]:
        return (self._secret.get_secret_value(),) if self._secret is not None else ()

    @contextlib.asynccontextmanager
    async def _open(
        self, route: Route, body: dict[str, Any], timeout_s: float
    ) -> AsyncIterator[Answer]:
        if route == "ocr":
            raise Unsendable(Outcome.fatal("the openai SDK speaks the chat API only"))
        client = self._client().with_options(timeout=timeout_s)
        resource = client.chat.completions if route == "chat" else client.embeddings
        async with contextlib.AsyncExitStack() as stack:
            try:
                response = await stack.enter_async_context(
                    resource.with_streaming_response.create(**body)
                )
                answer = response.http_response
            except self._openai.APIStatusError as exc:
                answer = exc.response  # an error answer, its body read by the SDK
            except Exception as exc:
                cut = _cut_error_answer(exc)
                if cut is None:
                    raise
                answer = cut
            yield answer

    def _failure(self, exc: Exception) -> Failure | None:
        openai = self._openai
        if isinstance(exc, openai.APITimeoutError):
            return Failure.TIMEOUT
        cause = exc.__cause__ if isinstance(exc, openai.APIConnectionError) else exc
        if isinstance(cause, Exception):
            for library in _libraries():
                found = library_failure(cause, library)
                if found is not None:
                    return found
        if isinstance(exc, openai.APIConnectionError):
            return Failure.CLOSED if _ended(cause) else Failure.OTHER
        return None


def _cut_error_answer(exc: Exception) -> Answer | None:
    """An error answer whose body the SDK failed to read, if that is what `exc` says.

    The SDK reads an error answer's body inside its handler of the status error,
    so a failure there carries the status error, and its response, as context.
    """
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, _status_errors()):
            return _CutAnswer(cast(Any, seen).response, exc)
        seen = seen.__context__
    return None


class _CutAnswer:
    """An answer's status and headers; reading its body raises what cut it."""

    def __init__(self, response: Any, failure: Exception) -> None:
        self.status_code: int = response.status_code
        self.headers: Any = response.headers
        self.encoding: str | None = None
        self._failure = failure

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        raise self._failure
        yield b""  # pragma: no cover - makes this a generator


def _libraries() -> tuple[Any, ...]:
    """httpx, and httpx2 when the SDK runs on it (its later releases do)."""
    httpx2 = sys.modules.get("httpx2")
    return (httpx,) if httpx2 is None else (httpx2, httpx)


def _status_errors() -> tuple[type[Exception], ...]:
    return tuple(library.HTTPStatusError for library in _libraries())


def _ended(cause: BaseException | None) -> bool:
    """The SDK's connection error for a peer that closed (anyio's EndOfStream)."""
    return isinstance(cause, anyio.EndOfStream)
