"""Named rule mutations: each promise broken on purpose, alone, in a scratch copy; a test must fail.

``make mutate`` runs this module. For every rule below it checks out the
committed tree into a scratch worktree, applies the one change, runs the tests
that guard the rule (on a Redis of their own) and records whether they failed.
A mutant whose tests all pass is a promise no test would catch breaking; the
report (``benchmarks/results/mutations.md``) lists each rule with its verdict,
and the run exits 1 if any survived.

Usage: ``python -m tests.mutation.rules [NAME ...]`` (all rules by default).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "benchmarks" / "results" / "mutations.md"


@dataclass(frozen=True)
class Mutation:
    name: str
    rule: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTATIONS = (
    Mutation(
        "guard-running",
        "execution guard: a copy of a live run is not run beside it",
        "polygate_celery/celery/lua/execution.lua",
        "if owner and owner ~= token then\n  return {'running', redis.call('PTTL', KEYS[1])}\nend",
        "",
        ("tests/celery/test_deferral_identity.py", "tests/celery/test_parking.py"),
    ),
    Mutation(
        "poison-cap",
        "poison cap: a message whose runs died more than redelivery_cap times fails",
        "polygate_celery/celery/lua/execution.lua",
        "if times > tonumber(ARGV[6]) then return {'poison'} end",
        "",
        ("tests/celery/test_deferral_identity.py", "tests/celery/test_worker_processes.py"),
    ),
    Mutation(
        "done-marker",
        "done marker: a copy of a finished run is dropped",
        "polygate_celery/celery/lua/execution.lua",
        "if began and string.sub(began, 1, 2) ~= 'b:' then return {'done'} end",
        "",
        ("tests/celery/test_parking.py", "tests/celery/test_deferral_identity.py"),
    ),
    Mutation(
        "lease-cancel",
        "a lease that cannot be guaranteed cancels its attempt (real Redis)",
        "polygate_celery/governance/lease.py",
        "lease.owner.cancel()",
        "pass",
        ("tests/integration/test_store_outage.py",),
    ),
    Mutation(
        "wake-other-process",
        "a release wakes the waiting call it was handed to, in another process",
        "polygate_celery/store/redis/wakeups.py",
        "            self._releases.wake_call(call_id, source)\n",
        "            pass\n",
        ("tests/integration/test_fleet_wakeups.py",),
    ),
    Mutation(
        "queued-keeps-place",
        "a call queued at every candidate waits there, refused once, not at each poll",
        "polygate_celery/core/engine/rounds.py",
        "    return (\n        state.rules.claim_s > 0\n",
        "    return False and (\n        state.rules.claim_s > 0\n",
        (
            "tests/unit/governance/test_waits_and_verdicts.py",
            "tests/integration/test_fleet_wakeups.py",
        ),
    ),
    Mutation(
        "keep-hands-on",
        "keeping places hands a permit freed without a release to the first waiter (Redis)",
        "polygate_celery/store/redis/lua/keep.lua",
        "while in_use < permits and hand_on(",
        "while false and hand_on(",
        ("tests/unit/store/test_store_contract_places.py",),
    ),
    Mutation(
        "keep-merely-full",
        "a place is kept only while its source is merely full, not paused or broken (Redis)",
        "polygate_celery/store/redis/lua/keep.lua",
        "local full_only = (st[1] or 'closed') == 'closed' and not st[2]",
        "local full_only = true or not st[2]",
        ("tests/unit/store/test_store_contract_places.py",),
    ),
    Mutation(
        "arrival-margin",
        "a quota bucket charges an admission as arriving ARRIVAL_MARGIN_S late (Redis)",
        "polygate_celery/store/redis/lua/gcra.lua",
        "return math.max(tat, now + margin) + charge, nil",
        "return math.max(tat, now) + charge, nil",
        ("tests/unit/store/test_store_contract_state.py",),
    ),
    Mutation(
        "quota-booking",
        "a caller waiting for a quota bucket books its slot and is admitted there (Redis)",
        "polygate_celery/store/redis/lua/admit_booking.lua",
        "  if best_slot - now > book_within then return nil end",
        "  if true then return nil end",
        (
            "tests/unit/store/test_store_contract_bookings.py",
            "tests/integration/test_fleet_wakeups.py",
        ),
    ),
    Mutation(
        "stall-verdict",
        "a call whose stall budget is spent while its scope made no progress ends stalled",
        "polygate_celery/core/engine/rounds.py",
        "    return is_stalled(state.checked_stalled_s, event.age_s, state.rules.stall_window_s)\n",
        "    return False\n",
        ("tests/unit/governance/test_stall_budget.py",),
    ),
    Mutation(
        "outage-is-waiting",
        "failures while no call of the scope succeeds spend the stall budget (rule 15)",
        "polygate_celery/core/engine/attempts.py",
        '        step = check_stall(state, now, "backoff_stall")'
        "  # an outage is waiting (rule 15)\n",
        "        step = None\n",
        ("tests/unit/governance/test_outage_is_waiting.py",),
    ),
    Mutation(
        "direct-caller-burns-budget",
        "a direct call's failures that nothing tells from an outage burn its retry budget "
        "(rule 15 as amended)",
        "polygate_celery/governance/plan.py",
        '        return "waiting" if caller == "task" else "waiting_if_breaker_open"\n',
        '        return "waiting"\n',
        ("tests/unit/governance/test_direct_caller.py",),
    ),
    Mutation(
        "direct-caller-open-breaker",
        "a direct call's failure that finds its source's breaker open is waiting (rule 15 "
        "as amended)",
        "polygate_celery/core/engine/attempts.py",
        '    down = event.state != "closed"\n',
        "    down = False\n",
        ("tests/unit/governance/test_direct_caller.py",),
    ),
    Mutation(
        "engine-429-burns-retry-budget",
        "engine: an exempt 429 is waiting, charged to the stall budget, not to max_attempts "
        "(rules 1 and 3)",
        "polygate_celery/core/engine/attempts.py",
        "        return _conclude(state, now, charged=False, down=False, refund=True)\n",
        "        return _conclude(state, now, charged=True, down=False, refund=False)\n",
        ("tests/unit/core/test_engine_rules.py",),
    ),
    Mutation(
        "engine-first-outage-failure-refunded",
        "engine: a call's first failure stays productive, so one timeout never stalls (rule 5)",
        "polygate_celery/core/engine/attempts.py",
        "    refunded = refund or (down and state.failed_at is not None)\n",
        "    refunded = refund or down\n",
        ("tests/unit/core/test_engine_rules.py",),
    ),
    Mutation(
        "engine-429-streak",
        "engine: an exempt 429's backoff grows on the rate-limited streak (rule 3)",
        "polygate_celery/core/engine/attempts.py",
        "        n = state.rate_limited_streak\n",
        "        n = 1\n",
        ("tests/unit/core/test_engine_rules.py",),
    ),
    Mutation(
        "engine-fail-fast",
        "engine: fail_fast raises instead of waiting, before any stall check (rule 6)",
        "polygate_celery/core/engine/rounds.py",
        '    if state.rules.fail_fast:\n        return give_up(state, now, "fail_fast")\n',
        "",
        ("tests/unit/core/test_engine_rules.py",),
    ),
    Mutation(
        "countdown-strategy",
        'deferral.strategy = "countdown" defers by countdown, not into the parking lot',
        "polygate_celery/celery/deferral.py",
        'chosen = strategy or (config.strategy if runtime.redis is not None else "countdown")',
        'chosen = "park"',
        ("tests/celery/test_outcomes.py",),
    ),
    Mutation(
        "starved-not-outage",
        "a call stalled on its class's progress while the scope served others is starved, "
        "not an outage (SPEC §8)",
        "polygate_celery/governance/loop.py",
        "                exc.starved_class = await verdicts.starved("
        "self.rt, self.plan, self.priority)\n",
        "                pass\n",
        ("tests/unit/governance/test_priority_order.py",),
    ),
    Mutation(
        "starved-parks-for-class",
        "a task starved by other classes parks for its class, not as its scope's outage",
        "polygate_celery/celery/deferral.py",
        "        outage = starved_index(outage, starved_class)\n",
        "        pass\n",
        ("tests/celery/test_priority_starvation.py",),
    ),
    Mutation(
        "quota-class-takes",
        "a caller waiting for a quota takes the soonest slot a lower class booked (Redis)",
        "polygate_celery/store/redis/lua/admit_booking.lua",
        "      elseif r and r ~= rank and first[r] then\n",
        "      elseif false then\n",
        ("tests/unit/store/test_store_contract_bookings.py",),
    ),
    Mutation(
        "quota-arrival-takes",
        "a call with its arrival takes the soonest slot a later call of its class booked (Redis)",
        "polygate_celery/store/redis/lua/admit_booking.lua",
        "        elseif arrival ~= nil and tonumber(booker_arrival) > arrival then\n",
        "        elseif false then\n",
        ("tests/unit/store/test_store_contract_bookings.py",),
    ),
    Mutation(
        "quota-arrival-takes-memory",
        "a call with its arrival takes the soonest slot a later call of its class booked (memory)",
        "polygate_celery/store/memory/bookings.py",
        "                if not takes_later(\n"
        "                    request.arrival, rank, int(booking[4]), theirs, tag_, booker_tag\n"
        "                ):\n",
        "                if True:\n",
        ("tests/unit/store/test_store_contract_bookings.py",),
    ),
    Mutation(
        "quota-tenant-tag-takes",
        "a tenant's call takes the soonest slot a call of its class with a higher tag booked "
        "(Redis)",
        "polygate_celery/store/redis/lua/admit_booking.lua",
        "          if mine ~= nil and theirs ~= nil and theirs > mine then which = bests[2] end\n",
        "          if false then which = bests[2] end\n",
        ("tests/unit/store/test_store_contract_quota_tenants.py",),
    ),
    Mutation(
        "tenant-tags-decide",
        "between calls of tenants, the lower tag comes first (both stores)",
        "polygate_celery/core/standing.py",
        "        return tag is not None and booker_tag is not None and booker_tag > tag\n",
        "        return False\n",
        ("tests/unit/store/test_store_contract_quota_tenants.py",),
    ),
    Mutation(
        "quota-tag-given",
        "a tenant's first booking moves its tenant's last tag on the quota (Redis)",
        "polygate_celery/store/redis/lua/admit.lua",
        "    if new and redis.call('HSET', KEYS[6 * i - 4], qf, t) > 0 then\n",
        "    if false then\n",
        ("tests/unit/store/test_store_contract_quota_tenants.py",),
    ),
    Mutation(
        "quota-virtual-moves",
        "a tenant's booked slot used moves its class's virtual time on the quota (Redis)",
        "polygate_celery/store/redis/lua/admit.lua",
        "        fields[#fields + 1] = qv; fields[#fields + 1] = given_tag\n",
        "",
        ("tests/unit/store/test_store_contract_quota_tenants.py",),
    ),
    Mutation(
        "quota-take-fits",
        "on a shared quota, a slot booked for fewer tokens than the caller's is not taken (Redis)",
        "polygate_celery/store/redis/lua/admit_booking.lua",
        "      if r and shift > 0 and (fits or not movable) then\n",
        "      if r and shift > 0 and fits then\n",
        ("tests/unit/store/test_store_contract_bookings.py",),
    ),
    Mutation(
        "quota-take-fits-memory",
        "on a shared quota, a slot booked for fewer tokens than the caller's is not taken (memory)",
        "polygate_celery/store/memory/bookings.py",
        "            if shift > 0 and (fits or not movable):\n",
        "            if shift > 0 and fits:\n",
        ("tests/unit/store/test_store_contract_bookings.py",),
    ),
    Mutation(
        "quota-take-moves-later",
        "a larger call taking a slot moves the bookings after it later (Redis)",
        "polygate_celery/store/redis/lua/admit_booking.lua",
        "        redis.call('ZADD', alive, tonumber(after[k + 1]) + pick.shift, after[k])\n",
        "",
        ("tests/unit/store/test_store_contract_quota_tenants.py",),
    ),
    Mutation(
        "quota-take-moves-later-memory",
        "a larger call taking a slot moves the bookings after it later (memory)",
        "polygate_celery/store/memory/bookings.py",
        "                booking[0] += shift\n                booking[1] += shift\n",
        "                pass\n",
        ("tests/unit/store/test_store_contract_quota_tenants.py",),
    ),
    Mutation(
        "quota-refund-bounded",
        "a smaller call taking a slot hands tokens back only as far as the bookings ahead "
        "allow (Redis)",
        "polygate_celery/store/redis/lua/admit_booking.lua",
        "        tat = math.min(d[1], least)\n",
        "",
        ("tests/unit/store/test_store_contract_quota_tenants.py",),
    ),
    Mutation(
        "quota-refund-bounded-memory",
        "a smaller call taking a slot hands tokens back only as far as the bookings ahead "
        "allow (memory)",
        "polygate_celery/store/memory/bookings.py",
        "            tat = min(dim.tat, least)\n",
        "",
        ("tests/unit/store/test_store_contract_quota_tenants.py",),
    ),
    Mutation(
        "quota-shared-no-refund",
        "on a shared quota a smaller call taking a slot hands nothing back (Redis)",
        "polygate_celery/store/redis/lua/admit_booking.lua",
        "      if tat < d[1] and d[5] == 'tok' and not best.own then\n",
        "      if false then\n",
        ("tests/unit/store/test_store_contract_bookings.py",),
    ),
    Mutation(
        "call-keeps-tag",
        "a tenant's call keeps the tag its booking gave it, and gives it when it asks again",
        "polygate_celery/governance/loop.py",
        "                self.tag = admission.tag\n",
        "                pass\n",
        ("tests/unit/governance/test_priority_order.py",),
    ),
    Mutation(
        "quota-other-class-first",
        "a slot of another class is taken before a later call's of one's own (Redis)",
        "polygate_celery/store/redis/lua/admit_booking.lua",
        "  for _, which in ipairs(bests) do\n",
        "  for _, which in ipairs({bests[2], bests[1]}) do\n",
        ("tests/unit/store/test_store_contract_bookings.py",),
    ),
    Mutation(
        "call-keeps-arrival",
        "a call keeps the arrival its booking gave it, and gives it when it asks again",
        "polygate_celery/governance/loop.py",
        "                self.arrival = admission.arrival\n",
        "                pass\n",
        ("tests/unit/governance/test_priority_order.py",),
    ),
    Mutation(
        "call-arrives-at-first-grant",
        "a call's arrival is its first grant's time: failed, it asks again before later calls",
        "polygate_celery/governance/loop.py",
        "            self.arrival = arrival_at(admission.admitted_at)\n",
        "            pass\n",
        ("tests/unit/governance/test_quota_arrival.py",),
    ),
    Mutation(
        "quota-take-falls-back",
        "another class's slot too far, a later call's of one's own class is taken (Redis)",
        "polygate_celery/store/redis/lua/admit_booking.lua",
        "    if pick == nil and which.slot and which.slot - now <= book_within"
        " and which.slot <= fresh then\n",
        "    if pick == nil and which.slot then\n",
        ("tests/unit/store/test_store_contract_bookings.py",),
    ),
    Mutation(
        "quota-floor-kept",
        "a class owed a quota slot keeps its booked slots, and takes a higher one's (Redis)",
        "polygate_celery/store/redis/lua/quota_floors.lua",
        "  if owed_a ~= owed_b then return owed_a and a or b end\n",
        "",
        ("tests/unit/store/test_store_contract_bookings.py",),
    ),
    Mutation(
        "quota-floor-counted",
        "a quota slot used counts in the classes' credits (Redis)",
        "polygate_celery/store/redis/lua/admit.lua",
        "      fields[#fields + 1] = 'fqc'; fields[#fields + 1] ="
        " used_credits(st[16], s_rank, s_floors)\n",
        "",
        ("tests/unit/store/test_store_contract_bookings.py",),
    ),
    Mutation(
        "quota-floor-forgives",
        "what a class used while no other wanted the slots is not held against it (Redis)",
        "polygate_celery/store/redis/lua/quota_floors.lua",
        "      c[r] = math.min(math.max(c[r] + (r - 1 == rank and f - 1 or f), f - 1), 1)\n",
        "      c[r] = math.min(c[r] + (r - 1 == rank and f - 1 or f), 1)\n",
        ("tests/unit/store/test_store_contract_bookings.py",),
    ),
    Mutation(
        "quota-take-tokens",
        "a taken slot's token buckets are charged for the taker's estimate (Redis)",
        "polygate_celery/store/redis/lua/admit_booking.lua",
        "    if d[5] == 'tok' or d[5] == 'ltok' then\n",
        "    if false then\n",
        ("tests/unit/store/test_store_contract_bookings.py",),
    ),
    Mutation(
        "tenant-cap-concurrency",
        "a tenant at its max_concurrency at a source is refused there (Redis)",
        "polygate_celery/store/redis/lua/admit_tenant.lua",
        "      full = n >= conc\n",
        "      full = n > conc\n",
        ("tests/unit/store/test_store_contract_tenant_caps.py",),
    ),
    Mutation(
        "tenant-cap-lapses",
        "a tenant's permit counts only while the source holds it unexpired (Redis)",
        "polygate_celery/store/redis/lua/admit_tenant.lua",
        "            if not leases[k] or tonumber(leases[k]) <= now then\n",
        "            if not leases[k] then\n",
        ("tests/integration/test_redis_store.py",),
    ),
    Mutation(
        "tenant-cap-tokens-used",
        "settling counts a capped tenant's tokens as used, not as estimated (Redis)",
        "polygate_celery/store/redis/lua/settle.lua",
        "    local moved = tonumber(b[2]) + charge_s(used, ttpm) - charge_s(est, ttpm)\n",
        "    local moved = tonumber(b[2])\n",
        ("tests/unit/store/test_store_contract_tenant_caps.py",),
    ),
    Mutation(
        "tenant-cap-hands-on",
        "a permit handed to a waiter whose tenant is at its cap goes to the next (Redis)",
        "polygate_celery/store/redis/lua/admit.lua",
        "    if mine and capped and capped.refused and not by_health"
        " and reasons[1] ~= 'at_capacity' then\n",
        "    if false then\n",
        ("tests/unit/store/test_store_contract_tenant_caps.py",),
    ),
    Mutation(
        "tenant-cap-hands-on-room",
        "a capped waiter's permit is not handed on where the source has no room (Redis)",
        "polygate_celery/store/redis/lua/admit.lua",
        " and not by_health and reasons[1] ~= 'at_capacity' then\n",
        " and not by_health then\n",
        ("tests/unit/store/test_store_contract_tenant_caps.py",),
    ),
    Mutation(
        "booking-passes-over-claims",
        "a caller that may take a booked slot reads the bookings, not the waiters' claims",
        "polygate_celery/store/redis/lua/admit_booking.lua",
        "      for _, d in ipairs(r and tokens or NONE) do\n",
        "      for _, d in ipairs(tokens) do\n",
        ("tests/integration/test_redis_store.py",),
    ),
    Mutation(
        "booking-robbed-rebooked",
        "a booker robbed of its quota slot is booked the next one it comes to at once (Redis)",
        "polygate_celery/store/redis/lua/admit.lua",
        "  rebook(robbed, now, book_within, s_floors, ARGV[9] == '', est)\n",
        "",
        ("tests/unit/store/test_store_contract_bookings.py",),
    ),
    Mutation(
        "booking-robbed-rebooked-memory",
        "a booker robbed of its quota slot is booked the next one it comes to at once (memory)",
        "polygate_celery/store/memory/bookings.py",
        "    rebook(ledger, robbed, request, now)\n",
        "",
        ("tests/unit/store/test_store_contract_bookings.py",),
    ),
    Mutation(
        "rebook-takes-no-shifting-slot",
        "a booker booked anew takes no slot that would move a call served before it (Redis)",
        "polygate_celery/store/redis/lua/admit_booking.lua",
        "      if r and shift > 0 and (fits or not movable) then\n",
        "      if r and shift > 0 and not movable then\n",
        ("tests/unit/store/test_store_contract_bookings.py",),
    ),
    Mutation(
        "rebook-takes-no-shifting-slot-memory",
        "a booker booked anew takes no slot that would move a call served before it (memory)",
        "polygate_celery/store/memory/bookings.py",
        "            if shift > 0 and (fits or not movable):\n",
        "            if shift > 0 and not movable:\n",
        ("tests/unit/store/test_store_contract_bookings.py",),
    ),
    Mutation(
        "booking-moved-told",
        "a booker whose slot moved is told by a message to its process (Redis)",
        "polygate_celery/store/redis/lua/admit_booking.lua",
        "  if origin then redis.call('PUBLISH', ARGV[13] .. origin,",
        "  if false then redis.call('PUBLISH', ARGV[13] .. origin,",
        ("tests/integration/test_redis_store.py",),
    ),
    Mutation(
        "booking-moved-waits-on",
        "a call told its booked slot moved waits on for the new one without asking (engine)",
        "polygate_celery/core/engine/rounds.py",
        "    if moved_in_s is None or refusal is None or refusal.booked_in_s is None:\n",
        "    if True:\n",
        ("tests/unit/core/test_engine_rounds.py",),
    ),
    Mutation(
        "booking-floored-class-asks",
        "a booker robbed by a class above its own, which has a floor, books anew when it asks "
        "(Redis)",
        "polygate_celery/store/redis/lua/admit_booking.lua",
        "  if pick.rank == rank or (fl[pick.rank + 1] or 0) <= 0 then\n",
        "  if true then\n",
        ("tests/unit/store/test_store_contract_bookings.py",),
    ),
    Mutation(
        "booking-floored-class-asks-memory",
        "a booker robbed by a class above its own, which has a floor, books anew when it asks "
        "(memory)",
        "polygate_celery/store/memory/bookings.py",
        "    if theirs == rank or not (floors[theirs:] or (0.0,))[0]:\n",
        "    if True:\n",
        ("tests/unit/store/test_store_contract_bookings.py",),
    ),
    Mutation(
        "tenant-caps-say",
        "a tenant at its max_concurrency is refused (core, the memory store)",
        "polygate_celery/core/standing.py",
        "    full = caps.max_concurrency is not None and in_flight >= caps.max_concurrency\n",
        "    full = caps.max_concurrency is not None and in_flight > caps.max_concurrency\n",
        ("tests/unit/store/test_store_contract_tenant_caps.py",),
    ),
    Mutation(
        "tenant-tags-swept",
        "tenants' tags their class's virtual time has reached are swept from the state hash",
        "polygate_celery/store/redis/lua/settle.lua",
        "if redis.call('HLEN', skey) > SWEEP_ABOVE then\n",
        "if false then\n",
        ("tests/integration/test_redis_store.py",),
    ),
    Mutation(
        "tenant-tags-grow-flag",
        "a tenant's tag added to the state hash has settle look at the hash's size (fgrow)",
        "polygate_celery/store/redis/lua/admit.lua",
        "        redis.call('HSET', skey, 'fgrow', '1')  -- a field added: settle.lua may sweep\n",
        "",
        ("tests/integration/test_redis_store.py",),
    ),
    Mutation(
        "tenant-capped-gate-open",
        "a call its tenant's caps stalled closes no scope gate: it is no outage",
        "polygate_celery/governance/loop.py",
        " and not self.state.gated and not capped\n",
        " and not self.state.gated\n",
        ("tests/unit/governance/test_tenant_caps.py",),
    ),
    Mutation(
        "tenant-capped-no-outage",
        "a task its tenant's caps stalled waits out its delay, not as its scope's outage",
        "polygate_celery/celery/deferral.py",
        '    outage = scope if reason == "stalled" and not step.reset and not capped else None\n',
        '    outage = scope if reason == "stalled" and not step.reset else None\n',
        ("tests/celery/test_tenant_caps.py",),
    ),
    Mutation(
        "tenant-capped-stalls",
        "a call held back by its tenant's caps alone for its stall window is stalled",
        "polygate_celery/core/engine/rounds.py",
        "    if _capped_alone(event) and state.stalled_s(now) > state.rules.stall_window_s:\n",
        "    if False:\n",
        ("tests/unit/governance/test_tenant_caps.py",),
    ),
)


# A mutant that sends a test into an endless wait is killed by it (as mutmut counts a
# timeout), after this long per test (far above what the slowest selected test takes), and
# after RUN_TIMEOUT_S for its tests together.
TEST_TIMEOUT_S = 300.0
RUN_TIMEOUT_S = 1200.0


def run(mutation: Mutation, python: str) -> tuple[str, float, str]:
    """("killed" | "survived" | "not applied", seconds, the failing tests or why)."""
    scratch = Path(tempfile.mkdtemp(prefix=f"mutant-{mutation.name}-"))
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(scratch)],
                   check=True)  # fmt: skip
    try:
        target = scratch / mutation.path
        text = target.read_text(encoding="utf-8")
        if text.count(mutation.old) != 1:
            return "not applied", 0.0, "the code it breaks is not there once"
        target.write_text(text.replace(mutation.old, mutation.new), encoding="utf-8")
        started = time.monotonic()
        env = {**os.environ, "POLYGATE_TEST_REDIS": "private", "PYTHONPATH": str(scratch)}
        try:
            result = subprocess.run(
                [python, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                 f"--timeout={TEST_TIMEOUT_S:.0f}", *mutation.tests],
                cwd=scratch, env=env, capture_output=True, text=True, check=False,
                timeout=RUN_TIMEOUT_S,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return "killed", time.monotonic() - started, f"its tests ran over {RUN_TIMEOUT_S:.0f} s"
        seconds = time.monotonic() - started
        failed = [line.split()[1] for line in result.stdout.splitlines()
                  if line.startswith(("FAILED ", "ERROR ")) and len(line.split()) > 1]  # fmt: skip
        if result.returncode == 0:
            return "survived", seconds, ""
        return "killed", seconds, ", ".join(failed) or f"pytest exit {result.returncode}"
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(scratch)],
                       check=False)  # fmt: skip


def main(names: list[str]) -> int:
    chosen = [m for m in MUTATIONS if not names or m.name in names]
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    rows = []
    for mutation in chosen:
        verdict, seconds, detail = run(mutation, sys.executable)
        print(f"{mutation.name}: {verdict} ({seconds:.0f} s) {detail}", flush=True)
        rows.append((mutation, verdict, seconds, detail))
    lines = [
        "# Rule mutations",
        "",
        f"`make mutate` at commit {commit}: each rule broken alone in a scratch copy of the "
        "committed tree, then the tests that guard it run (`tests/mutation/rules.py`).",
        "",
        "| mutant | rule | verdict | tests run | failed first | seconds |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| `{m.name}` | {m.rule} | **{verdict}** | {', '.join(f'`{t}`' for t in m.tests)} | "
        f"{detail.replace('|', '/') or '-'} | {seconds:.0f} |"
        for m, verdict, seconds, detail in rows
    ]
    survivors = [m.name for m, verdict, _, _ in rows if verdict != "killed"]
    lines += [
        "",
        f"Survivors: {len(survivors)}{' (' + ', '.join(survivors) + ')' if survivors else ''}.",
    ]
    if not names:
        REPORT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 1 if survivors else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
