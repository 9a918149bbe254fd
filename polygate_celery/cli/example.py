"""Edge (CLI): `polygate-celery example WHAT`, the files the documentation points to, as
installed with the package (no clone needed).

- ``env``: ``.env.example``, every ``POLYGATE_*`` variable with its default;
- ``config``: the example pipeline's ``polygate.toml``;
- ``tasks``: its ``tasks.py``;
- ``models``: its simulated provider's ``models.json``
  (``python -m polygate_celery.testing.simulator --config models.json``).
"""

from __future__ import annotations

import argparse
from importlib.resources import files

from polygate_celery.cli.errors import Commands

EXAMPLES = {
    "env": ("polygate_celery.config", "env.example"),
    "config": ("polygate_celery.demo.example", "polygate.toml"),
    "tasks": ("polygate_celery.demo.example", "tasks.py"),
    "models": ("polygate_celery.demo.example", "models.json"),
}


def add_command(commands: Commands) -> None:
    parser = commands.add_parser(
        "example",
        help="print an example file: env (.env.example), config, tasks or models",
        description="Print one of the example files shipped with the package, to redirect "
        "into a file of your own: polygate-celery example env > .env",
    )
    parser.add_argument("what", choices=sorted(EXAMPLES), help="which file")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    package, name = EXAMPLES[args.what]
    print(files(package).joinpath(name).read_text(encoding="utf-8"), end="")
    return 0
