"""Testing: the simulator's command line — serve simulated models until Ctrl-C.

    python -m polygate_celery.testing.simulator --port 8000 --config models.json

The JSON maps model names to `ModelBehaviour` fields (tuples as lists); without it,
any model name is served, answering at once. The first line printed is the base
URL, so scripts can read it (useful with --port 0).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from polygate_celery.testing.simulator.behaviour import ModelBehaviour
from polygate_celery.testing.simulator.provider import SimulatedProvider


def load_models(path: Path) -> dict[str, ModelBehaviour]:
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected an object mapping model names to behaviours")
    return {str(name): ModelBehaviour.from_dict(fields) for name, fields in data.items()}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m polygate_celery.testing.simulator",
        description="Serve a simulated OpenAI-compatible provider.",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (0.0.0.0 in a container)"
    )
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument("--config", type=Path, help="JSON: model name -> ModelBehaviour fields")
    parser.add_argument("--seed", type=int, default=0, help="seed for latencies and errors")
    return parser


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        models = load_models(args.config) if args.config else {}
    except (OSError, ValueError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # Without --config, any model name is served, well-behaved: a configuration's own
    # model names work as they are.
    any_model = None if args.config else ModelBehaviour()
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    with SimulatedProvider(
        models, port=args.port, seed=args.seed, host=args.host, any_model=any_model
    ) as provider:
        print(provider.url, flush=True)
        served = ", ".join(models) if models else "any name, answering at once"
        print(f"models: {served} (Ctrl-C to stop)", file=sys.stderr, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
