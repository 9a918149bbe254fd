"""Run in a virtualenv with `polygate_celery` alone (no extra): one governed call through a
`Gateway` on the in-memory store against a stub endpoint, and a clear message for each module
that needs an extra."""

from __future__ import annotations

import importlib

import stub_provider

text = stub_provider.ask({"base_url": stub_provider.serve(), "model": "stub"})
assert text == stub_provider.REPLY, text
print(f"governed call answered {text!r}")
for module, extra in (
    ("polygate_celery.celery", "celery"),
    ("polygate_celery.metrics", "prometheus"),
    ("polygate_celery.otel", "otel"),
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
