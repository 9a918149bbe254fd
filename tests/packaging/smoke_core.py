"""Run in a virtualenv with `polygate_celery` alone (no extra): one governed call through a
`Gateway` on the in-memory store against a stub endpoint, and a clear message for each module
that needs an extra."""

from __future__ import annotations

import asyncio
import importlib

import stub_provider

from polygate_celery import Gateway, parse_config


async def main() -> None:
    config = parse_config(
        {
            "sources": {"stub": {"base_url": stub_provider.serve(), "model": "stub"}},
            "scopes": {"chat": {"kind": "chat", "sources": ["stub"]}},
        }
    )
    gateway = Gateway(config)  # the in-memory store
    try:
        outcome = await gateway.chat("chat", [{"role": "user", "content": "hello"}])
    finally:
        await gateway.aclose()
    assert outcome.value.text == stub_provider.REPLY, outcome
    print(f"governed call answered {outcome.value.text!r}")


asyncio.run(main())
for module, extra in (
    ("polygate_celery.celery", "celery"),
    ("polygate_celery.metrics", "prometheus"),
    ("polygate_celery.testing.simulator.server", "simulator"),
):
    try:
        importlib.import_module(module)
    except ImportError as exc:
        if f"pip install 'polygate_celery[{extra}]'" not in str(exc):
            raise AssertionError(f"{module}: {exc}") from exc
        print(f"{module}: {exc}")
    else:
        raise AssertionError(f"{module} imported without its extra")
