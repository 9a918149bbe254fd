"""Properties of the governance loop over random scripts of outcomes and durations.

Each property runs at least 500 derandomized examples in virtual time.
"""

from __future__ import annotations

from hypothesis import HealthCheck, event, given, settings

from tests.property.scenario import (
    Run,
    Scenario,
    first_due,
    progress_stale,
    run_scenario,
    scenarios,
    stalled_at,
    verdict_event,
)

EPS = 1e-6
ANY_SCENARIO = scenarios() | scenarios(waiting=True)
PROPERTY = settings(
    max_examples=500,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@PROPERTY
@given(ANY_SCENARIO)
def test_never_stalled_while_progress_is_fresh(scenario: Scenario) -> None:
    run = run_scenario(scenario)
    if run.verdict == "stalled":
        assert progress_stale(run, run.ended_s)
        assert stalled_at(run, run.ended_s) > run.window
        assert verdict_event(run).stalled_s > run.window


@PROPERTY
@given(ANY_SCENARIO)
def test_budget_burning_attempts_never_exceed_max_attempts(scenario: Scenario) -> None:
    run = run_scenario(scenario)
    burned = [a for a in run.trail if a.burned_budget]
    assert len(burned) <= scenario.scope["max_attempts"]
    if run.verdict == "retry_exhausted":
        failures = [a for a in burned if a.outcome != "success"]
        assert len(failures) == scenario.scope["max_attempts"]


@PROPERTY
@given(ANY_SCENARIO)
def test_every_call_ends_by_max_call_s(scenario: Scenario) -> None:
    run = run_scenario(scenario)
    assert run.ended_s <= run.max_call_s + EPS
    if run.verdict == "deadline":
        assert run.ended_s >= run.max_call_s - EPS


@PROPERTY
@given(scenarios(waiting=True))
def test_stalled_verdict_is_at_most_one_non_budget_step_late(scenario: Scenario) -> None:
    """The bound derived in `polygate_celery.core.engine.rules`' docstring."""
    run = run_scenario(scenario)
    due = first_due(run)
    event(f"exempt={run.exempt} due={due is not None} verdict={run.verdict}")
    if due is None:
        # Due only at the checkpoint itself (e.g. a non-exempt call entering the wait for
        # a runnable source with its stall budget already spent during a backoff).
        if run.verdict == "stalled":
            assert progress_stale(run, run.ended_s)
            assert stalled_at(run, run.ended_s) > run.window
        return
    t_star, step = due
    if run.exempt:
        # Every non-productive step ends in a checkpoint: the call ends by then.
        assert run.ended_s <= step.verdict_by + EPS
        assert run.verdict in {"stalled", "deadline"}
        bound = max(
            scenario.scope["poll_interval_s"],
            max(run.timeouts.values()) + scenario.scope["backoff_max_s"],
        )
        assert run.ended_s - t_star <= bound + EPS
    else:
        # Checked while waiting for a runnable source and after the backoff of a failure
        # charged to waiting: by the end of that step the call has ended or goes on.
        # The step is a poll, or a refunded attempt and its backoff.
        bound = max(
            scenario.scope["poll_interval_s"],
            max(run.timeouts.values()) + scenario.scope["backoff_max_s"],
        )
        # A poll's verdict is given when the next look finds nothing runnable: a look that
        # finds a source goes on to an attempt. After a backoff the check comes first.
        goes_on = step.what == "no_runnable" and _next_attempt_at(run, step.verdict_by)
        assert run.ended_s <= step.verdict_by + EPS or goes_on
        assert run.ended_s - t_star <= bound + EPS or goes_on


def _next_attempt_at(run: Run, t: float) -> bool:
    return any(abs(a.started_s - t) < EPS for a in run.trail)


@PROPERTY
@given(ANY_SCENARIO)
def test_permits_return_to_zero_after_every_call(scenario: Scenario) -> None:
    run = run_scenario(scenario)
    assert run.permits_in_use == 0
