"""Governance layer: the one loop and the `Gateway` that runs it."""

from polygate_celery.governance.gateway import Gateway
from polygate_celery.governance.loop import CallResult

__all__ = ["CallResult", "Gateway"]
