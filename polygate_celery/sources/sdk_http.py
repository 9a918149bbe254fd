"""Source layer: an HTTP client for the openai SDK that holds error answers to a byte limit.

The SDK adapter reads 2xx answers itself, within its `max_body_bytes`. An
error answer (any other status) is read by the SDK before it raises, whole and
into memory; the response hook here reads it first, within the limit (counted
after content decoding), and hands the SDK only its first 64 KiB, as UTF-8
(the SDK decodes it in the answer's charset and as JSON, whole). A 401, 403 or
429 answer's body is not read at all: its status says all the adapter needs.

The SDK runs on httpx (openai 1.x, 2.x) or on httpx2 (later releases); the hook
serves either, as both share one response API.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from polygate_celery.sources.body import BodyTooLarge, read_text
from polygate_celery.sources.classify import STATUS_ONLY

ResponseHook = Callable[[Any], Awaitable[None]]


def body_limit(max_body_bytes: int) -> ResponseHook:
    """An httpx or httpx2 response event hook holding non-2xx bodies to `max_body_bytes`.

    Put it in the ``event_hooks={"response": [...]}`` of the `http_client` you
    give `openai.AsyncOpenAI`; a longer error answer raises `BodyTooLarge`,
    which the SDK adapter reads as a transient outcome.
    """

    async def hook(response: Any) -> None:
        if 200 <= response.status_code < 300:
            return  # read by the adapter, within its own limit
        library = library_of(response)
        if response.status_code in STATUS_ONLY:
            content = b""
            await response.stream.aclose()
        else:
            # A second response over the same unread stream decodes it as it
            # arrives; the SDK's own response stays unread until it is refilled.
            view = library.Response(
                response.status_code, headers=response.headers, stream=response.stream
            )
            # Only its start feeds a reason: the SDK gets that, as UTF-8, which it
            # json-decodes whole and would read in the answer's own charset.
            content = (await read_text(view, max_body_bytes)).encode()
        for name in ("content-encoding", "transfer-encoding"):
            response.headers.pop(name, None)
        response.headers["content-length"] = str(len(content))
        response.stream = library.ByteStream(content)
        response.encoding = "utf-8"

    return hook


def library_of(response: Any) -> Any:
    """The HTTP library (httpx or httpx2) `response` belongs to."""
    httpx2 = sys.modules.get("httpx2")  # loaded, if a response is one of its
    return httpx2 if httpx2 is not None and isinstance(response, httpx2.Response) else httpx


def bounded_http_client(max_body_bytes: int, **options: Any) -> Any:
    """The SDK's default async HTTP client (with `options`), with `body_limit` on every answer."""
    import openai  # noqa: PLC0415 - the openai extra, present whenever the SDK adapter is used

    hooks = {"response": [body_limit(max_body_bytes)]}
    return openai.DefaultAsyncHttpxClient(event_hooks=hooks, **options)


__all__ = ["BodyTooLarge", "body_limit", "bounded_http_client", "library_of"]
