"""Testing: the simulator's streamed chat answer (server-sent events) and its faults.

A healthy stream is: a role chunk, the reply in ~4 content chunks (the drawn
latency spread between them), a chunk with `finish_reason`, a usage chunk when
asked for, then `data: [DONE]`. Each `stream_fault` departs from it at one point.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from polygate_celery.testing.simulator import answers
from polygate_celery.testing.simulator.behaviour import ModelBehaviour
from polygate_celery.testing.simulator.journal import Visit
from polygate_celery.testing.simulator.prompts import Prompt

# Content chunks sent before a `stall` or a `cut`.
CHUNKS_BEFORE_FAULT = 2
MALFORMED_LINE = b"data: {not json\n\n"
DONE_LINE = b"data: [DONE]\n\n"

Record = Callable[[Visit, int, str], None]


def _event(body: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(body).encode() + b"\n\n"


async def stream_chat(
    request: web.Request,
    visit: Visit,
    behaviour: ModelBehaviour,
    prompt: Prompt,
    answer_id: str,
    latency_s: float,
    record: Record,
    extra_headers: dict[str, str] | None = None,
) -> web.StreamResponse:
    """Send the answer as events; journal the outcome through `record`."""
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            **(extra_headers or {}),
        }
    )
    await response.prepare(request)
    visit.answered = 200
    fault = behaviour.stream_fault
    model, created = visit.model, int(time.time())
    pieces = answers.split_reply(prompt.answer)
    gap_s = latency_s / max(1, len(pieces))
    try:
        await asyncio.sleep(behaviour.first_token_delay_s())
        await response.write(
            _event(answers.chunk(answer_id, model, created, {"role": "assistant"}))
        )
        if fault == "malformed":
            await response.write(MALFORMED_LINE)
        for index, piece in enumerate(pieces):
            if fault in ("stall", "cut") and index == CHUNKS_BEFORE_FAULT:
                break
            await asyncio.sleep(gap_s)
            delta = {"content": piece}
            await response.write(_event(answers.chunk(answer_id, model, created, delta)))
        if fault == "stall":
            record(visit, 200, "stall")
            await asyncio.get_running_loop().create_future()  # until the client leaves
        if fault == "cut":
            record(visit, 200, "cut")
            if request.transport is not None:
                request.transport.abort()  # no final chunk, no [DONE], no end of body
            return response
        final = answers.chunk(answer_id, model, created, {}, prompt.finish_reason)
        await response.write(_event(final))
        if prompt.include_usage:
            await response.write(_event(answers.usage_chunk(answer_id, model, created, prompt)))
        if fault != "no_done":
            await response.write(DONE_LINE)
        await response.write_eof()
    except ConnectionError:
        record(visit, 200, "client-gone")
        return response
    record(visit, 200, fault or "ok")
    return response
