"""Fuzzed inputs: configuration, provider responses and streams, Retry-After, deferral headers.

Every target takes at least 1,000 derandomized examples and may only answer with
its typed result or its typed error: never another exception, never a hang.
Provider responses reach the real adapters through their HTTP library's own
`MockTransport`, so the whole parsing path after the socket runs unchanged.
"""

from __future__ import annotations

import asyncio
import json
import math
import string
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import openai
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from polygate_celery import ConfigError, GatewayConfig, load_config, parse_config
from polygate_celery.celery.deferral import DeferralState
from polygate_celery.core.outcome import Outcome, OutcomeKind, RateLimits
from polygate_celery.sources import ChatRequest, ChatResult, EmbeddingRequest
from polygate_celery.sources.classify import rate_limits, retry_after_s
from polygate_celery.sources.http import OpenAIHttpSource
from polygate_celery.sources.sdk import OpenAISDKSource
from polygate_celery.sources.sdk_http import bounded_http_client
from tests.integration.sources.conftest import sdk_http_library

FUZZ = settings(
    max_examples=1_000,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
KEY = "sk-fuzz-canary-0123456789"

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=8,
)

# -- configuration ------------------------------------------------------------------------------

VALID: dict[str, Any] = {
    "store": {"redis_url": "redis://127.0.0.1:6379/0", "key_prefix": "fuzz"},
    "source_defaults": {"timeout_s": 30, "max_concurrency": 8},
    "sources": {
        "a": {"base_url": "http://127.0.0.1:1/v1", "model": "m", "rpm": 60, "api_key": KEY},
        "b": {"base_url": "http://127.0.0.1:1/v1", "model": "n", "breaker": {"cooldown_s": 5}},
    },
    "quotas": {},
    "scopes": {"chat": {"kind": "chat", "sources": ["a", "b"], "stall_window_s": 60}},
    "deferral": {"strategy": "park", "growth": 2.0},
}


def paths(data: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [prefix] if prefix else []
    if isinstance(data, dict):
        for key, value in data.items():
            found += paths(value, (*prefix, key))
    return found


def mutated(data: dict[str, Any], path: tuple[str, ...], value: Any, drop: bool) -> dict[str, Any]:
    copy = json.loads(json.dumps(data))
    node = copy
    for key in path[:-1]:
        node = node[key]
    if drop:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value
    return copy


@FUZZ
@given(
    path=st.sampled_from(paths(VALID)),
    value=json_values,
    drop=st.booleans(),
    extra=st.dictionaries(st.text(max_size=8), json_values, max_size=2),
)
def test_a_mutated_configuration_loads_or_names_a_field(
    path: tuple[str, ...], value: Any, drop: bool, extra: dict[str, Any]
) -> None:
    data = mutated(VALID, path, value, drop)
    data.update(extra)
    result = loaded(parse_config, data)
    if isinstance(result, ConfigError):
        assert result.field
        assert KEY not in str(result)  # a rejected key is never echoed
    else:
        assert isinstance(result, GatewayConfig)


def loaded(load: Any, *args: Any) -> Any:
    """What `load` returns, or the `ConfigError` it raises (any other exception fails)."""
    try:
        return load(*args)
    except ConfigError as error:
        return error


toml_texts = st.one_of(
    st.text(max_size=300),
    st.lists(
        st.tuples(
            st.sampled_from(sorted(p[0] for p in paths(VALID))), st.text(max_size=12), json_scalars
        ),
        max_size=6,
    ).map(lambda rows: "\n".join(f"[{t}]\n{k!r} = {json.dumps(v)}" for t, k, v in rows)),
)


@FUZZ
@given(text=toml_texts)
def test_any_configuration_file_loads_or_is_one_config_error(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.toml"
        path.write_text(text, encoding="utf-8")
        result = loaded(load_config, path)
    assert isinstance(result, (GatewayConfig, ConfigError))
    if isinstance(result, ConfigError):
        assert result.field


# -- Retry-After ---------------------------------------------------------------------------------

header_values = (
    st.text(max_size=40)
    | st.floats(allow_nan=True, allow_infinity=True).map(str)
    | st.integers(min_value=-(10**30), max_value=10**30).map(str)
    | st.datetimes().map(lambda d: d.strftime("%a, %d %b %Y %H:%M:%S GMT"))
)


@FUZZ
@given(
    headers=st.dictionaries(
        st.sampled_from(["Retry-After", "retry-after", "Retry-After-Ms", "retry-after-ms", "x"]),
        header_values,
        max_size=3,
    )
)
def test_retry_after_is_a_finite_non_negative_number_or_none(headers: dict[str, str]) -> None:
    hint = retry_after_s(headers, now=1_700_000_000.0)
    assert hint is None or (math.isfinite(hint) and hint >= 0)


# -- rate-limit headers --------------------------------------------------------------------------

LIMIT_NAMES = [
    name
    for kind in ("requests", "tokens")
    for part in ("limit", "remaining", "reset")
    for name in (f"x-ratelimit-{part}-{kind}", f"anthropic-ratelimit-{kind}-{part}")
]
limit_values = (
    header_values
    | st.builds("{}h{}m{}s".format, st.integers(0, 10**6), st.integers(0, 99), st.floats(0, 1e6))
    | st.integers(0, 10**6).map("{}ms".format)
    | st.datetimes(timezones=st.timezones()).map(lambda d: d.isoformat())
)


@FUZZ
@given(
    headers=st.dictionaries(
        st.sampled_from([*LIMIT_NAMES, "anthropic-ratelimit-input-tokens-reset", "retry-after"]),
        limit_values,
        max_size=6,
    )
)
def test_rate_limits_are_sane_numbers_or_none(headers: dict[str, str]) -> None:
    limits = rate_limits(headers, now=1_700_000_000.0)
    assert (limits is None) == (not set(headers) & set(LIMIT_NAMES))
    for name in RateLimits.__slots__ if limits is not None else ():
        value = getattr(limits, name)
        if name.endswith("_reset_s"):
            assert value is None or (isinstance(value, float) and math.isfinite(value))
        else:
            assert value is None or (isinstance(value, int) and value < 2**64)
        assert value is None or value >= 0


# -- provider responses --------------------------------------------------------------------------


def openai_like(draw: st.DrawFn) -> Any:
    """A chat or embedding answer with fields replaced, dropped or mistyped."""
    answer: dict[str, Any] = {
        "id": "x",
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
        ],
        "data": [{"index": 0, "embedding": [0.1, 0.2]}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        "error": {"message": "boom", "type": "server_error", "code": None},
    }
    for _ in range(draw(st.integers(0, 4))):
        target = draw(st.sampled_from(paths(answer) or [("id",)]))
        answer = mutated(answer, target, draw(json_values), draw(st.booleans()))
    return answer


bodies = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=200).map(str.encode),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.composite(openai_like)().map(lambda v: json.dumps(v).encode()),
)
sse_lines = st.one_of(
    st.text(alphabet=string.printable, max_size=60),
    st.just("data: [DONE]"),
    json_values.map(lambda v: "data: " + json.dumps(v)),
    st.composite(openai_like)().map(lambda v: "data: " + json.dumps(v)),
    st.just(": keep-alive"),
)
statuses = st.sampled_from(
    [200, 200, 200, 400, 401, 403, 404, 408, 409, 413, 422, 429, 500, 502, 503, 504]
) | st.integers(100, 599)
headers = st.dictionaries(
    st.sampled_from(["retry-after", "retry-after-ms", "content-type", "x-request-id"]),
    st.text(alphabet=string.printable.strip(), max_size=30),
    max_size=3,
)


class Provider:
    """One event loop and one adapter of a kind for every example; each example sets the answer.

    The openai SDK adapter's client carries the body-limit hook, as configured ones do.
    """

    def __init__(self, kind: str) -> None:
        self.runner = asyncio.Runner()
        self.library = httpx if kind == "http" else sdk_http_library()
        self.answer = self.library.Response(200)
        self.source = self.runner.run(self._source(kind))

    async def _source(self, kind: str) -> Any:
        transport = self.library.MockTransport(lambda request: self.answer)
        if kind == "http":
            client = httpx.AsyncClient(transport=transport)
            return OpenAIHttpSource(
                base_url="http://provider/v1", model="m", api_key=SecretStr(KEY), client=client
            )
        http_client = bounded_http_client(1_000_000, transport=transport)
        sdk = openai.AsyncOpenAI(
            base_url="http://provider/v1", api_key=KEY, http_client=http_client
        )
        return OpenAISDKSource(sdk, model="m")

    def send(self, status: int, hdrs: dict[str, str], body: bytes, request: object) -> Outcome:
        self.answer = self.library.Response(status, headers=hdrs, content=body)
        return self.runner.run(self.source.send(request, timeout_s=5.0))  # type: ignore[no-any-return]


_providers: dict[str, Provider] = {}


def send(
    status: int, hdrs: dict[str, str], body: bytes, request: object, kind: str = "http"
) -> Outcome:
    """One answer through the adapter of `kind`, one loop and client for the module's examples."""
    if kind not in _providers:
        _providers[kind] = Provider(kind)
    return _providers[kind].send(status, hdrs, body, request)


def check(outcome: Outcome) -> None:
    assert isinstance(outcome, Outcome)
    assert isinstance(outcome.kind, OutcomeKind)
    assert KEY not in repr(outcome)
    if outcome.retry_after_s is not None:
        assert math.isfinite(outcome.retry_after_s)
        assert outcome.retry_after_s >= 0


@FUZZ
@given(status=statuses, hdrs=headers, body=bodies)
def test_any_chat_answer_is_a_classified_outcome(
    status: int, hdrs: dict[str, str], body: bytes
) -> None:
    check(send(status, hdrs, body, ChatRequest([{"role": "user", "content": "hi"}], stream=False)))


@FUZZ
@given(status=statuses, hdrs=headers, body=bodies)
def test_any_embedding_answer_is_a_classified_outcome(
    status: int, hdrs: dict[str, str], body: bytes
) -> None:
    check(send(status, hdrs, body, EmbeddingRequest(["a", "b"])))


@FUZZ
@given(status=statuses, lines=st.lists(sse_lines, max_size=12))
def test_any_stream_is_a_classified_outcome(status: int, lines: list[str]) -> None:
    body = "\n\n".join(lines).encode()
    request = ChatRequest([{"role": "user", "content": "hi"}], stream=True)
    outcome = send(status, {"content-type": "text/event-stream"}, body, request)
    check(outcome)
    if outcome.kind is OutcomeKind.SUCCESS:
        assert isinstance(outcome.value, ChatResult)


@FUZZ
@given(status=statuses, hdrs=headers, body=bodies, streamed=st.booleans())
def test_any_answer_through_the_openai_sdk_is_a_classified_outcome(
    status: int, hdrs: dict[str, str], body: bytes, streamed: bool
) -> None:
    if streamed:
        hdrs = {**hdrs, "content-type": "text/event-stream"}
    request = ChatRequest([{"role": "user", "content": "hi"}], stream=streamed)
    outcome = send(status, hdrs, body, request, "sdk")
    check(outcome)
    if outcome.kind is OutcomeKind.SUCCESS:
        assert isinstance(outcome.value, ChatResult)


ascii_values = (header_values | limit_values).map(lambda v: v.encode("ascii", "ignore").decode())


@FUZZ
@given(
    kind=st.sampled_from(["http", "sdk"]),
    hdrs=st.dictionaries(
        st.sampled_from(["retry-after", "retry-after-ms", "content-type", *LIMIT_NAMES]),
        ascii_values,
        max_size=4,
    ),
    body=bodies,
    streamed=st.booleans(),
)
def test_any_429_is_rate_limited_by_both_adapters(
    kind: str, hdrs: dict[str, str], body: bytes, streamed: bool
) -> None:
    request = ChatRequest([{"role": "user", "content": "hi"}], stream=streamed)
    outcome = send(429, hdrs, body, request, kind)
    check(outcome)
    assert (outcome.kind, outcome.status) == (OutcomeKind.RATE_LIMITED, 429)
    assert (outcome.limits is None) == (rate_limits(hdrs) is None)


# -- deferral headers ----------------------------------------------------------------------------


@FUZZ
@given(
    headers=st.none()
    | st.dictionaries(
        st.sampled_from(
            ["polygate_deferrals", "polygate_grown", "polygate_first_deferred_at", "other"]
        ),
        json_scalars | st.lists(json_scalars, max_size=2),
        max_size=4,
    )
)
def test_any_deferral_headers_read_as_a_sane_state(headers: dict[str, Any] | None) -> None:
    task = SimpleNamespace(request=SimpleNamespace(headers=headers))
    state = DeferralState.of(task)  # type: ignore[arg-type]
    assert isinstance(state.count, int)
    assert state.count >= 0
    assert 0 <= state.grown <= state.count
    assert state.first_at is None or isinstance(state.first_at, float)
