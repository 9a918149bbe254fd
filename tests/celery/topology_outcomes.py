"""One Celery outcome per row of the outcome table, with the governance store on a Redis
topology (Sentinel, Cluster) and the broker on the plain test Redis.

Rows: success; deferral (its source paused, ``fail_fast``) then success, with the
same task id, through the parking lot on the topology; retry budget spent;
fatal. The run markers (the task's blocking client) and the heartbeat live on
the topology too.
"""

from __future__ import annotations

import asyncio

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

from polygate_celery import AllSourcesExhausted, SourceFatalError
from polygate_celery.celery import configure_worker
from polygate_celery.celery.runtime import reset_runtime, runtime_for
from polygate_celery.config.models import StoreConfig
from polygate_celery.testing.simulator import SimulatedProvider
from tests.celery.outcome_rows import OutcomeTasks, outcome_config, outcome_models
from tests.conftest import drop_result_subscriptions, unique_prefix


def run_outcome_rows(app: Celery, tasks: OutcomeTasks, broker: str, store: StoreConfig) -> None:
    prefix = unique_prefix()
    with SimulatedProvider(outcome_models()) as provider:
        config = outcome_config(broker, prefix, provider.url)
        config = config.model_copy(
            update={"store": store.model_copy(update={"key_prefix": prefix})}
        )
        app.conf.update(broker_url=broker, result_backend=broker, task_default_queue=prefix)
        configure_worker(app, config, extra_task_s=20)
        reset_runtime(app)
        try:
            with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False):
                runtime = runtime_for(app)
                assert runtime.store.client is not None
                assert tasks.answer.delay().get(timeout=60) == "fine"
                runtime.run(runtime.store.pause_source("main", 1.0))
                deferred = tasks.answer.delay(fail_fast=True)
                assert deferred.get(timeout=60) == "fine"
                assert tasks.runs[deferred.id] == 2  # deferred once, the same task id
                with pytest.raises(AllSourcesExhausted, match="retry_exhausted"):
                    tasks.answer_down.delay().get(timeout=60)
                with pytest.raises(SourceFatalError, match="malformed"):
                    tasks.refuse.delay().get(timeout=60)
                app.backend.result_consumer.cancel_for(deferred.id)
        finally:
            reset_runtime(app)
            drop_result_subscriptions(app)
            asyncio.set_event_loop(None)
