"""Run in a virtualenv with `polygate_celery[openai]` alone: one governed call through the
openai SDK adapter against a stub endpoint."""

from __future__ import annotations

import asyncio

import stub_provider

from polygate_celery import Gateway, parse_config


async def main() -> None:
    source = {"base_url": stub_provider.serve(), "model": "stub", "adapter": "openai-sdk"}
    config = parse_config(
        {
            "sources": {"stub": source},
            "scopes": {"chat": {"kind": "chat", "sources": ["stub"]}},
        }
    )
    gateway = Gateway(config)
    try:
        outcome = await gateway.chat("chat", [{"role": "user", "content": "hello"}])
    finally:
        await gateway.aclose()
    assert outcome.value.text == stub_provider.REPLY, outcome
    print(f"openai SDK adapter answered {outcome.value.text!r}")


asyncio.run(main())
