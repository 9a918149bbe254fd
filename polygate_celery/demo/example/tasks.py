"""The pipeline's Celery tasks: OCR every page, embed its chunks, summarise the document.

Run a worker (from the repository root, or anywhere with the package installed)::

    celery -A examples.pipeline.tasks worker --pool threads --concurrency 16
    celery -A polygate_celery.demo.example.tasks worker --pool threads --concurrency 16

and send documents with `process` (see README.md beside this file). The tasks carry
explicit names (``pipeline.*``), so both module paths name the same tasks.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from celery import Celery, chain, chord, group
from celery.canvas import Signature

from polygate_celery import load_config
from polygate_celery.celery import GovernedCalls, configure_worker, governed

CONFIG = load_config(os.environ.get("POLYGATE_CONFIG") or Path(__file__).with_name("polygate.toml"))
REDIS = CONFIG.store.redis_url.get_secret_value() if CONFIG.store.redis_url else None

app = Celery("pipeline", broker=REDIS, backend=REDIS)
configure_worker(app, CONFIG)
CHUNK = 400


@app.task(name="pipeline.ocr_page")
@governed("ocr")
def ocr_page(calls: GovernedCalls, document_id: str, page: int, image_b64: str) -> str:
    """The text of one scanned page."""
    return str(calls.ocr(base64.b64decode(image_b64)).value.text)


@app.task(name="pipeline.embed_page")
@governed("embed")
def embed_page(calls: GovernedCalls, text: str) -> str:
    """Embed a page's chunks in one batched request; pass its text on."""
    chunks = [text[i : i + CHUNK] for i in range(0, len(text), CHUNK)] or [text]
    calls.embed(chunks)  # a real pipeline stores these vectors
    return text


@app.task(name="pipeline.summarise")
@governed("summarise", reuse_results=True)
def summarise(calls: GovernedCalls, pages: list[str], document_id: str) -> str:
    """A summary of the whole document, from its pages' text."""
    prompt = [
        {"role": "system", "content": "Summarise the document in three sentences."},
        {"role": "user", "content": "\n\n".join(pages)},
    ]
    return str(calls.chat(prompt, max_tokens=200).value.text)


def process(
    document_id: str,
    page_images: Sequence[bytes],
    task_id: Callable[[str, int], str] | None = None,
) -> Signature:
    """The whole document as one Celery canvas: per page OCR → embed, then summarise.

    `task_id(step, page)` may name each task (page -1 for the summary).
    """

    def named(signature: Signature, step: str, page: int) -> Signature:
        return signature.set(task_id=task_id(step, page)) if task_id else signature

    pages = [
        chain(
            named(ocr_page.s(document_id, n, base64.b64encode(image).decode()), "ocr", n),
            named(embed_page.s(), "embed", n),
        )
        for n, image in enumerate(page_images)
    ]
    return chord(group(pages), named(summarise.s(document_id), "summarise", -1))
