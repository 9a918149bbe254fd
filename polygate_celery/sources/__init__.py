"""Source layer: adapters that send one request to one model source and classify the outcome."""

from polygate_celery.sources.base import Source

__all__ = ["Source"]
