"""Hostile 2xx answers within the body limit cost bounded memory and never hold the event loop.

Each answer below fits under the package's default `max_body_bytes` (64 MiB) and
is sent whole, with its Content-Length, by a raw server in this process; the
call is made by a process of its own (`one_call`), both adapters, which
reports its outcome, how much its peak resident memory grew during the call,
and the longest its event loop went without a turn. Bounds (SPEC §5, issue 34):
peak growth <= 4 x max_body_bytes + 50 MB; the loop never held more than 0.5 s
of CPU time between two turns (and never 3 s of wall-clock time, which two
busy neighbours may stretch); an answer that cannot be decoded within the budget, in another charset
or not UTF-8, is a transient outcome saying it is malformed (HTTP 200).
"""

from __future__ import annotations

import array
import asyncio
import base64
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from polygate_celery.sources.body import MAX_LINE_BYTES
from polygate_celery.sources.decode import MAX_TOKEN_BYTES, budget_for
from polygate_celery.sources.exchange import MAX_BODY_BYTES
from tests.integration.sources.rawserver import RawServer, response, sse_head

ROOT = Path(__file__).resolve().parents[3]
MEMORY_BOUND = 4 * MAX_BODY_BYTES + 50_000_000
STALL_BOUND_S = 0.5  # CPU time the loop's thread spent between two turns of the loop
WALL_STALL_BOUND_S = 3.0  # the same gap in wall-clock time, stretched by a busy machine
SIZE = 63_000_000  # under the 64 MiB limit, like the 63 MB bodies of issue 34
ADAPTERS = ("http", "sdk")
OK = json.dumps({"model": "m", "choices": [{"index": 0, "message": {"content": "hi"}}]})
BUDGET_MIB = budget_for(MAX_BODY_BYTES).limit // 2**20
TOO_COSTLY = f"malformed answer: would take more than {BUDGET_MIB} MiB to decode"


def filled(opening: str, piece: str, closing: str, size: int = SIZE) -> bytes:
    """`opening`, then `piece` repeated (comma-separated) to about `size` bytes, then `closing`."""
    count = (size - len(opening) - len(closing)) // (len(piece) + 1)
    return (opening + ",".join([piece] * count) + closing).encode()


def in_completion(values: str) -> str:
    return '{"model":"m","choices":[{"index":0,"message":{"content":"hi","extra":' + values


COMPLETION_END = "}}]}"


def realistic_embeddings(size: int) -> bytes:
    """Two vectors of floats printed as providers print them, `size` bytes in all."""
    rng = random.Random(7)
    floats = [f"{rng.uniform(-0.1, 0.1):.16f}" for _ in range(4096)]
    per_vector = (size // 2) // 20
    vector = ",".join(floats[i % 4096] for i in range(per_vector))
    items = [f'{{"object":"embedding","index":{i},"embedding":[{vector}]}}' for i in range(2)]
    return ('{"object":"list","model":"m","data":[' + ",".join(items) + "]}").encode()


class Serve:
    """Answers the warm-up with a plain completion, the next request with `answer`."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.requests = 0

    async def __call__(self, writer: asyncio.StreamWriter) -> None:
        self.requests += 1
        writer.write(response(200, OK) if self.requests == 1 else self.answer)
        await writer.drain()


async def one_call(adapter: str, answer: bytes, request: str) -> dict[str, Any]:
    """What `one_call` reports of a call of `request` answered with `answer`."""
    async with RawServer(Serve(answer)) as server:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.integration.sources.one_call",
            adapter,
            server.url,
            request,
            cwd=ROOT,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(child.communicate(), timeout=100)
    assert child.returncode == 0, err.decode()[-2000:]
    report: dict[str, Any] = json.loads(out)
    assert report["warm_up"] == "success"
    assert report["longest_stall_cpu_s"] <= STALL_BOUND_S, report
    assert report["longest_stall_s"] <= WALL_STALL_BOUND_S, report
    assert report["growth"] <= MEMORY_BOUND, report
    return report


def json_answer(body: bytes, content_type: str = "application/json") -> bytes:
    return response(200, body, content_type=content_type)


def sse_answer(*chunks: bytes) -> bytes:
    return sse_head() + b"".join(b"data: " + c + b"\n\n" for c in chunks)


MANY_SMALL = {
    # name: (body, request) -- each ~63 MB of small JSON values under the 64 MiB limit
    "completion-of-empty-objects": (
        filled(in_completion("["), "{}", "]" + COMPLETION_END),
        "chat",
    ),
    "completion-of-empty-arrays": (
        filled(in_completion("["), "[]", "]" + COMPLETION_END),
        "chat",
    ),
    "completion-of-zeros-in-an-object": (
        filled(in_completion('{"a":['), "0", "]}" + COMPLETION_END),
        "chat",
    ),
    "embeddings-of-empty-objects": (
        filled('{"data":[{"index":0,"embedding":[0.5]},{"index":1,"embedding":[', "{}", "]}]}"),
        "embeddings",
    ),
    "embeddings-of-zeros": (
        filled('{"data":[{"index":0,"embedding":[', "0", ']},{"index":1,"embedding":[0]}]}'),
        "embeddings",
    ),
}


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("case", sorted(MANY_SMALL))
async def test_a_body_of_many_small_values_is_refused_within_the_bounds(
    adapter: str, case: str
) -> None:
    body, request = MANY_SMALL[case]
    assert len(body) < MAX_BODY_BYTES
    report = await one_call(adapter, json_answer(body), request)
    assert (report["kind"], report["status"], report["reason"]) == ("transient", 200, TOO_COSTLY)


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_a_stream_chunk_of_many_small_values_is_refused_within_the_bounds(
    adapter: str,
) -> None:
    opening = '{"model":"m","choices":[{"index":0,"delta":{"content":"hi"},"extra":['
    line = filled(opening, "{}", "]}]}", MAX_LINE_BYTES - 100)
    report = await one_call(adapter, sse_answer(line), "stream")
    assert (report["kind"], report["reason"]) == (
        "transient",
        f"malformed stream: would take more than {BUDGET_MIB} MiB to decode",
    )


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_a_stream_line_longer_than_any_chunk_is_refused_within_the_bounds(
    adapter: str,
) -> None:
    line = b'{"model":"m","choices":[{"index":0,"delta":{"content":"' + b"x" * SIZE + b'"}}]}'
    report = await one_call(adapter, sse_answer(line), "stream")
    assert (report["kind"], report["reason"]) == (
        "transient",
        "malformed stream: a line longer than 8 MiB",
    )


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_a_large_legitimate_embeddings_answer_is_read_within_the_bounds(
    adapter: str,
) -> None:
    body = realistic_embeddings(60_000_000)
    report = await one_call(adapter, json_answer(body), "embeddings")
    assert report["kind"] == "success", report
    assert report["vectors"] == [2, (60_000_000 // 2) // 20]
    assert report["vector_types"] == ["list"]
    assert report["float_types"] == ["float"]


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_the_largest_base64_embeddings_answer_is_read_within_the_bounds(
    adapter: str,
) -> None:
    """OpenAI's largest: 2,048 inputs, 3,072 float32s each, in base64 (as the SDK asks)."""
    rng = random.Random(3)
    vector = array.array("f", [rng.uniform(-0.1, 0.1) for _ in range(3072)])
    if sys.byteorder == "big":
        vector.byteswap()
    packed = base64.b64encode(vector.tobytes()).decode()
    items = [{"object": "embedding", "index": i, "embedding": packed} for i in range(2048)]
    body = json.dumps({"object": "list", "model": "m", "data": items}).encode()
    report = await one_call(adapter, json_answer(body), "embeddings-2048")
    assert report["kind"] == "success", report
    assert report["vectors"] == [2048, 3072]
    assert report["float_types"] == ["float"]


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_a_long_legitimate_completion_is_read_within_the_bounds(adapter: str) -> None:
    text = "é" * (MAX_TOKEN_BYTES // 2 - 100)  # two bytes each: 4 MiB, longer than models write
    body = '{"model":"m","choices":[{"index":0,"message":{"content":"' + text + '"}}]}'
    report = await one_call(adapter, json_answer(body.encode()), "chat")
    assert (report["kind"], report["text_length"]) == ("success", len(text)), report


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_a_string_longer_than_any_answer_is_refused_within_the_bounds(adapter: str) -> None:
    text = "é" * (SIZE // 2 - 100)
    body = '{"model":"m","choices":[{"index":0,"message":{"content":"' + text + '"}}]}'
    report = await one_call(adapter, json_answer(body.encode()), "chat")
    assert (report["kind"], report["status"], report["reason"]) == (
        "transient",
        200,
        "malformed answer: a single value longer than 4 MiB",
    )
