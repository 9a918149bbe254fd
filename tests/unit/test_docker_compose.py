"""`docker-compose.yml`: Redis that keeps what governance and Celery rely on, and a real worker."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
APP_DIR = "/app"  # the image's WORKDIR, where the repository's files are copied


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    return data


def service(compose: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = compose["services"][name]
    return found


def argv(command: str | list[str]) -> list[str]:
    return command.split() if isinstance(command, str) else [str(part) for part in command]


def options(command: list[str]) -> dict[str, str]:
    """``--name value`` pairs of a command line."""
    return {
        name: value
        for name, value in zip(command, [*command[1:], ""], strict=True)
        if name.startswith("--")
    }


def environment(entry: dict[str, Any]) -> dict[str, str]:
    env = entry.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def test_redis_keeps_governance_state_and_unacknowledged_tasks(compose: dict[str, Any]) -> None:
    redis = service(compose, "redis")
    assert str(redis["image"]).startswith("redis:7")
    command = argv(redis["command"])
    assert command[0] == "redis-server"
    assert options(command)["--appendonly"] == "yes"
    assert options(command)["--maxmemory-policy"] == "noeviction"
    assert "redis-cli" in argv(redis["healthcheck"]["test"])
    volume, _, target = redis["volumes"][0].partition(":")
    assert target == "/data"
    assert volume in compose["volumes"]  # a named volume, not a bind mount


def test_published_ports_stay_on_the_loopback_interface(compose: dict[str, Any]) -> None:
    for entry in compose["services"].values():
        for port in entry.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{port} is reachable from outside"


def test_the_worker_is_a_celery_worker_of_the_example_pipeline(compose: dict[str, Any]) -> None:
    worker = service(compose, "worker")
    command = argv(worker["command"])
    assert command[:4] == ["celery", "-A", "examples.pipeline.tasks", "worker"]
    assert options(command)["--loglevel"] == "INFO"
    assert worker["depends_on"]["redis"]["condition"] == "service_healthy"
    assert worker["build"] in (".", {"context": "."})
    dockerfile = DOCKERFILE.read_text(encoding="utf-8")
    assert f"WORKDIR {APP_DIR}" in dockerfile
    assert "pip install '.[celery,simulator,prometheus]'" in dockerfile
    assert "COPY examples ./examples" in dockerfile


def test_the_worker_reads_the_example_config_and_the_redis_service(
    compose: dict[str, Any],
) -> None:
    env = environment(service(compose, "worker"))
    config = Path(env["POLYGATE_CONFIG"])
    assert config.is_relative_to(APP_DIR)
    assert (ROOT / config.relative_to(APP_DIR)).is_file()
    url = urlsplit(env["POLYGATE_STORE__REDIS_URL"])
    assert (url.scheme, url.hostname, url.port) == ("redis", "redis", 6379)
    assert url.hostname in compose["services"]


def test_the_worker_calls_the_simulator_for_every_source(compose: dict[str, Any]) -> None:
    env = environment(service(compose, "worker"))
    simulator = argv(service(compose, "simulator")["command"])
    assert simulator[:3] == ["python", "-m", "polygate_celery.testing.simulator"]
    served = options(simulator)
    assert served["--host"] == "0.0.0.0"  # reachable from the worker's container
    models = json.loads((ROOT / served["--config"]).read_text(encoding="utf-8"))
    config = tomllib.loads((ROOT / "examples/pipeline/polygate.toml").read_text(encoding="utf-8"))
    for name, source in config["sources"].items():
        url = urlsplit(env[f"POLYGATE_SOURCES__{name.upper()}__BASE_URL"])
        assert (url.hostname, url.port) == ("simulator", int(served["--port"]))
        assert source["model"] in models
    assert "simulator" in service(compose, "worker")["depends_on"]


def test_the_worker_applies_the_package_worker_settings(compose: dict[str, Any]) -> None:
    """Import the worker's app as the container would (in a process of its own)."""
    env = environment(service(compose, "worker"))
    config = ROOT / Path(env["POLYGATE_CONFIG"]).relative_to(APP_DIR)
    probe = (
        "import json\n"
        "from examples.pipeline.tasks import app\n"
        "from polygate_celery.celery.runtime import registered_config\n"
        "config = registered_config(app)\n"
        "print(json.dumps({'configured': config is not None, 'broker': app.conf.broker_url,\n"
        "  'store': config.store.redis_url.get_secret_value() if config else None,\n"
        "  'acks_late': app.conf.task_acks_late}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        env={**os.environ, **env, "POLYGATE_CONFIG": str(config)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["configured"] is True  # configure_worker ran
    assert seen["acks_late"] is True
    assert seen["store"] == env["POLYGATE_STORE__REDIS_URL"]
    assert seen["broker"] == env["POLYGATE_STORE__REDIS_URL"]


def test_flower_is_optional_and_watches_the_broker(compose: dict[str, Any]) -> None:
    flower = service(compose, "flower")
    assert flower["profiles"] == ["flower"]
    assert str(flower["image"]).startswith("mher/flower")
    broker = next(a for a in argv(flower["command"]) if a.startswith("--broker="))
    assert urlsplit(broker.removeprefix("--broker=")).hostname == "redis"
    for name, entry in compose["services"].items():
        if name != "flower":
            assert "profiles" not in entry  # `docker compose up` starts Redis and the worker


def test_the_worker_sends_task_events_and_flowers_api_answers_without_credentials(
    compose: dict[str, Any],
) -> None:
    """Flower shows tasks from their events; Flower 2's JSON API refuses every request
    (401) unless FLOWER_UNAUTHENTICATED_API is true or credentials are configured."""
    worker = argv(service(compose, "worker")["command"])
    assert "--task-events" in worker or "-E" in worker
    flower = service(compose, "flower")
    assert environment(flower)["FLOWER_UNAUTHENTICATED_API"] == "true"
    assert str(flower["image"]) == "mher/flower:2.2"
    assert not any(a.startswith(("--basic_auth", "--basic-auth")) for a in argv(flower["command"]))


def test_the_metrics_service_exports_the_fleets_governance(compose: dict[str, Any]) -> None:
    metrics = service(compose, "metrics")
    command = argv(metrics["command"])
    assert command[:2] == ["polygate-celery", "metrics"]
    port = options(command)["--port"]
    assert options(command)["--app"] == "pipeline"  # the example app's parking lot
    (published,) = metrics["ports"]
    assert str(published).endswith(f":{port}")
    assert metrics["build"] in (".", {"context": "."})
    assert "profiles" not in metrics  # `docker compose up` starts it
    assert metrics["depends_on"]["redis"]["condition"] == "service_healthy"
    env, worker = environment(metrics), environment(service(compose, "worker"))
    for name in ("POLYGATE_CONFIG", "POLYGATE_STORE__REDIS_URL"):
        assert env[name] == worker[name]  # the workers' configuration and store


def test_the_documented_way_to_send_tasks_runs_in_the_worker_image(
    compose: dict[str, Any],
) -> None:
    send = "docker compose run --rm worker python -m examples.pipeline.send"
    for page in (COMPOSE, ROOT / "docs/how-to/flower.md"):
        assert send in page.read_text(encoding="utf-8"), page
    assert (ROOT / "examples/pipeline/send.py").is_file()  # COPY examples ./examples
    assert "worker" in compose["services"]


def test_every_variable_compose_and_the_exporter_read_is_in_the_env_example() -> None:
    example = (ROOT / ".env.example").read_text(encoding="utf-8")
    interpolated = set(re.findall(r"\$\{([A-Za-z0-9_]+)", COMPOSE.read_text(encoding="utf-8")))
    assert interpolated
    for name in [*sorted(interpolated), "PROMETHEUS_MULTIPROC_DIR"]:
        assert re.search(rf"^# {name}=", example, re.MULTILINE), f"{name} is not documented"


@pytest.fixture(scope="session")
def docker_engine() -> str | None:
    """Why `docker compose config` cannot run here, or None when it can.

    Session-scoped, so it runs before the unit tests' guard against real sleeps.
    """
    docker = shutil.which("docker")
    if docker is None:
        return "no docker command on PATH"
    for check, reason in (
        (["info"], "no Docker engine answers (`docker info` failed)"),
        (["compose", "version"], "the docker compose plugin is not installed"),
    ):
        try:
            subprocess.run([docker, *check], capture_output=True, check=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return reason
    return None


@pytest.mark.parametrize("profile", [None, "flower"])
def test_docker_compose_accepts_the_file(docker_engine: str | None, profile: str | None) -> None:
    if docker_engine is not None:
        pytest.skip(docker_engine)
    docker = shutil.which("docker")
    assert docker is not None
    profiles = ["--profile", profile] if profile else []
    done = subprocess.run(
        [docker, "compose", "-f", str(COMPOSE), *profiles, "config", "--quiet"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
