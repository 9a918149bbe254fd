"""Source layer: OpenAI-compatible HTTP sources over one shared `httpx.AsyncClient`.

One adapter serves every kind: a `ChatRequest` goes to ``/chat/completions``
(streamed or not), an `EmbeddingRequest` to ``/embeddings``, an `OcrRequest` to a
vision chat request or to a JSON OCR endpoint. Deadlines, body limits and
classification are the core's (`polygate_celery.sources.exchange`); this module
only builds the request and sends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from typing import Any, Unpack

import httpx
from pydantic import SecretStr

from polygate_celery.core.outcome import Outcome
from polygate_celery.sources.body import Answer
from polygate_celery.sources.connection import Failure, library_failure
from polygate_celery.sources.exchange import (
    DEFAULT_OCR_PROMPT,
    MAX_BODY_BYTES,
    OpenAIStyleSource,
    Route,
    Settings,
    Unsendable,
)

__all__ = [
    "DEFAULT_OCR_PROMPT",
    "MAX_BODY_BYTES",
    "OpenAIHttpSource",
    "close_http_client",
    "http_client",
]

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


class OpenAIHttpSource(OpenAIStyleSource):
    """A model endpoint speaking the OpenAI HTTP API. The key is never in its repr.

    `settings` are the core's (`exchange.Settings`). Every answer, streamed or
    not, is read within `max_body_bytes` (after content decoding); a longer one
    is a transient outcome.
    """

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: SecretStr | None = None,
        client: httpx.AsyncClient | None = None,
        ocr_endpoint: str | None = None,
        **settings: Unpack[Settings],
    ) -> None:
        super().__init__(model=model, **settings)
        self.base_url = base_url.rstrip("/")
        self._key = api_key
        self._client = client
        self.ocr_endpoint = ocr_endpoint

    def __repr__(self) -> str:
        return f"OpenAIHttpSource(base_url={self.base_url!r}, model={self.model!r})"

    @property
    def _secrets(self) -> tuple[str, ...]:
        return (self._key.get_secret_value(),) if self._key is not None else ()

    def _failure(self, exc: Exception) -> Failure | None:
        return library_failure(exc, httpx)

    @contextlib.asynccontextmanager
    async def _open(
        self, route: Route, body: dict[str, Any], timeout_s: float
    ) -> AsyncIterator[Answer]:
        client = self._client or http_client()
        request = self._request(client, _PATHS.get(route) or self.ocr_endpoint, body, timeout_s)
        response = await client.send(request, stream=True)
        try:
            yield response
        finally:
            await response.aclose()

    def _request(
        self, client: httpx.AsyncClient, path: str | None, body: dict[str, Any], timeout_s: float
    ) -> httpx.Request:
        try:
            content = json.dumps(body, allow_nan=False).encode()
        except (TypeError, ValueError, RecursionError):  # the caller's parameters
            raise Unsendable(Outcome.fatal("the request cannot be sent as JSON")) from None
        headers = {"Content-Type": "application/json"}
        if self._key is not None:
            headers["Authorization"] = f"Bearer {self._key.get_secret_value()}"
        try:
            return client.build_request(
                "POST",
                f"{self.base_url}{path}",
                content=content,
                headers=headers,
                timeout=timeout_s,
            )
        except UnicodeEncodeError:  # never chained: the error's text holds the header
            rejected = Outcome.rejected(
                "the API key cannot be sent in a header", credentials_rejected=True
            )
            raise Unsendable(rejected) from None


_PATHS: dict[Route, str] = {"chat": "/chat/completions", "embeddings": "/embeddings"}
