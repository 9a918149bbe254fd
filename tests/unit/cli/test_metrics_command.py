"""`polygate-celery metrics --help`: what is exported, by name, and how to run it beside
workers of several processes; the same command as ``python -m polygate_celery.metrics``."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from polygate_celery import metrics
from polygate_celery.cli import metrics as command
from polygate_celery.config import parse_config
from tests.unit.cli.conftest import Cli

ROOT = Path(__file__).resolve().parents[3]


def exported_names() -> list[str]:
    """Every metric family the exporter serves, as a scrape names it."""
    registry = CollectorRegistry()
    metrics.PrometheusHook(registry)
    counters = [f"{family.name}_total" for family in registry.collect()]
    collector = metrics.GovernanceCollector(parse_config({}))
    gauges = [family.name for family in collector.describe()]
    return counters + gauges


@pytest.mark.parametrize("how", ["command", "module"])
def test_the_help_names_every_metric_and_the_multiprocess_directory(
    cli: Cli, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    if how == "command":
        ran = cli("metrics", "--help")
        code, out = ran.code, ran.out
        assert out.startswith("usage: polygate-celery metrics")
    else:
        with pytest.raises(SystemExit) as exited:
            metrics.main(["--help"])
        code, out = int(str(exited.value.code)), capsys.readouterr().out
        assert out.startswith("usage: python -m polygate_celery.metrics")
    assert code == 0
    names = exported_names()
    assert len(names) == 20
    for name in names:
        assert f"\n    {name} " in out, name
    for needed in ("PROMETHEUS_MULTIPROC_DIR", "--port", "--config", "--app", "9464"):
        assert needed in out
    assert "pip install 'polygate_celery[prometheus]'" in out


def test_the_metrics_page_lists_what_the_help_lists() -> None:
    page = (ROOT / "docs/how-to/metrics.md").read_text(encoding="utf-8")
    for name in exported_names():
        assert f"`{name}`" in page, name
    assert "polygate-celery metrics" in page
    assert "PROMETHEUS_MULTIPROC_DIR" in page


def test_the_command_and_the_module_share_a_default_port() -> None:
    assert command.DEFAULT_PORT == metrics.DEFAULT_PORT


@pytest.mark.parametrize("port", ["-1", "65536", "http"])
def test_a_port_out_of_range_is_one_line(cli: Cli, port: str) -> None:
    assert "--port" in cli("metrics", "--port", port).error_line
