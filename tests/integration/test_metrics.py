"""The metrics exporter over HTTP: multiprocess counters and the store's gauges, one endpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis as sync_redis

from polygate_celery import parse_config
from polygate_celery.metrics import serve
from tests.conftest import unique_prefix

ROOT = Path(__file__).resolve().parents[2]
WRITER = """
from polygate_celery.core.outcome import AttemptRecord
from polygate_celery.metrics import PrometheusHook
from polygate_celery.telemetry import AttemptEvent
PrometheusHook()(AttemptEvent("s", 1, AttemptRecord("a", "rate_limited", 0.1, 0.0, 429)))
"""


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    prefix = unique_prefix()
    yield prefix
    client = sync_redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match=f"{{{prefix}}}*"):
        client.delete(key)


def config_toml(redis_url: str, prefix: str) -> str:
    return (
        f'[store]\nredis_url = "{redis_url}"\nkey_prefix = "{prefix}"\n\n'
        '[sources.a]\nmax_concurrency = 3\n\n[scopes.s]\nkind = "chat"\nsources = ["a"]\n'
    )


def test_serve_exposes_the_counters_of_other_processes_and_the_gauges(
    redis_url: str, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    for _ in range(2):
        subprocess.run([sys.executable, "-c", WRITER], cwd=ROOT, check=True)
    config = parse_config(
        {
            "store": {"redis_url": redis_url, "key_prefix": prefix},
            "sources": {"a": {"max_concurrency": 3}},
            "scopes": {"s": {"kind": "chat", "sources": ["a"]}},
        }
    )
    exporter = serve(config, 0, "127.0.0.1", apps=["pipeline"])
    try:
        text = httpx.get(f"http://127.0.0.1:{exporter.port}/metrics", timeout=10).text
    finally:
        exporter.close()
    lines = set(text.splitlines())
    assert 'polygate_attempts_total{outcome="rate_limited",scope="s",source="a"} 2.0' in lines
    assert "polygate_store_up 1.0" in lines
    assert 'polygate_permit_cap{source="a"} 3.0' in lines
    assert 'polygate_breaker_state{source="a"} 0.0' in lines
    assert 'polygate_scope_progress_age_seconds{scope="s"} +Inf' in lines
    assert 'polygate_parked_tasks{app="pipeline"} 0.0' in lines
    assert redis_url.rsplit("@", maxsplit=1)[-1] not in text  # no store address in a label


def test_the_exporter_command_serves_until_interrupted(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    path = tmp_path / "polygate.toml"
    path.write_text(config_toml(redis_url, prefix))
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    command = [sys.executable, "-m", "polygate_celery.metrics", "--config", str(path)]
    text = scrape_exporter(command, ROOT, env, signal.SIGINT)
    assert 'polygate_permits_in_use{source="a"} 0.0' in text


def test_the_exporter_command_explains_a_bad_config_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "polygate.toml"
    path.write_text('[scopes.s]\nkind = "chat"\nsources = ["missing"]\n')
    done = subprocess.run(
        [sys.executable, "-m", "polygate_celery.metrics", "--config", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("error: ")
    assert len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr


def test_the_metrics_command_scrapes_redis_without_the_sources_keys(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    """``polygate-celery metrics`` from a directory holding ``polygate.toml``, whose source
    names a key variable this host does not set; stopped by SIGTERM, as a service is."""
    keyed = config_toml(redis_url, prefix).replace(
        "[sources.a]\n", '[sources.a]\napi_key_env = "POLYGATE_TEST_UNSET_KEY"\n'
    )
    (tmp_path / "polygate.toml").write_text(keyed)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PROMETHEUS_MULTIPROC_DIR", "POLYGATE_CONFIG", "POLYGATE_TEST_UNSET_KEY")
    }
    env["PYTHONPATH"] = str(ROOT)
    command = [sys.executable, "-m", "polygate_celery", "metrics"]
    lines = set(scrape_exporter(command, tmp_path, env, signal.SIGTERM).splitlines())
    assert "polygate_store_up 1.0" in lines
    assert 'polygate_permit_cap{source="a"} 3.0' in lines
    assert 'polygate_breaker_state{source="a"} 0.0' in lines


def scrape_exporter(
    command: list[str], cwd: Path, env: dict[str, str], stop: signal.Signals
) -> str:
    """Start the exporter `command` on a free local port, scrape it once, stop it with
    `stop` and require a clean exit (0); the scraped text."""
    with subprocess.Popen(
        [*command, "--port", "0", "--addr", "127.0.0.1"],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            assert process.stdout is not None
            url = process.stdout.readline().split()[-1]
            assert url.startswith("http://127.0.0.1:")
            text = httpx.get(url, timeout=10).text
        finally:
            process.send_signal(stop)
        try:
            assert process.wait(60) == 0
        finally:
            if process.poll() is None:  # never left waiting on a hung child
                process.kill()
    return text
