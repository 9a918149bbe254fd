"""A tiny OpenAI-compatible endpoint on the standard library alone, for the extras' checks:
it runs in a fresh virtualenv where only the extra under test is installed."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from polygate_celery import Gateway, parse_config

REPLY = "stub says hi"


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        body = json.dumps(
            {
                "id": "chatcmpl-stub",
                "object": "chat.completion",
                "created": 0,
                "model": "stub",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": REPLY},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6},
            }
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


def serve() -> str:
    """Start the endpoint on a free port in a daemon thread; returns its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/v1"


def ask(source: dict[str, Any], hooks: Sequence[Any] = ()) -> str:
    """One governed chat call (the in-memory store) to `source`, its events to `hooks`;
    the answer's text."""
    config = parse_config(
        {"sources": {"s": source}, "scopes": {"chat": {"kind": "chat", "sources": ["s"]}}}
    )

    async def call() -> str:
        gateway = Gateway(config, hooks=hooks)
        try:
            outcome = await gateway.chat("chat", [{"role": "user", "content": "hello"}])
        finally:
            await gateway.aclose()
        return str(outcome.value.text)

    return asyncio.run(call())
