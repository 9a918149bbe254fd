"""Edge (CLI): `polygate-celery metrics`, the Prometheus exporter (the ``prometheus`` extra).

Serves ``/metrics`` until interrupted (SIGINT or SIGTERM, exit 0): the counters
of the governed calls (`polygate_celery.metrics.PrometheusHook`) and gauges read
from the store on each scrape. ``python -m polygate_celery.metrics`` is the same
command. Without the extra, it says what to install in one line.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from polygate_celery.cli.context import DEFAULT_CONFIG_FILE, add_config_option, load
from polygate_celery.cli.errors import Commands, positive_int

DEFAULT_PORT = 9464  # polygate_celery.metrics.DEFAULT_PORT (not imported: it needs the extra)
EXTRA = "prometheus"
FAILED = 1

DESCRIPTION = f"""\
Serve Prometheus metrics on http://ADDR:PORT/metrics until interrupted (Ctrl-C or
SIGTERM). The configuration comes from --config, else $POLYGATE_CONFIG, else
./{DEFAULT_CONFIG_FILE}, with POLYGATE_* variables on top; the sources' API keys are
not needed. Needs the prometheus extra: pip install 'polygate_celery[prometheus]'."""

EPILOG = """\
What is exported:
  counters of the governed calls, counted where they run (workers with
  configure_worker(app, config, hooks=[PrometheusHook()])):
    polygate_attempts_total               attempts, by scope, source, outcome
    polygate_verdicts_total               calls ended, by scope, verdict, priority, tenant
    polygate_waits_total                  waits, by scope, cause
    polygate_wait_seconds_total           seconds waited, by scope, cause
    polygate_deferrals_total              tasks deferred, by scope, reason, strategy
    polygate_source_alerts_total          alerts (e.g. rejected credentials), by source
  gauges read from the governance store on each scrape (the same from any host):
    polygate_store_up                     1 if the store answered this scrape
    polygate_permits_in_use               permits held at a source, fleet-wide
    polygate_permit_limit                 adaptive (AIMD) limit of a source
    polygate_permit_cap                   configured max_concurrency of a source
    polygate_breaker_state                0 closed, 1 half-open, 2 open
    polygate_breaker_failures             consecutive transient failures of a source
    polygate_source_paused_seconds        seconds until a source's pause ends
    polygate_source_waiting               calls waiting for a source's permits, by class
    polygate_source_booked                calls holding a quota slot booked ahead, by class
    polygate_tenant_in_flight             a tenant's calls holding a source's permits
    polygate_tenant_waiting               a tenant's calls waiting for a source's permits
    polygate_scope_progress_age_seconds   seconds since a scope's last success
    polygate_parked_tasks                 deferred tasks in an app's parking lot
    polygate_parked_due_tasks             parked tasks already due

Workers with several processes (Celery's prefork pool): give every worker process and
this exporter the same PROMETHEUS_MULTIPROC_DIR (an empty directory, wiped before the
workers start, set in their environment before anything imports prometheus_client);
the exporter then sums the counters of every process that wrote there, so run it on
the workers' host. Without it, the counters are this process's own (none, for a
separate exporter) and only the gauges are the fleet's.

Labels hold configured names (scope, source, app) and fixed words only: never a key,
a URL or a prompt."""


def add_command(commands: Commands) -> None:
    parser = commands.add_parser(
        "metrics",
        help="serve Prometheus metrics: call counters and the fleet's governance gauges",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's options, and what runs it (also for ``python -m polygate_celery.metrics``)."""
    parser.add_argument(
        "--port",
        type=_port,
        default=DEFAULT_PORT,
        help=f"TCP port to listen on (default {DEFAULT_PORT}; 0 picks a free one)",
    )
    parser.add_argument(
        "--addr", default="0.0.0.0", help="address to listen on (default 0.0.0.0: every interface)"
    )
    add_config_option(parser)
    parser.add_argument(
        "--app",
        action="append",
        metavar="NAME",
        help="a Celery app's main name whose parking lot to report (repeatable; default: "
        "every lot found under the store's key prefix)",
    )
    parser.set_defaults(run=run, extra=EXTRA)


def _port(text: str) -> int:
    if text == "0":
        return 0
    port = positive_int(text)
    if port > 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: a port is at most 65535")
    return port


def run(args: argparse.Namespace) -> int:
    from polygate_celery.metrics import serve  # noqa: PLC0415 - the prometheus extra

    config = load(args.config)
    try:
        exporter = serve(config, args.port, args.addr, apps=args.app)
    except OSError as exc:
        print(f"error: cannot listen on {args.addr}:{args.port}: {exc.strerror}", file=sys.stderr)
        return FAILED
    # Handlers first: an interrupt that comes as soon as the address is printed still
    # closes the exporter (the store's connections, the HTTP server) and exits 0.
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    print(f"serving metrics on http://{args.addr}:{exporter.port}/metrics", flush=True)
    try:
        while not stop.wait(1.0):
            pass
    finally:
        exporter.close()
    return 0
