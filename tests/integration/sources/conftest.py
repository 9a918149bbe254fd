"""One simulated provider for the source tests: a model per behaviour, all keyed with the canary."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import pytest_asyncio
from pydantic import SecretStr

from polygate_celery.sources import (
    OpenAIHttpSource,
    OpenAISDKSource,
    Source,
    close_http_client,
)
from polygate_celery.testing.simulator import ModelBehaviour, SimulatedProvider
from tests.conftest import CANARY_KEY

KEY = CANARY_KEY
MODELS: dict[str, ModelBehaviour] = {
    "ok": ModelBehaviour(api_key=KEY, reply="the full answer"),
    "fallback": ModelBehaviour(api_key=KEY, reply="the fallback's answer"),
    "ratelimit-seconds": ModelBehaviour(api_key=KEY, error_rates={429: 1.0}, retry_after_s=7),
    "ratelimit-date": ModelBehaviour(
        api_key=KEY, error_rates={429: 1.0}, retry_after="http-date", retry_after_s=30
    ),
    "ratelimit-ms": ModelBehaviour(
        api_key=KEY, error_rates={429: 1.0}, retry_after="ms", retry_after_s=1.5
    ),
    "ratelimit-none": ModelBehaviour(api_key=KEY, error_rates={429: 1.0}, retry_after="none"),
    "queued": ModelBehaviour(api_key=KEY, queueing_s=5.0, retry_after_s=5),
    "e408": ModelBehaviour(api_key=KEY, error_rates={408: 1.0}),
    "e409": ModelBehaviour(api_key=KEY, error_rates={409: 1.0}),
    "e500": ModelBehaviour(api_key=KEY, error_rates={500: 1.0}),
    "outage": ModelBehaviour(api_key=KEY, outages=((0.0, 1e9),)),
    "slow": ModelBehaviour(api_key=KEY, latency_s=(30.0, 30.0)),
    "malformed-body": ModelBehaviour(api_key=KEY, status_body_malformed=True),
    "context": ModelBehaviour(api_key=KEY, reject="context_length"),
    "missing": ModelBehaviour(api_key=KEY, reject="model_not_found"),
    "wrong-key": ModelBehaviour(api_key="sk-not-the-canary"),
    "forbidden": ModelBehaviour(api_key=KEY, reject="forbidden"),
    "policy": ModelBehaviour(api_key=KEY, reject="content_policy"),
    "bad-request": ModelBehaviour(api_key=KEY, reject="bad_request"),
    "unprocessable": ModelBehaviour(api_key=KEY, reject="unprocessable"),
    "stall": ModelBehaviour(api_key=KEY, stream_fault="stall"),
    "cut": ModelBehaviour(api_key=KEY, stream_fault="cut"),
    "malformed-chunk": ModelBehaviour(api_key=KEY, stream_fault="malformed"),
    "no-done": ModelBehaviour(api_key=KEY, stream_fault="no_done", reply="complete without done"),
    "slow-first-token": ModelBehaviour(api_key=KEY, stream_fault="slow_first_token"),
}

SourceFactory = Callable[..., Source]


def sdk_http_library() -> Any:
    """The HTTP library the installed openai SDK runs on: httpx2 in its later releases."""
    import openai  # noqa: PLC0415

    for name in ("httpx2", "httpx"):
        library = sys.modules.get(name)
        if library is not None and issubclass(openai.DefaultAsyncHttpxClient, library.AsyncClient):
            return library
    raise RuntimeError("the openai SDK runs on an HTTP library these tests do not know")


@pytest.fixture(scope="session")
def provider() -> Iterator[SimulatedProvider]:
    with SimulatedProvider(MODELS) as provider:
        yield provider


@pytest_asyncio.fixture(params=["http", "sdk"])
async def make_source(
    request: pytest.FixtureRequest, provider: SimulatedProvider
) -> AsyncIterator[SourceFactory]:
    """An adapter of the parametrized kind for a simulated model; clients closed after."""
    clients: list[Any] = []

    def build(model: str, *, url: str | None = None, **options: Any) -> Source:
        base = url or provider.url
        if request.param == "http":
            return OpenAIHttpSource(base_url=base, model=model, api_key=SecretStr(KEY), **options)
        import openai  # noqa: PLC0415

        options.pop("ocr_endpoint", None)
        client = openai.AsyncOpenAI(base_url=base, api_key=KEY)
        clients.append(client)
        return OpenAISDKSource(client, model=model, **options)

    build.kind = request.param  # type: ignore[attr-defined]
    yield build
    for client in clients:
        await client.close()
    await close_http_client()
