"""Run in a virtualenv with `polygate_celery[prometheus]` alone: the hook's metrics render."""

from __future__ import annotations

from prometheus_client import generate_latest

from polygate_celery.metrics import PrometheusHook

PrometheusHook()
text = generate_latest().decode()
assert "polygate" in text, text[:500]
print(f"prometheus metrics: {text.count('polygate')} polygate lines")
