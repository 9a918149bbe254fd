"""The Redis store over TLS (``rediss://``): a private ``redis-server --tls-port`` with a
self-signed certificate made for the test; the certificate is checked, never skipped."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from polygate_celery import Gateway, GatewayConfig, GovernanceBackendError, parse_config
from polygate_celery.clock import SystemClock
from polygate_celery.store.redis import sync_redis_client
from polygate_celery.testing import ScriptedSource, steps
from tests.redis_server import free_port, server_binary


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    """(TLS port, CA certificate) of a private server that speaks TLS only."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: no certificate for the TLS server")
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True,
    )  # fmt: skip
    port = free_port()
    process = subprocess.Popen(
        [server_binary(), "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(cert), "--tls-key-file", str(key),
         "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no",
         "--save", "", "--appendonly", "no", "--dir", str(where)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not _answers(port, cert):
            assert process.poll() is None, "this redis-server cannot serve TLS"
            assert time.monotonic() < deadline, "the TLS server did not start"
            time.sleep(0.05)
        yield port, cert
    finally:
        process.terminate()
        process.wait(10)


def _answers(port: int, cert: Path) -> bool:
    client = sync_redis_client(f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={cert}")
    try:
        return bool(client.ping())
    except Exception:
        return False
    finally:
        client.close()


def config_for(url: str) -> GatewayConfig:
    return parse_config(
        {
            "store": {"redis_url": url, "key_prefix": "tls-test", "socket_timeout_s": 1},
            "sources": {"a": {}},
            "scopes": {"s": {"kind": "chat", "sources": ["a"], "stall_window_s": 1}},
        }
    )


async def test_a_governed_call_runs_over_tls_with_the_certificate_checked(
    tls_server: tuple[int, Path],
) -> None:
    port, cert = tls_server
    config = config_for(f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={cert}")
    gateway = Gateway(config, {"a": ScriptedSource.always(SystemClock(), steps.ok("over tls"))})
    try:
        assert (await gateway.call("s", "x")).value == "over tls"
        assert await gateway.store.client.exists(gateway.store.keys.progress("s")) == 1
    finally:
        await gateway.store.client.delete(gateway.store.keys.progress("s"))
        await gateway.aclose()


async def test_a_server_whose_certificate_is_not_trusted_fails_closed(
    tls_server: tuple[int, Path],
) -> None:
    port, _ = tls_server
    source = ScriptedSource.always(SystemClock(), steps.ok("never sent"))
    gateway = Gateway(config_for(f"rediss://127.0.0.1:{port}/0"), {"a": source})
    try:
        with pytest.raises(GovernanceBackendError):
            await gateway.call("s", "x")
        assert source.attempts == 0  # nothing went out without the store's word
    finally:
        await gateway.aclose()


def test_the_blocking_client_of_the_celery_runtime_speaks_tls(
    tls_server: tuple[int, Path],
) -> None:
    port, cert = tls_server
    client = sync_redis_client(f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={cert}")
    try:
        assert client.set("tls-test:marker", "1", ex=5)
        assert client.get("tls-test:marker") == "1"
        client.delete("tls-test:marker")
    finally:
        client.close()
