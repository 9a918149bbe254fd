"""Every setting of a source and a scope reaches the terms the loop and the store read:
a setting that changed nothing would pass every test of the behaviour it names."""

from __future__ import annotations

from polygate_celery.config import parse_config
from polygate_celery.core.terms import AimdTerms, BreakerTerms, QuotaTerms, SourceTerms
from polygate_celery.governance.plan import ScopePlan, source_terms

CONFIG = parse_config(
    {
        "quotas": {"key": {"rpm": 600, "tpm": 90_000, "rpm_window": "sliding"}},
        "sources": {
            "shared": {"quota": "key", "max_concurrency": 3},
            "own": {
                "rpm": 60,
                "tpm": 9_000,
                "rpm_window": "sliding",
                "max_concurrency": 8,
                "breaker": {"failure_threshold": 7, "cooldown_s": 12, "auth_cooldown_s": 900},
                "aimd": {"increase": 2.0, "decrease_factor": 0.25, "initial_limit": 4},
            },
            "tokens": {"tpm": 5_000},
        },
        "scopes": {
            "s": {
                "kind": "chat",
                "sources": ["own", "shared"],
                "rate_limit_exempt": False,
                "wait_out_retry_after_s": 9,
            }
        },
    }
)


def test_a_shared_quota_is_the_quota_groups_with_its_window() -> None:
    assert source_terms(CONFIG, "shared").quota == QuotaTerms(
        "shared:key", 600, 90_000, rpm_window="sliding"
    )


def test_a_sources_own_settings_reach_its_terms() -> None:
    assert source_terms(CONFIG, "own") == SourceTerms(
        name="own",
        max_concurrency=8,
        breaker=BreakerTerms(failure_threshold=7, cooldown_s=12.0, auth_cooldown_s=900.0),
        aimd=AimdTerms(increase=2.0, decrease_factor=0.25, initial_limit=4),
        quota=QuotaTerms("source:own", 60, 9_000, rpm_window="sliding"),
    )


def test_a_token_quota_alone_is_a_quota_and_no_quota_is_none() -> None:
    assert source_terms(CONFIG, "tokens").quota == QuotaTerms("source:tokens", None, 5_000)
    assert source_terms(parse_config({"sources": {"a": {}}}), "a").quota is None


def test_a_scopes_settings_reach_its_plan() -> None:
    plan = ScopePlan.build(CONFIG, "s")
    assert plan.policy.rate_limit_exempt is False  # chat is exempt by default
    assert plan.wait_out_retry_after_s == 9.0
    assert plan.sources == ("own", "shared")
    assert [t.name for t in plan.candidates] == ["own", "shared"]
    assert plan.terms["shared"] == source_terms(CONFIG, "shared")


def test_outage_is_waiting_unset_is_chosen_by_the_caller_and_set_holds_for_both() -> None:
    """SPEC §3 rule 15 as amended: waiting by default only where it is cheap (a task)."""
    assert ScopePlan.build(CONFIG, "s").outage_charge == "waiting_if_breaker_open"
    assert ScopePlan.build(CONFIG, "s", "task").outage_charge == "waiting"
    for setting, charge in ((True, "waiting"), (False, "retry_budget")):
        config = CONFIG.model_copy(deep=True)
        config.scopes["s"].outage_is_waiting = setting
        assert ScopePlan.build(config, "s").outage_charge == charge
        assert ScopePlan.build(config, "s", "task").outage_charge == charge
