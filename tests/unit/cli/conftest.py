"""The command line, run in-process: configuration files, a private key prefix, output capture.

`main()` is called as the console script calls it; a Redis the commands need
is the session's (`redis_url`), under a key prefix of the test's own, deleted
afterwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
import redis

from polygate_celery.cli import main
from polygate_celery.store.redis import RedisStore
from tests.conftest import unique_prefix

T = TypeVar("T")
SECRET_KEY = "sk-secret-4d1f0c2b9e"
PASSWORD = "p4ssw0rd"

SOURCES = f"""
[sources.vllm]
base_url = "http://127.0.0.1:9/v1"
model = "qwen"
max_concurrency = 8

[sources.hosted]
base_url = "http://127.0.0.1:9/v1"
model = "gpt"
api_key = "{SECRET_KEY}"
max_concurrency = 4
quota = "provider"

[sources.embedder]
base_url = "http://127.0.0.1:9/v1"
model = "bge"
timeout_s = 10
rpm = 600
tpm = 100000

[quotas.provider]
rpm = 90

[scopes.summarise]
kind = "chat"
sources = ["vllm", "hosted"]

[scopes.embed]
kind = "embedding"
sources = ["embedder"]
"""


@dataclass
class Ran:
    code: int
    out: str
    err: str

    @property
    def error_line(self) -> str:
        """The one line a user mistake prints, checked to be one `error:` line, no traceback."""
        assert self.code == 2, self
        assert self.out == "", self
        lines = self.err.splitlines()
        assert len(lines) == 1, self.err
        assert lines[0].startswith("error: "), self.err
        assert "Traceback" not in self.err
        return lines[0]


Cli = Callable[..., Ran]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Cli:
    """Run ``polygate-celery ARGS...``; argparse's exits count as exit statuses."""

    def run(*argv: str) -> Ran:
        capsys.readouterr()
        try:
            code = main(list(argv))
        except SystemExit as exited:
            code = exited.code if isinstance(exited.code, int) else 1
        captured = capsys.readouterr()
        return Ran(code, captured.out, captured.err)

    return run


def write(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.fixture
def local_config(tmp_path: Path) -> str:
    """The small configuration on the in-memory store (no Redis)."""
    return write(tmp_path / "local.toml", SOURCES)


@dataclass
class Fleet:
    """A configuration on the session's Redis under a private prefix, and a store on it."""

    url: str
    prefix: str
    path: str

    def run(self, work: Callable[[RedisStore], Awaitable[T]]) -> T:
        """Run `work` on a store of this fleet (to set up or inspect state)."""

        async def go() -> T:
            store = RedisStore.from_url(self.url, prefix=self.prefix)
            try:
                return await work(store)
            finally:
                await store.aclose()

        return asyncio.run(go())


def with_password(url: str) -> str:
    """`url` with a password the local Redis (no ``requirepass``) accepts and ignores."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://:{PASSWORD}@{rest.rpartition('@')[2]}"


@pytest.fixture
def fleet(redis_url: str, tmp_path: Path) -> Iterator[Fleet]:
    prefix = unique_prefix()
    store = f'[store]\nredis_url = "{with_password(redis_url)}"\nkey_prefix = "{prefix}"\n'
    yield Fleet(redis_url, prefix, write(tmp_path / "fleet.toml", store + SOURCES))
    client = redis.Redis.from_url(redis_url)
    with client:
        keys = list(client.scan_iter(match=f"{{{prefix}}}:*"))
        if keys:
            client.delete(*keys)
