"""Feature x fault matrix: a deferred governed task is never lost, never runs twice at
once, and ends in the outcome table's state, under ordinary Celery features and faults.

Real ``celery worker`` processes (tests/celery/matrix_app.py), a private persistent
Redis per group (AOF, ``appendfsync always``) as broker, result backend and
governance store, the simulated provider, and a witness Redis of the module's own
(never faulted) where every body run records its start, its governed call and its
end, with wall times, pid, thread id and worker.

Rows (features; every governed body defers once on its first run, then makes one
real governed call whose answer names the submission and its prompt's length):
plain ``@app.task``; ``bind=True``; ``shared_task``; ``autoretry_for`` on a
ConnectionError, and on ``AllSourcesExhausted("retry_exhausted")``, raised once after
the deferral; an explicit ``self.retry(countdown=0.2)`` once after the deferral;
``task_send_sent_event`` (worker and client apps: a worker of its own); a governed
task inside a chain, a chord and with a ``link`` (plain follow-ups, each of which must
fire once); ``Task.replace`` by another governed task after a deferral; two
submissions with one explicit task id (``reuse_results=True``; the second, sent once
the first succeeded, must get its own answer); two apps with the same main name on two
brokers sharing one key prefix (each task must finish on its own broker's worker);
``task_always_eager`` (no worker: `test_task_always_eager_raises_the_verdict`).

Columns (faults, injected while post-deferral runs are in their governed call, as the
witness shows): none; a prefork pool child SIGKILLed; the broker connections dropped
(``CLIENT KILL`` of every client of the broker databases; the store is in another
database); a cold shutdown (SIGQUIT to each worker's main process, then fresh
workers); Redis killed (SIGKILL) and restarted on its data while tasks are parked.
Pools: prefork and threads for "none" and "connection dropped", prefork otherwise.

Cells not generated (`IMPOSSIBLE`): every fault with ``task_always_eager`` (no worker,
no broker: the body runs in the caller); a pool child SIGKILL under the threads pool
(there is no child: the kill would be the whole worker's); the cold shutdown and the
Redis restart under threads are left out for time only (the prefork cells cover the
paths: the unacknowledged message comes back after the visibility timeout).

A fault comes in rounds (`ROUNDS`): each waits for a run of a row no fault hit yet,
else takes any run in its call; in CI rounds stop once every row was hit, under soak
they go on, `ROUND_GAP_S` apart, while work remains.

Each (fault, pool) group shares its workers and its Redis, and runs every row's
tasks at once (`tests.soak.size(ci=2, soak=200)` per row); the assertions are per
row, and the group fails with the list of every failing cell. A cell asserts: the
final state is SUCCESS with that submission's answer; the witness saw exactly one
completed run per submission (and per follow-up), on the right worker, but for a run
SIGKILLed after its body returned and before Celery recorded its outcome (the witness's
"post", at ``task_postrun``), which runs again, as ``acks_late`` promises; no run of a
submission started while another of its runs was completing. The plain (ungoverned)
follow-ups (chain and link steps, chord echo and body) have Celery's own at-least-once
delivery, so they must complete, once or more (counted). Nothing is left queued,
unacknowledged (kombu's ``unacked`` hash, ``unacked_index`` zset) or parked. A group
waits until every task is final; it ends early when nothing has been queued,
unacknowledged or parked for `QUIET_S` (the unfinished tasks are then lost), or when
no task has become final for `STUCK_S` (they are stuck). No limit is put on the
group's whole run, which depends on the machine's speed: at 200 tasks per row the
none/prefork group took 387-731 s on the same idle machine.

Timing. With ``max_call_s = 3`` for every scope, ``extra_task_s = 20`` and a
visibility margin of 2 s, `configure_worker` derives a soft limit of 3 + 20 = 23 s, a
hard limit of 23 + 30 = 53 s (its 30 s floor) and a visibility timeout of 55 s; kombu
checks for expired unacknowledged messages every second here
(``unacked_restore_interval = 1``), so a cold-stopped or lost worker's task is back
about 55-57 s later. The soft limit leaves a run 20 s beyond its governed call: a
fresh worker's first run on a busy machine (imports, the runtime's first connections)
took more than 3 s. A SIGKILLed pool child's task comes back at once
(``task_reject_on_worker_lost``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery, chain, chord
from celery.canvas import Signature

from polygate_celery import AllSourcesExhausted, parse_config
from polygate_celery.celery.runtime import register_config, reset_runtime
from polygate_celery.testing.simulator import ModelBehaviour, SimulatedProvider
from tests import soak
from tests.celery import matrix_app
from tests.celery.conftest import config_data
from tests.celery.faults import (
    Leftovers,
    MatrixWorker,
    db_url,
    drop_broker_connections,
    kill_pids,
    leftovers,
    restart_redis,
)
from tests.celery.workers import toml
from tests.conftest import Figures, drop_result_subscriptions
from tests.redis_server import RedisServer

REPLY = "matrix answer"
N = soak.size(ci=2, soak=200)
QUEUE = "matrix"
STORE_DB = 8
MAIN_DB, TWIN_A_DB, TWIN_B_DB, EVENTS_DB = 0, 1, 2, 3
BROKER_DBS = (MAIN_DB, TWIN_A_DB, TWIN_B_DB, EVENTS_DB)
EXTRA_TASK_S = 20  # configure_worker's time-limit slack: the soft limit is max_call_s + this
# From the first submission until every task is final: a lost run's task comes back one
# visibility timeout (which grows with the slack) after the fault.
# No task became final this long, though some are not: they are stuck. Longer than a lost
# run's way back (one visibility timeout, which grows with the slack, and the restore).
STUCK_S = 120.0 + EXTRA_TASK_S
MAIN_CONCURRENCY = soak.size(ci=4, soak=8)  # the worker that runs most rows
PLAIN_ROLES = frozenset({"follow", "echo", "collect"})  # matrix_app's ungoverned tasks
QUIET_S = 8.0  # nothing queued, unacknowledged or parked this long: unfinished tasks are lost
SETTLE_S = 1.5  # after the last task is final: time for a late duplicate to show
FINAL = {"SUCCESS", "FAILURE", "REVOKED"}
WORKER_SETTINGS = {"MATRIX_EXTRA_TASK_S": str(EXTRA_TASK_S), "MATRIX_VISIBILITY_MARGIN_S": "2"}

FEATURES = (
    "plain",
    "bind",
    "shared",
    "autoretry_conn",
    "autoretry_verdict",
    "explicit_retry",
    "sent_event",
    "chain",
    "chord",
    "link",
    "replace",
    "same_id",
    "two_apps",
)
# ``MATRIX_FEATURES=chain,chord`` runs only those rows (to look into one cell).
SELECTED = tuple(
    f for f in FEATURES if f in (os.environ.get("MATRIX_FEATURES") or ",".join(FEATURES)).split(",")
)
GROUPS = (
    ("none", "prefork"),
    ("none", "threads"),
    ("pool_kill", "prefork"),
    ("conn_drop", "prefork"),
    ("conn_drop", "threads"),
    ("cold_shutdown", "prefork"),
    ("redis_restart", "prefork"),
)
FAULTS = ("none", "pool_kill", "conn_drop", "cold_shutdown", "redis_restart")
IMPOSSIBLE: dict[tuple[str, str], str] = {
    **{
        ("task_always_eager", fault): "no worker and no broker: the body runs in the caller"
        for fault in FAULTS
        if fault != "none"
    },
    **{
        (feature, "pool_kill/threads"): "the threads pool has no child process to kill"
        for feature in FEATURES
    },
}
ROUND_WAIT_S = 10.0  # a fault round waits this long for a run of a row not hit yet
ROUND_GAP_S = soak.size(ci=0, soak=4)  # under soak, rounds spread over the group's run
QUEUE_EMPTY_WAIT_S = soak.size(ci=10, soak=180)  # a Redis restart waits for empty queues
ROUNDS = {
    "pool_kill": soak.size(ci=12, soak=40),
    "conn_drop": soak.size(ci=6, soak=20),
    "cold_shutdown": soak.size(ci=1, soak=3),
    "redis_restart": soak.size(ci=1, soak=3),
}
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_UNSET: Any = object()


@pytest.fixture(scope="module")
def matrix_provider() -> Iterator[SimulatedProvider]:
    models = {
        "matrix": ModelBehaviour(reply=REPLY, latency_s=(0.5, 0.8)),
        "second": ModelBehaviour(reply="second answer"),
    }
    with SimulatedProvider(models) as provider:
        yield provider


@pytest.fixture(scope="module")
def witness_server() -> Iterator[RedisServer]:
    """The witness's Redis: never faulted."""
    with RedisServer() as server:
        yield server


def matrix_config(provider: SimulatedProvider, store_url: str, prefix: str) -> dict[str, Any]:
    """Quick scopes and deferrals; a released task whose message the broker lost in
    delivery (a Redis restart) is released again after 10 s instead of 300 s."""
    return config_data(
        provider,
        store_url,
        prefix,
        model="matrix",
        scope={"max_call_s": 3},
        deferral={"release_check_s": 10},
    )


def client_app(url: str, *, sent_event: bool = False) -> Celery:
    """A client of one broker, named like the workers' app; results are read, not awaited."""
    client = Celery("polygate_matrix", broker=url, backend=url)
    client.conf.task_default_queue = QUEUE
    client.conf.task_send_sent_event = sent_event
    client.conf.broker_connection_retry_on_startup = True
    # No result subscription per task sent: states are read from the backend by polling.
    client.backend.on_task_call = lambda *_, **__: None  # type: ignore[method-assign]
    return client


# -- what a group sends, and what it expects ------------------------------------------------


@dataclass
class Expect:
    """One task id whose final state is checked, and the submission the witness counts."""

    feature: str
    label: str
    client: Celery
    task_id: str
    expected: Any
    sub: str | None = None  # the witness's submission: exactly one completed run
    worker: str | None = None  # the worker (tag) that must complete it
    stale: Any = _UNSET  # a value this id held before this submission (same_id)
    frozen: bool = False  # judged by the first final state seen (its id is reused later)
    final: tuple[str, Any] | None = None

    def read(self) -> tuple[str, Any]:
        meta = self.client.backend.get_task_meta(self.task_id, cache=False)
        return str(meta.get("status")), meta.get("result")

    def observe(self) -> None:
        if self.final is not None and self.frozen:
            return
        state, result = self.read()
        if state in FINAL and not (state == "SUCCESS" and result == self.stale):
            self.final = (state, result)
        elif not self.frozen:
            self.final = None


@dataclass
class Case:
    """A feature's submissions; `advance` sends those that wait for an earlier one."""

    feature: str
    expects: list[Expect] = field(default_factory=list)
    pending: list[Callable[[], bool]] = field(default_factory=list)  # True once sent

    def advance(self) -> None:
        self.pending = [step for step in self.pending if not step()]

    def can_advance(self) -> bool:
        return bool(self.pending)


class Submitter:
    """Builds each feature's submissions against the group's client apps."""

    def __init__(self, clients: dict[str, Celery]) -> None:
        self.clients = clients
        self.n = 0
        self.sub_feature: dict[str, str] = {}

    def new_sub(self, feature: str) -> tuple[str, int]:
        self.n += 1
        sub = f"{feature}-{self.n}-{uuid.uuid4().hex[:6]}"
        self.sub_feature[sub] = feature
        return sub, self.n

    def sig(self, name: str, *args: Any, client: str = "main", **kwargs: Any) -> Signature:
        return self.clients[client].signature(f"matrix.{name}", args=args, kwargs=kwargs)

    def simple(self, feature: str, task: str, client: str = "main") -> Case:
        case = Case(feature)
        for _ in range(N):
            sub, n = self.new_sub(feature)
            result = self.sig(task, sub, n, client=client).apply_async()
            case.expects.append(
                Expect(
                    feature,
                    f"{task}[{sub}]",
                    self.clients[client],
                    result.id,
                    matrix_app.expected_answer(sub, n, REPLY),
                    sub,
                )
            )
        return case

    def chained(self) -> Case:
        case = Case("chain")
        main = self.clients["main"]
        for _ in range(N):
            sub, n = self.new_sub("chain")
            result = chain(self.sig("bound", sub, n), self.sig("follow", sub=f"{sub}/follow"))()
            answer = matrix_app.expected_answer(sub, n, REPLY)
            assert result.parent is not None
            case.expects += [
                Expect("chain", f"chain member[{sub}]", main, result.parent.id, answer, sub),
                Expect(
                    "chain",
                    f"chain follow-up[{sub}]",
                    main,
                    result.id,
                    f"follow({answer})",
                    f"{sub}/follow",
                ),
            ]
        return case

    def chorded(self) -> Case:
        case = Case("chord")
        main = self.clients["main"]
        for _ in range(N):
            sub, n = self.new_sub("chord")
            member = self.sig("bound", sub, n)
            other = self.sig("echo", f"{sub}/echo")
            member_id, other_id = member.freeze().id, other.freeze().id
            body = self.sig("collect", sub=f"{sub}/collect")
            result = chord([member, other], body)()
            answer = matrix_app.expected_answer(sub, n, REPLY)
            echoed = f"echo:{sub}/echo"
            case.expects += [
                Expect("chord", f"chord member[{sub}]", main, member_id, answer, sub),
                Expect("chord", f"chord echo[{sub}]", main, other_id, echoed, f"{sub}/echo"),
                Expect(
                    "chord",
                    f"chord body[{sub}]",
                    main,
                    result.id,
                    sorted([answer, echoed]),
                    f"{sub}/collect",
                ),
            ]
        return case

    def linked(self) -> Case:
        case = Case("link")
        main = self.clients["main"]
        for _ in range(N):
            sub, n = self.new_sub("link")
            callback = self.sig("follow", sub=f"{sub}/link")
            callback_id = callback.freeze().id
            result = self.sig("bound", sub, n).apply_async(link=callback)
            answer = matrix_app.expected_answer(sub, n, REPLY)
            case.expects += [
                Expect("link", f"linked[{sub}]", main, result.id, answer, sub),
                Expect(
                    "link", f"link[{sub}]", main, callback_id, f"follow({answer})", f"{sub}/link"
                ),
            ]
        return case

    def same_id(self) -> Case:
        """Two submissions of one explicit task id, the second once the first succeeded."""
        case = Case("same_id")
        main = self.clients["main"]
        for _ in range(N):
            task_id = str(uuid.uuid4())
            first_sub, first_n = self.new_sub("same_id")
            second_sub, second_n = self.new_sub("same_id")
            first_answer = matrix_app.expected_answer(first_sub, first_n, REPLY)
            self.sig("reusing", first_sub, first_n).apply_async(task_id=task_id)
            first = Expect(
                "same_id",
                f"first[{first_sub}]",
                main,
                task_id,
                first_answer,
                first_sub,
                frozen=True,
            )
            case.expects.append(first)

            def send_second(
                first: Expect = first, sub: str = second_sub, n: int = second_n
            ) -> bool:
                if first.final is None:
                    return False
                if first.final[0] == "SUCCESS":
                    # Celery's result backend ignores every state stored for an id after a
                    # SUCCESS (celery/backends/base.py, _store_result): the first's result is
                    # forgotten, as a client reusing an id must, so the second's can show.
                    main.AsyncResult(first.task_id).forget()
                    self.sig("reusing", sub, n).apply_async(task_id=first.task_id)
                    case.expects.append(
                        Expect(
                            "same_id",
                            f"second[{sub}]",
                            main,
                            first.task_id,
                            matrix_app.expected_answer(sub, n, REPLY),
                            sub,
                            stale=first.final[1],
                        )
                    )
                return True  # a first that failed has no second: its own check fails

            case.pending.append(send_second)
        return case

    def two_apps(self) -> Case:
        case = Case("two_apps")
        for client in ("twin_a", "twin_b"):
            half = self.simple("two_apps", "bound", client=client)
            for expect in half.expects:
                expect.worker = client
            case.expects += half.expects
        return case

    def all(self) -> list[Case]:
        makers: dict[str, Callable[[], Case]] = {
            "plain": lambda: self.simple("plain", "plain"),
            "bind": lambda: self.simple("bind", "bound"),
            "shared": lambda: self.simple("shared", "shared"),
            "autoretry_conn": lambda: self.simple("autoretry_conn", "autoretry_conn"),
            "autoretry_verdict": lambda: self.simple("autoretry_verdict", "autoretry_verdict"),
            "explicit_retry": lambda: self.simple("explicit_retry", "explicit_retry"),
            "sent_event": lambda: self.simple("sent_event", "bound", client="events"),
            "chain": self.chained,
            "chord": self.chorded,
            "link": self.linked,
            "replace": lambda: self.simple("replace", "replacer"),
            "same_id": self.same_id,
            "two_apps": self.two_apps,
        }
        return [makers[feature]() for feature in SELECTED]


# -- the witness -----------------------------------------------------------------------------


@dataclass
class RunRecord:
    run: str
    sub: str
    role: str
    task: str
    worker: str
    pid: int
    tid: int
    deferrals: int
    retries: int
    start: float
    call: float | None = None
    end: float | None = None
    left: str | None = None
    value: Any = None
    post: float | None = None  # Celery recorded its outcome and the run was finished

    def describe(self) -> str:
        span = (
            f"{self.start % 1000:.3f}-{self.end % 1000:.3f}"
            if self.end
            else f"{self.start % 1000:.3f}-"
        )
        how = f"left: {self.left}" if self.left else "completed" if self.end else "unfinished"
        return (
            f"{self.role} run {span} {how} on {self.worker} pid {self.pid} tid {self.tid} "
            f"(deferrals {self.deferrals}, retries {self.retries})"
        )


class Witness:
    """Reads the runs the task bodies recorded, incrementally."""

    def __init__(self, server: RedisServer, key: str) -> None:
        self.client = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=10)
        self.key = key
        self.entries = 0
        self.runs: dict[str, RunRecord] = {}
        self.received: set[str] = set()  # task ids some worker read from the broker

    def refresh(self) -> None:
        for raw in self.client.lrange(self.key, self.entries, -1):
            self.entries += 1
            entry = json.loads(raw)
            if entry["ev"] == "received":
                self.received.add(entry["task"])
                continue
            run = self.runs.get(entry["run"])
            if run is None:
                run = self.runs[entry["run"]] = RunRecord(
                    entry["run"],
                    entry["sub"],
                    entry["role"],
                    entry["task"],
                    entry["worker"],
                    entry["pid"],
                    entry["tid"],
                    entry["deferrals"],
                    entry["retries"],
                    entry["t"],
                )
            if entry["ev"] == "call":
                run.call = entry["t"]
            elif entry["ev"] == "end":
                run.end, run.value = entry["t"], entry.get("value")
            elif entry["ev"] == "left":
                run.end, run.left = entry["t"], entry.get("reason")
            elif entry["ev"] == "post":
                run.post = entry["t"]

    def by_sub(self) -> dict[str, list[RunRecord]]:
        grouped: dict[str, list[RunRecord]] = defaultdict(list)
        for run in self.runs.values():
            grouped[run.sub].append(run)
        return grouped

    def in_call(self, within_s: float = 5.0) -> list[RunRecord]:
        """Runs in their governed call now (after a deferral, by construction)."""
        now = time.time()
        return [
            r
            for r in self.runs.values()
            if r.call is not None and r.end is None and now - r.call < within_s
        ]

    def close(self) -> None:
        with contextlib.suppress(redis.RedisError):
            self.client.delete(self.key)
        self.client.close()


# -- one (fault, pool) group ------------------------------------------------------------------


class Group:
    def __init__(
        self,
        fault: str,
        pool: str,
        server: RedisServer,
        witness_server: RedisServer,
        provider: SimulatedProvider,
        tmp_path: Path,
    ) -> None:
        self.fault, self.pool, self.server = fault, pool, server
        self.cell = f"{fault}/{pool}"
        tag = uuid.uuid4().hex[:8]
        self.prefixes = {
            "main": f"matrix-{tag}",
            "twin": f"matrix-twin-{tag}",  # shared by the two apps of one main name
            "events": f"matrix-events-{tag}",
        }
        store = db_url(server, STORE_DB)
        witness_key = f"matrix:{tag}:runs"
        self.witness = Witness(witness_server, witness_key)
        common = {
            **WORKER_SETTINGS,
            "MATRIX_QUEUE": QUEUE,
            "MATRIX_WITNESS": witness_server.url,
            "MATRIX_WITNESS_KEY": witness_key,
        }
        self.workers: dict[str, MatrixWorker] = {}
        layout = (
            ("main", MAIN_DB, "main", MAIN_CONCURRENCY, {}),
            ("twin_a", TWIN_A_DB, "twin", 2, {}),
            ("twin_b", TWIN_B_DB, "twin", 2, {}),
            ("events", EVENTS_DB, "events", 2, {"MATRIX_SENT_EVENT": "1"}),
        )
        self.clients: dict[str, Celery] = {}
        for name, db, prefix, concurrency, extra in layout:
            path = tmp_path / f"{name}.toml"
            path.write_text(toml(matrix_config(provider, store, self.prefixes[prefix])))
            env = {
                **common,
                **extra,
                "MATRIX_BROKER": db_url(server, db),
                "MATRIX_CONFIG": str(path),
            }
            self.workers[name] = MatrixWorker(
                name, env, tmp_path, pool=pool, concurrency=concurrency, queue=QUEUE
            )
            self.clients[name] = client_app(db_url(server, db), sent_event=name == "events")
        self.cases: list[Case] = []
        self.submitter = Submitter(self.clients)
        self.hit: dict[str, int] = defaultdict(int)  # runs per feature the fault hit
        self.hit_runs: set[str] = set()
        self.restarts: list[str] = []
        self.injections: list[str] = []
        self.reruns = 0  # runs again after a kill between body end and recorded outcome
        self.plain_reruns = 0  # ungoverned follow-ups run again (Celery's at-least-once)
        self.killed_at: dict[int, float] = {}  # pool children SIGKILLed, when
        self.transport_losses: list[str] = []  # never read from the broker (README)

    # -- running -----------------------------------------------------------------------------

    def start(self) -> None:
        for worker in self.workers.values():
            worker.start()

    def stop(self) -> None:
        for worker in self.workers.values():
            worker.stop()
        for client in self.clients.values():
            with contextlib.suppress(Exception):
                drop_result_subscriptions(client)
        self.witness.close()

    @property
    def expects(self) -> list[Expect]:
        return [e for case in self.cases for e in case.expects]

    def feature_of(self, sub: str) -> str:
        return self.submitter.sub_feature.get(sub.split("/", maxsplit=1)[0], "?")

    def supervise(self) -> None:
        """Start again a worker that exited on its own, as a process supervisor would (a
        Redis restart can end a worker: Celery's "Unrecoverable error" on reconnecting)."""
        for worker in self.workers.values():
            if worker.process is not None and not worker.alive():
                code = worker.process.returncode
                worker.stop()
                worker.start()
                self.restarts.append(f"{worker.tag} exited ({code}): started again")

    def poll(self) -> None:
        """One look at everything: the witness, the states, and the sends that are due."""
        self.supervise()
        with contextlib.suppress(redis.RedisError, OSError):
            self.witness.refresh()
        for expect in self.expects:
            with contextlib.suppress(Exception):  # the Redis may be down (restart fault)
                expect.observe()
        for case in self.cases:
            with contextlib.suppress(Exception):
                case.advance()

    def leftovers(self) -> Leftovers | None:
        try:
            return leftovers(self.server, BROKER_DBS, QUEUE, STORE_DB, self.prefixes.values())
        except (redis.RedisError, OSError):
            return None

    def wait(self, condition: Callable[[], bool], within_s: float) -> bool:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            self.poll()
            if condition():
                return True
            time.sleep(0.05)
        return False

    def victims(self) -> list[RunRecord]:
        """Runs in their governed call now that no fault hit yet: those of a row no fault
        hit yet if there are any, else all of them."""
        running = [r for r in self.witness.in_call() if r.run not in self.hit_runs]
        unhit = [r for r in running if self.hit[self.feature_of(r.sub)] == 0]
        return unhit or running

    def inject(self) -> None:
        """The group's fault, while post-deferral runs are in their governed call. A round
        waits up to `ROUND_WAIT_S` for a run of a row no fault hit yet, then takes any run
        in its call; rounds go on while work remains (in CI: until every row was hit)."""
        if self.fault == "none":
            return
        if self.fault == "redis_restart":
            for _ in range(ROUNDS[self.fault]):
                if not self.work_remains():
                    break
                parked = self.wait(lambda: self.parked() > 0, 30)
                self.wait(lambda: bool(self.witness.in_call()), 5)
                # Not while a queue holds a message: kombu's Redis transport pops one
                # (BRPOP) before it records it as unacknowledged, and a pop whose reply
                # the restart cuts off is lost whatever the task does (README).
                if not self.wait(lambda: self.queued() == 0, QUEUE_EMPTY_WAIT_S):
                    self.injections.append("no restart: a queue never emptied")
                    continue
                self.note_hits(self.witness.in_call())
                restart_redis(self.server, 1.0)
                self.injections.append(f"Redis restarted ({'with' if parked else 'no'} parked)")
            return
        for _ in range(ROUNDS[self.fault]):
            if not self.work_remains() or (not soak.SOAK and all(self.hit[f] for f in SELECTED)):
                break
            self.wait(lambda: self.unhit_running() or not self.unhit_pending(), ROUND_WAIT_S)
            if not self.wait(lambda: bool(self.victims()) or not self.work_remains(), 30):
                continue
            victims = self.victims()
            if not victims:
                break  # no work remains
            self.note_hits(victims)
            if self.fault == "pool_kill":
                at = time.time()  # the witness's clock
                killed = kill_pids(r.pid for r in victims)
                self.killed_at.update(dict.fromkeys(killed, at))
                self.injections.append(f"SIGKILL of pool children {sorted(killed)}")
            elif self.fault == "conn_drop":
                dropped = drop_broker_connections(self.server, BROKER_DBS)
                self.injections.append(f"CLIENT KILL of {dropped} broker connections")
            elif self.fault == "cold_shutdown":
                for worker in self.workers.values():
                    worker.cold_shutdown()
                for worker in self.workers.values():
                    worker.start()
                self.injections.append("cold shutdown (SIGQUIT) of every worker, fresh ones")
            self.wait(lambda: not self.work_remains(), ROUND_GAP_S)

    @property
    def injected(self) -> int:
        return sum(1 for i in self.injections if not i.startswith("no restart"))

    def unhit_running(self) -> bool:
        """Whether a run of a row no fault hit yet is in its governed call now."""
        return any(
            self.hit[self.feature_of(r.sub)] == 0
            for r in self.witness.in_call()
            if r.run not in self.hit_runs
        )

    def unhit_pending(self) -> bool:
        """Whether a row no fault hit yet still has work to come."""
        return any(e.final is None for e in self.expects if self.hit[e.feature] == 0) or any(
            c.can_advance() for c in self.cases if self.hit[c.feature] == 0
        )

    def work_remains(self) -> bool:
        """Whether a task is not final yet, or a case has a send to come."""
        return any(e.final is None for e in self.expects) or any(
            c.can_advance() for c in self.cases
        )

    def note_hits(self, runs: list[RunRecord]) -> None:
        for run in runs:
            self.hit_runs.add(run.run)
            self.hit[self.feature_of(run.sub)] += 1

    def queued(self) -> int:
        found = self.leftovers()
        if found is None:
            return 0
        return sum(n for where, n in found.counts.items() if where.startswith("queue@"))

    def parked(self) -> int:
        found = self.leftovers()
        return found.counts.get("parked", 0) if found is not None else 0

    def drive(self, started: float) -> str:
        """Wait until every task is final ("done"), nothing is left in flight for
        `QUIET_S` while some are not ("lost"), or no task became final for `STUCK_S`
        ("stuck")."""
        quiet_since: float | None = None
        finals, progress_at = 0, started
        while True:
            self.poll()
            found = self.leftovers()
            waiting = any(c.can_advance() for c in self.cases)
            # A final state with a copy still queued, unacknowledged or parked is not the end.
            if (
                all(e.final is not None for e in self.expects)
                and not waiting
                and found
                and found.empty
            ):
                return "done"
            now = time.monotonic()
            final = sum(e.final is not None for e in self.expects)
            if final > finals:
                finals, progress_at = final, now
            elif now - progress_at > STUCK_S:
                return "stuck"
            if found is not None and found.empty and not waiting:
                quiet_since = quiet_since or now
                if now - quiet_since > QUIET_S:
                    return "lost"
            else:
                quiet_since = None
            time.sleep(0.2)

    def settle(self) -> Leftovers | None:
        """After the last final state: let late duplicates show."""
        time.sleep(SETTLE_S)
        self.poll()
        return self.leftovers()

    # -- judging -----------------------------------------------------------------------------

    def cut_off(self, run: RunRecord) -> bool:
        """A completed run whose outcome was never recorded because the fault hit it: in
        its call, or its process SIGKILLed after its body returned (the witness may not
        have seen the body end before the kill, and so not have counted it a victim)."""
        if run.post is not None:
            return False
        killed = self.killed_at.get(run.pid)
        return run.run in self.hit_runs or (
            killed is not None and run.end is not None and killed >= run.end
        )

    def judge(self, end: str, found: Leftovers | None) -> dict[str, list[str]]:
        """Problems per feature (an empty list: the cell passed)."""
        problems: dict[str, list[str]] = {feature: [] for feature in (*SELECTED, "(group)")}
        runs = self.witness.by_sub()
        outcomes: dict[int, tuple[str, Any]] = {}  # by id(expect): one task id may be reused
        for expect in self.expects:
            if expect.frozen:
                outcomes[id(expect)] = expect.final or ("never final", None)
            else:
                try:
                    outcomes[id(expect)] = expect.read()
                except Exception as exc:  # the backend is gone: say so
                    outcomes[id(expect)] = (f"unreadable ({exc})", None)
        states_now = {i: state for i, (state, _) in outcomes.items()}
        lost = self.lost_in_transport(states_now)
        for expect in self.expects:
            out = problems[expect.feature]
            state, result = outcomes[id(expect)]
            mine = runs.get(expect.sub or "", [])
            if id(expect) in lost:
                self.transport_losses.append(f"{expect.label} {expect.task_id}")
                continue
            if state != "SUCCESS" or result != expect.expected:
                stale = " (the earlier submission's)" if result == expect.stale else ""
                out.append(
                    f"{expect.label} {expect.task_id}: {state} {result!r}{stale} at {end}, "
                    f"expected SUCCESS {expect.expected!r}; runs: "
                    + (
                        "; ".join(r.describe() for r in sorted(mine, key=lambda r: r.start))
                        or "none"
                    )
                )
            if expect.sub is None:
                continue
            completed = sorted(
                (r for r in mine if r.end is not None and r.left is None), key=lambda r: r.start
            )
            if mine and all(r.role in PLAIN_ROLES for r in mine):
                # Not governed: Celery redelivers a plain task cut off from its broker
                # after its body ran; at least once is its promise, not ours.
                if not completed:
                    out.append(f"{expect.label} {expect.task_id}: no completed run")
                self.plain_reruns += max(0, len(completed) - 1)
                continue
            # A run SIGKILLed after its body returned but before Celery recorded its
            # outcome runs again: at least once, as acks_late promises (README).
            unrecorded = [r for r in completed[:-1] if self.cut_off(r)]
            self.reruns += len(unrecorded)
            if len(completed) - len(unrecorded) != 1:
                out.append(
                    f"{expect.label} {expect.task_id}: {len(completed)} completed runs "
                    f"({'; '.join(r.describe() for r in completed) or 'none'}); "
                    f"{len(mine)} runs started"
                )
            wrong_values = [r for r in completed if r.value != expect.expected]
            if wrong_values:
                out.append(
                    f"{expect.label} {expect.task_id}: a run returned "
                    f"{', '.join(repr(r.value) for r in wrong_values)}, not {expect.expected!r}"
                )
            if expect.worker is not None:
                wrong = [r for r in completed if not r.worker.startswith(f"{expect.worker}#")]
                if wrong:
                    out.append(
                        f"{expect.label} {expect.task_id}: completed on "
                        f"{', '.join(r.worker for r in wrong)}, not on {expect.worker}"
                    )
            for done in completed:
                assert done.end is not None
                overlapping = [
                    r for r in mine if r is not done and done.start <= r.start <= done.end
                ]
                if overlapping:
                    out.append(
                        f"{expect.label} {expect.task_id}: a run started while another was "
                        f"running: {done.describe()} / "
                        + "; ".join(r.describe() for r in overlapping)
                    )
        if found is None:
            problems["(group)"].append("leftovers unreadable: the Redis did not answer")
        else:
            ids_feature = {e.task_id: e.feature for e in self.expects}
            for where, count in found.nonzero().items():
                ids = found.task_ids.get(where, set())
                features = {ids_feature.get(self.task_id_of(i), "?") for i in ids} or {"?"}
                for feature in features:
                    target = feature if feature in problems else "(group)"
                    problems[target].append(
                        f"left over: {where} holds {count} ({', '.join(sorted(ids)) or '?'})"
                    )
        return problems

    def lost_in_transport(self, states: dict[int, str]) -> set[int]:
        """Expected tasks (by `id`) no worker ever read from the broker, under a fault that
        cuts Redis connections: kombu's Redis transport pops a message (BRPOP) before it
        records it as unacknowledged, and a pop whose reply the fault cuts off is lost before any
        task code runs (README). Such a task stays PENDING, no run of it began, and no
        worker's `task_received` saw its id. A follow-up (chain or link step, chord body)
        counts only when a task it waited for was lost so: it was then never sent."""
        if self.fault not in ("conn_drop", "redis_restart"):
            return set()
        runs = self.witness.by_sub()

        def unread(expect: Expect) -> bool:
            return (
                states.get(id(expect)) == "PENDING"
                and not runs.get(expect.sub or "")
                and expect.task_id not in self.witness.received
            )

        lost = {id(e) for e in self.expects if not self.follows(e) and unread(e)}
        families = {self.family(e) for e in self.expects if id(e) in lost}
        lost |= {
            id(e)
            for e in self.expects
            if self.follows(e) and self.family(e) in families and unread(e)
        }
        return lost

    @staticmethod
    def family(expect: Expect) -> str:
        return (expect.sub or "").split("/", maxsplit=1)[0]

    @staticmethod
    def follows(expect: Expect) -> bool:
        """Sent by a worker once another task ended, not by the client."""
        return (expect.sub or "").rsplit("/", maxsplit=1)[-1] in ("follow", "link", "collect")

    @staticmethod
    def task_id_of(text: str) -> str:
        found = UUID.search(text)
        return found.group(0) if found else text

    def group_figures(self, elapsed: float) -> str:
        """Every cell of the group passed: tasks, body runs and fault hits per row."""
        cells = []
        for feature in SELECTED:
            expects = [e for e in self.expects if e.feature == feature]
            subs = {e.sub for e in expects if e.sub}
            runs = sum(1 for r in self.witness.runs.values() if r.sub in subs)
            cells.append(f"{feature} {len(expects)}/{runs}/{self.hit[feature]}")
        restarts = f"; {len(self.restarts)} worker restart(s)" if self.restarts else ""
        if self.plain_reruns:
            restarts += f"; {self.plain_reruns} plain follow-up run(s) again (at least once)"
        reruns = (
            f"; {self.reruns} run(s) again after a kill between body end and recorded outcome"
            if self.reruns
            else ""
        )
        if self.transport_losses:
            reruns += (
                f"; {len(self.transport_losses)} task(s) never read from the broker (kombu's "
                f"BRPOP cut off: {', '.join(self.transport_losses)})"
            )
        return (
            f"{len(SELECTED)} rows all passed (row tasks/body runs/runs the fault hit: "
            f"{', '.join(cells)}); {self.injected} injections{restarts}{reruns}; "
            f"{elapsed:.0f} s"
        )

    def figures_of(self, feature: str, elapsed: float) -> str:
        expects = [e for e in self.expects if e.feature == feature]
        subs = {e.sub for e in expects if e.sub}
        runs = [r for r in self.witness.runs.values() if r.sub in subs]
        return (
            f"{feature} x {self.cell}: {len(expects)} task ids final and right, one "
            f"completed run each; {len(runs)} body runs; the fault hit {self.hit[feature]} "
            f"of them in their call; group {elapsed:.1f} s, {self.injected} injections"
            + (
                f"; {len(self.restarts)} worker(s) exited and were restarted"
                if self.restarts
                else ""
            )
        )


@pytest.mark.timeout(soak.size(ci=300, soak=3600))
@pytest.mark.parametrize(("fault", "pool"), GROUPS, ids=[f"{f}-{p}" for f, p in GROUPS])
def test_a_deferred_task_survives_the_fault(
    fault: str,
    pool: str,
    tmp_path: Path,
    matrix_provider: SimulatedProvider,
    witness_server: RedisServer,
    figures: Figures,
) -> None:
    began = time.monotonic()
    with RedisServer(persistent=True) as server:
        group = Group(fault, pool, server, witness_server, matrix_provider, tmp_path)
        try:
            group.start()
            started = time.monotonic()
            group.cases = group.submitter.all()
            group.inject()
            end = group.drive(started)
            found = group.settle()
            problems = group.judge(end, found)
            logs = {name: w.log_path for name, w in group.workers.items()}
        finally:
            group.stop()
    elapsed = time.monotonic() - began
    failing = {feature: found for feature, found in problems.items() if found}
    if not failing:  # one row per group in soak.md: every cell of it passed
        figures(group.group_figures(elapsed))
    else:
        for feature in SELECTED:
            if feature not in failing:
                print(group.figures_of(feature, elapsed))
    if failing:
        lines = [f"{len(failing)} failing cell(s) in {group.cell} ({end}); faults: "]
        lines[0] += "; ".join(group.injections) or "none"
        if group.restarts:
            lines[0] += f"; workers restarted: {'; '.join(group.restarts)}"
        for feature, found in failing.items():
            lines.append(f"- {feature} x {group.cell}:")
            lines += [f"    {p}" for p in found]
        lines.append(f"worker logs: {', '.join(str(p) for p in logs.values())}")
        pytest.fail("\n".join(lines), pytrace=False)


def test_task_always_eager_raises_the_verdict(
    matrix_provider: SimulatedProvider, figures: Figures
) -> None:
    """Eager: no worker, so a deferral cannot re-enqueue: the verdict is raised instead,
    and nothing is parked or queued."""
    app = matrix_app.app
    saved = {
        key: app.conf[key]
        for key in ("task_always_eager", "task_eager_propagates", "broker_url", "result_backend")
    }
    prefix = f"matrix-eager-{uuid.uuid4().hex[:8]}"
    problems: list[str] = []
    with RedisServer() as server:
        config = parse_config(matrix_config(matrix_provider, db_url(server, STORE_DB), prefix))
        app.conf.update(
            task_always_eager=True,
            task_eager_propagates=True,
            broker_url=db_url(server, MAIN_DB),
            result_backend=db_url(server, MAIN_DB),
        )
        register_config(app, config)
        reset_runtime(app)
        try:
            for name in ("matrix.plain", "matrix.bound", "matrix.shared"):
                task = app.tasks[name]
                for how in ("apply", "delay"):
                    sub = f"eager-{uuid.uuid4().hex[:6]}"
                    try:
                        outcome = task.apply((sub, 1)) if how == "apply" else task.delay(sub, 1)
                    except AllSourcesExhausted as exc:
                        if exc.reason != "stalled":
                            problems.append(f"{name}.{how}(): raised {exc.reason!r}")
                    except Exception as exc:
                        problems.append(f"{name}.{how}(): raised {exc!r}")
                    else:
                        problems.append(
                            f"{name}.{how}(): returned {outcome.state} {outcome.result!r}, "
                            "not AllSourcesExhausted('stalled')"
                        )
            time.sleep(0.5)  # a parked copy would be released by now
            found = leftovers(server, [MAIN_DB], matrix_app.QUEUE, STORE_DB, [prefix])
            if not found.empty:
                problems.append(f"left over: {found.nonzero()} ({found.task_ids})")
        finally:
            reset_runtime(app)
            app.conf.update(saved)
            with contextlib.suppress(Exception):
                drop_result_subscriptions(app)
    assert not problems, "task_always_eager x none:\n" + "\n".join(problems)
    figures("task_always_eager x none: apply() and delay() raise AllSourcesExhausted('stalled')")
