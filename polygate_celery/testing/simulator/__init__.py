"""Testing: a simulated OpenAI-compatible provider — a real HTTP server with scripted misbehaviour.

Each model gets a `ModelBehaviour`: capacity, rpm/tpm windows, latency, error
rates, queueing, outages, 429 hint styles, fixed rejections and stream faults.
Every request is journalled (`JournalEntry`), never with its key::

    models = {"gpt-sim": ModelBehaviour(capacity=2, latency_s=(0.05, 0.1))}
    with SimulatedProvider(models) as provider:
        client = openai.OpenAI(base_url=provider.url, api_key="unused")
        ...
        assert provider.peak("gpt-sim") <= 2

Endpoints under ``/v1``: ``POST /chat/completions`` (streamed or not, text and
base64 images), ``POST /embeddings`` and ``POST /ocr``. From a shell:
``python -m polygate_celery.testing.simulator --port 8000 --config models.json``.

The server needs aiohttp (``pip install 'polygate_celery[simulator]'``); only
this package imports it.
"""

from polygate_celery.testing.simulator.behaviour import ModelBehaviour
from polygate_celery.testing.simulator.journal import JournalEntry
from polygate_celery.testing.simulator.provider import SimulatedProvider

__all__ = ["JournalEntry", "ModelBehaviour", "SimulatedProvider"]
