"""The code blocks of the README and the manual, read and run as the pages show them.

The convention every page follows:

- A fenced block whose first line is a comment naming a file (``# tasks.py``,
  ``# polygate.toml``, ``# conf/.env``) is written to that file in the page's
  scratch directory; the blocks of a page share one directory, in page order.
- Other ``python`` blocks run there with the project's Python, each in a process
  of its own (a top-level ``await`` runs on a fresh event loop). ``toml`` blocks
  are parsed, and validated with `parse_config` when they hold a configuration
  table (``[sources``, ``[scopes``, ``[store``, ``[deferral``...). ``json`` and
  ``yaml`` blocks are parsed. ``sh``, ``bash`` and ``shell`` blocks run with
  ``bash -euo pipefail``, PATH starting with the project Python's directory;
  a ``console`` block runs its ``$ `` lines (the others are their output), or
  all of it when none has a prompt. Each block has a timeout.
- ``text`` (``txt``, ``output``, ``plaintext``) blocks are output, never run. A
  block in any other language, or none, is refused unless it is a file block.
- A block that must not run carries, on the line right before its fence,
  ``<!-- not run: <reason> -->`` (or ``<!-- not run here: <reason> -->``). An
  empty reason is refused, and so is a marker that no fence follows.

Blocks get a Redis (``POLYGATE_STORE__REDIS_URL`` and ``POLYGATE_REDIS_URL``,
with ``POLYGATE_STORE__KEY_PREFIX`` a prefix of the page's own), no API key but a
dummy one for each ``*_API_KEY`` variable a block names, and a proxy that
refuses every connection beyond this machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from polygate_celery import parse_config
from polygate_celery.errors import ConfigError

PYTHON = ("python", "py", "python3")
SHELL = ("sh", "bash", "shell", "zsh")
CONSOLE = ("console",)
TOML = ("toml",)
DATA = ("json", "yaml", "yml")
OUTPUT = ("text", "txt", "output", "plaintext")
CONFIG_TABLES = (
    "sources",
    "scopes",
    "store",
    "deferral",
    "quotas",
    "source_defaults",
    "scope_defaults",
    "priorities",
    "tenants",
    "tenant_defaults",
)
TIMEOUT_S = 60.0
DUMMY_KEY = "sk-docs-dummy-not-a-key"
# A proxy nobody listens on: HTTP clients that honour the proxy variables fail at once
# instead of reaching the network.
NO_NETWORK_PROXY = "http://127.0.0.1:9"

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
_MARKER = re.compile(r"^\s*<!--\s*not run(?: here)?\s*:(?P<reason>.*?)-->\s*$")
_MARKER_START = re.compile(r"^\s*<!--\s*not run\b")
_FILE = re.compile(r"^\s*(?:#|//|--)\s*(?P<name>[\w.-]*(?:/[\w.-]+)*)\s*$")
_API_KEY = re.compile(r"\b[A-Z][A-Z0-9_]*_API_KEY\b")

# The Python every python block runs through: a top-level ``await`` is allowed.
_BOOT = """\
import ast, asyncio, sys
path = sys.argv[1]
sys.path.insert(0, "")
code = compile(open(path, encoding="utf-8").read(), path, "exec",
               flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
result = eval(code, {"__name__": "__main__", "__file__": path})
if asyncio.iscoroutine(result):
    asyncio.run(result)
"""


class PageError(AssertionError):
    """A page breaks the convention, or one of its blocks failed."""


@dataclass
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    skip_reason: str | None = None

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line} ({self.language or 'no language'})"

    @property
    def file_name(self) -> str | None:
        first = self.text.split("\n", 1)[0]
        found = _FILE.match(first)
        if not found:
            return None
        name = found.group("name")
        if re.search(r"\.\w+$", name) or "/" in name or name in {"Dockerfile", "Makefile"}:
            return name
        return None


@dataclass
class Page:
    path: Path
    blocks: list[Block] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def read_page(path: Path) -> Page:
    """The page's fenced blocks, each with its `not run` reason, and its problems."""
    page = Page(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        if _MARKER_START.match(line):
            marker = _MARKER.match(line)
            following = lines[index + 1] if index + 1 < len(lines) else ""
            if marker is None:
                page.problems.append(f"{path}:{index + 1}: a `not run` marker is not one line")
            elif not marker.group("reason").strip():
                page.problems.append(f"{path}:{index + 1}: a `not run` marker gives no reason")
            elif not _FENCE.match(following):
                page.problems.append(
                    f"{path}:{index + 1}: a `not run` marker must be right before a fence"
                )
        opened = _FENCE.match(line)
        if not opened:
            index += 1
            continue
        fence, indent = opened.group("fence"), opened.group("indent")
        info = opened.group("info").strip()
        language = re.split(r"[\s{]", info.lstrip("{").lstrip("."), maxsplit=1)[0].lower()
        body: list[str] = []
        end = index + 1
        while end < len(lines):
            closing = lines[end].strip()
            if closing.startswith(fence[0] * len(fence)) and not closing.strip(fence[0]):
                break
            body.append(lines[end].removeprefix(indent))
            end += 1
        else:
            page.problems.append(f"{path}:{index + 1}: a fence that is never closed")
        marker = _MARKER.match(lines[index - 1]) if index > 0 else None
        reason = marker.group("reason").strip() if marker else None
        page.blocks.append(Block(path, index + 1, language, "\n".join(body) + "\n", reason or None))
        index = end + 1
    for block in page.blocks:
        known = PYTHON + SHELL + CONSOLE + TOML + DATA + OUTPUT
        if block.skip_reason is None and block.file_name is None and block.language not in known:
            page.problems.append(
                f"{block.where}: a block in a language that is not run; use ```text for "
                "output, or say why it is not run (<!-- not run: reason -->)"
            )
    return page


def block_environment(redis_url: str, prefix: str, blocks: list[Block]) -> dict[str, str]:
    """The environment blocks run in: a Redis under the page's prefix, no real key."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.endswith("_API_KEY") and not name.startswith("POLYGATE_")
    }
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["POLYGATE_STORE__REDIS_URL"] = redis_url
    env["POLYGATE_REDIS_URL"] = redis_url
    env["POLYGATE_STORE__KEY_PREFIX"] = prefix
    for proxy in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        env[proxy] = NO_NETWORK_PROXY
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost,::1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    for block in blocks:
        for name in _API_KEY.findall(block.text):
            env[name] = DUMMY_KEY
    return env


def run_page(
    page: Page, scratch: Path, env: dict[str, str], timeout_s: float = TIMEOUT_S
) -> list[Block]:
    """Run the page's blocks in order in `scratch`; returns the blocks that ran or were
    written. Raises `PageError` for the page's problems (before anything runs) or at the
    first block that fails."""
    if page.problems:
        raise PageError("\n".join(page.problems))
    done = []
    for number, block in enumerate(page.blocks):
        if block.skip_reason is not None or block.language in OUTPUT:
            continue
        name = block.file_name
        if name is not None:
            target = scratch / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.text, encoding="utf-8")
        elif block.language in PYTHON:
            script = scratch / f".block_{number}.py"
            script.write_text(block.text, encoding="utf-8")
            _run(block, [sys.executable, "-c", _BOOT, str(script)], scratch, env, timeout_s)
        elif block.language in SHELL + CONSOLE:
            text = _console_commands(block.text) if block.language in CONSOLE else block.text
            _run(block, ["bash", "-euo", "pipefail", "-c", text], scratch, env, timeout_s)
        elif block.language in TOML:
            _check_toml(block)
        elif block.language in DATA:
            _check_data(block)
        done.append(block)
    return done


def _console_commands(text: str) -> str:
    commands = [line[2:] for line in text.splitlines() if line.startswith("$ ")]
    return "\n".join(commands) + "\n" if commands else text


def _run(block: Block, argv: list[str], cwd: Path, env: dict[str, str], timeout_s: float) -> None:
    """Run one block in a process group of its own: whatever it started (a worker sent to
    the background, a server) is killed with it when it ends or times out."""
    process = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(process.pid)
        stdout, stderr = process.communicate()
        raise PageError(
            f"{block.where}: still running after {timeout_s:g} s (a block that runs until "
            f"stopped says so: <!-- not run: reason -->)\n{_tail(stdout, stderr)}"
        ) from None
    finally:
        _kill_group(process.pid)
    if process.returncode != 0:
        raise PageError(f"{block.where}: exit status {process.returncode}\n{_tail(stdout, stderr)}")


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _tail(stdout: str | bytes | None, stderr: str | bytes | None, lines: int = 25) -> str:
    def text(value: str | bytes | None) -> str:
        return value.decode(errors="replace") if isinstance(value, bytes) else value or ""

    output = (text(stdout) + text(stderr)).rstrip().splitlines()
    return "\n".join(f"    {line}" for line in output[-lines:])


def _check_toml(block: Block) -> None:
    try:
        data = tomllib.loads(block.text)
    except tomllib.TOMLDecodeError as exc:
        raise PageError(f"{block.where}: not valid TOML: {exc}") from None
    if any(table in data for table in CONFIG_TABLES):
        try:
            parse_config(data)
        except ConfigError as exc:
            raise PageError(
                f"{block.where}: not a valid configuration ({exc}); a fragment says so: "
                "<!-- not run: a fragment of a configuration -->"
            ) from None


def _check_data(block: Block) -> None:
    try:
        if block.language == "json":
            json.loads(block.text)
        else:
            yaml.safe_load(block.text)
    except (ValueError, yaml.YAMLError) as exc:
        raise PageError(f"{block.where}: does not parse: {exc}") from None
