"""Edge (CLI): what a valid configuration may still get wrong, each with why it matters.

Pure: a function of the configuration, so `check-config` and its tests see
the same list. Nothing here is an error: the configuration loads and runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from polygate_celery.config.gateway import GatewayConfig


@dataclass(frozen=True, slots=True)
class Advice:
    """One warning: `what` in a line, `why` in a few sentences."""

    what: str
    why: str


def config_warnings(config: GatewayConfig) -> list[Advice]:
    return [
        *_store(config),
        *_scopes(config),
        *_sources(config),
        *_quotas(config),
    ]


def _store(config: GatewayConfig) -> list[Advice]:
    if config.store.shared:
        return []
    parking = (
        " Celery tasks are deferred by countdown, since the parking lot lives in Redis."
        if config.deferral.strategy == "park"
        else ""
    )
    return [
        Advice(
            "no Redis store: the in-memory store governs one process only",
            "Permits, breakers, adaptive limits, quotas and pauses are then per process: "
            "N worker processes may send N times max_concurrency requests and N times the "
            f"quota.{parking} Set store.redis_url (or store.sentinels, store.cluster_nodes) "
            "for a fleet.",
        )
    ]


def _scopes(config: GatewayConfig) -> list[Advice]:
    found = []
    governed = config.for_governed_tasks()
    for name, scope in config.scopes.items():
        sources = [config.sources[s] for s in scope.sources]
        if len(scope.sources) == 1:
            only = scope.sources[0]
            task_window = governed.scopes[name].stall_window_s
            windows = (
                f"{scope.stall_window_s:g} s"
                if task_window == scope.stall_window_s
                else f"{task_window:g} s in a governed task, {scope.stall_window_s:g} s "
                "in a direct Gateway call"
            )
            found.append(
                Advice(
                    f"scope {name!r} has one source ({only!r}) and no fallback",
                    f"While {only} is paused, its breaker is open or its quota is spent, "
                    f"every call of {name} waits; after its stall window ({windows}) "
                    "with no success in the scope it ends stalled (a Celery task is "
                    "deferred). Add a second source to fail over to.",
                )
            )
        worst = max(s.timeout_s for s in sources)
        if scope.stall_window_s < worst:
            found.append(
                Advice(
                    f"scope {name!r}: stall_window_s ({scope.stall_window_s:g} s) is below "
                    f"the largest timeout_s of its sources ({worst:g} s)",
                    "Allowed. Under the two-budget model an attempt's time, a timeout "
                    "included, burns the retry budget (max_attempts), never the stall "
                    "window: a timeout never causes a stall verdict. But calls waiting for "
                    "a permit behind slow attempts count stall time, so while no attempt "
                    "succeeds for longer than the window they may end stalled although the "
                    "sources are only slow.",
                )
            )
        if scope.max_call_s is not None and scope.max_call_s < scope.max_attempts * worst:
            budget = scope.max_attempts * worst
            found.append(
                Advice(
                    f"scope {name!r}: max_call_s ({scope.max_call_s:g} s) is below "
                    f"max_attempts x timeout_s ({scope.max_attempts} x {worst:g} = "
                    f"{budget:g} s)",
                    "The deadline cuts the retry budget short: a call whose attempts run "
                    "to their timeout ends with a deadline verdict before it has made "
                    f"{scope.max_attempts} attempts.",
                )
            )
    return found


def _sources(config: GatewayConfig) -> list[Advice]:
    found = []
    used = {s for scope in config.scopes.values() for s in scope.sources}
    for name, source in config.sources.items():
        missing = [f for f in ("base_url", "model") if getattr(source, f) is None]
        if missing:
            found.append(
                Advice(
                    f"source {name!r} has no {' and no '.join(missing)}",
                    "The built-in adapters cannot call it: this is fine only if your code "
                    "passes its own Source object for it to the gateway.",
                )
            )
        if name not in used:
            found.append(
                Advice(
                    f"source {name!r} is in no scope",
                    "No call ever reaches it; list it in a scope's sources or remove it.",
                )
            )
    return found


def _quotas(config: GatewayConfig) -> list[Advice]:
    found = []
    for name in config.quotas:
        sharing = [s for s, source in config.sources.items() if source.quota == name]
        if len(sharing) == 1:
            found.append(
                Advice(
                    f"quota {name!r} is used by one source only ({sharing[0]!r})",
                    "A shared quota is for sources behind one provider key; for one "
                    "source, its own rpm/tpm says the same. Check that the other sources "
                    "on that key name this quota.",
                )
            )
        elif not sharing:
            found.append(
                Advice(
                    f"quota {name!r} is used by no source",
                    "Name it in the sources that share its provider key, or remove it.",
                )
            )
    return found
