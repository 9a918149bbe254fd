"""Send documents to the pipeline's workers and print each summary as it comes back.

    python -m examples.pipeline.send 3            # from the repository root
    python -m polygate_celery.demo.example.send 3  # from the installed package
    docker compose run --rm worker python -m examples.pipeline.send 3   # into the compose fleet

It reads the configuration as the workers do (``$POLYGATE_CONFIG`` and ``POLYGATE_*``
variables, else the ``polygate.toml`` beside it): the store's Redis is the broker and
the result backend. Exit 1 if a document did not come back within ``--timeout``.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from collections.abc import Sequence

from celery.exceptions import TimeoutError as ResultTimeout

from .tasks import process


def page_images(document: int, pages: int) -> list[bytes]:
    """Stand-ins for scanned pages (the simulated provider reads any bytes)."""
    return [bytes([document % 251]) * (3000 + 997 * page) for page in range(pages)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m examples.pipeline.send", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("documents", type=int, nargs="?", default=3, help="how many (default 3)")
    parser.add_argument("--pages", type=int, default=2, help="pages per document (default 2)")
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds to wait (default 300)"
    )
    args = parser.parse_args(argv)
    batch = uuid.uuid4().hex[:6]
    sent = {
        f"doc-{batch}-{n}": process(f"doc-{batch}-{n}", page_images(n, args.pages)).apply_async()
        for n in range(args.documents)
    }
    print(f"sent {len(sent)} documents of {args.pages} pages", flush=True)
    late = 0
    for document, result in sent.items():
        try:
            print(f"{document}: {result.get(timeout=args.timeout)}", flush=True)
        except ResultTimeout:
            print(f"{document}: no summary within {args.timeout:g} s", flush=True)
            late += 1
    return 1 if late else 0


if __name__ == "__main__":
    sys.exit(main())
