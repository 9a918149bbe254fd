"""The report of a mutmut run: every mutant of core/, governance/ and celery/, and its fate.

``make mutate`` runs ``mutmut run`` (configured in pyproject's ``[tool.mutmut]``)
and then this module, which reads ``mutmut results --all true`` and writes
``benchmarks/results/mutmut.md``: per module the mutants made, killed and left,
each survivor with its diff, and each mutant accepted as equivalent with the
reason no behaviour can tell it from the original (or, listed apart, that it
changes only a log line's wording, which tests check by content). An entry is
checked against the mutant it names (a changed function renumbers its mutants),
so a stale entry is reported rather than silently excusing another mutant.

Exit 1 when a mutant of core/, the lease or the stall rules survives (or has no
test reaching it) that is not listed as equivalent, or when an entry no longer
matches its mutant. Survivors elsewhere are listed, with their diffs.

Usage: ``python -m tests.mutation.mutmut_report``.
"""

from __future__ import annotations

import importlib.metadata
import shlex
import subprocess
import sys
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "benchmarks" / "results" / "mutmut.md"
COMMAND = (
    "rm -rf mutants; PYTEST_TIMEOUT=30 POLYGATE_TEST_REDIS=private mutmut run --max-children 2"
)


@dataclass(frozen=True)
class Equivalent:
    mutated: str  # a fragment of the mutant's changed line, to check the id still names it
    reason: str
    wording: bool = False  # not equivalent: it changes a log line's wording, and nothing else


LEASE = "polygate_celery.governance.lease.xǁLeaseRenewerǁ"
EQUIVALENT: dict[str, Equivalent] = {
    "polygate_celery.core.selection.x_preference_order__mutmut_16": Equivalent(
        "last_failure.get(s, -2)",
        "attempt numbers are never negative, so any negative default puts a source that "
        "has not failed first; -1 and -2 order every reachable input alike",
    ),
    "polygate_celery.core.stall.xǁAttemptǁ__init____mutmut_1": Equivalent(
        "self.refunded = None",
        "the flag is only read for its truth (`if not attempt.refunded`); None and False "
        "are both false",
    ),
    LEASE + "__init____mutmut_6": Equivalent(
        "self._every_s = None",
        "read only by a renewer woken by `hold()`, which sets it first",
    ),
    LEASE + "__init____mutmut_7": Equivalent(
        "self._every_s = 1.0",
        "read only by a renewer woken by `hold()`, which sets it first",
    ),
    LEASE + "_renew__mutmut_35": Equivalent(
        "strict=None", "the lengths were checked equal just above, so zip never truncates"
    ),
    LEASE + "_renew__mutmut_38": Equivalent(
        "zip(leases, held, )", "the lengths were checked equal just above"
    ),
    LEASE + "_renew__mutmut_39": Equivalent(
        "strict=False", "the lengths were checked equal just above"
    ),
    LEASE + "_lose__mutmut_13": Equivalent(
        "pop(lease.permit_id, )",
        "both callers pass a lease still registered (the renewal loop checks it, the expiry "
        "loop iterates the registered ones), so the default is never used",
    ),
    LEASE + "_lapse__mutmut_4": Equivalent(
        "pop(lease.permit_id, )",
        "the same callers as `_lose`'s, with a lease still registered (see `_lose__mutmut_13`)",
    ),
    LEASE + "_renew__mutmut_25": Equivalent(
        '"XXrenewing',
        "the warning's wording only; a test checks what it says (the lease count)",
        wording=True,
    ),
    LEASE + "_lose__mutmut_9": Equivalent(
        '"XXattempt at',
        "the error log's wording only; a test checks what it says (the source, the reason)",
        wording=True,
    ),
}

PLACES = "polygate_celery.governance.places.xǁPlaceKeeperǁ"
EQUIVALENT |= {
    PLACES + "_run__mutmut_13": Equivalent(
        "if wait_s >= 0:",
        "a wait of 0 s ends at once, as no wait does: the keeper then renews, or, woken "
        "by a call that came to wait, looks again and renews",
    ),
    PLACES + "_keep__mutmut_31": Equivalent(
        "finished, kept = True, None",
        "a renewal that raised leaves `kept` None, and None alone loses every place it "
        "carried, finished or not",
    ),
    PLACES + "_keep__mutmut_33": Equivalent(
        "if not finished and kept is None or",
        "`kept` is None exactly when the renewal did not finish or raised, so `not "
        "finished or kept is None` and `not finished and kept is None` agree but for a "
        "store answering None, which no store does (`keep_places` returns a list)",
    ),
}

ENGINE = "polygate_celery.core.engine."
EQUIVALENT |= {
    ENGINE + "attempts.x_outage_progress__mutmut_11": Equivalent(
        "charged=True, down=None)",
        "`_conclude` reads `down` only for its truth (the refund, the outage count); None "
        "and False are both false",
    ),
    ENGINE + "attempts.x_after_backoff_stall__mutmut_16": Equivalent(
        "begin_round(state, None, now)",
        "`begin_round` never reads its event (it is also the handler of `start` and `poll`, "
        "whose events carry nothing it needs)",
    ),
    ENGINE + "rounds.x_after_queue_wait__mutmut_5": Equivalent(
        "return begin_round(state, None, now)",
        "`begin_round` never reads its event (see `attempts.x_after_backoff_stall__mutmut_16`)",
    ),
}

CHORDS = "polygate_celery.celery.chords."
EQUIVALENT |= {
    CHORDS + "x_counts_each_part_once__mutmut_11": Equivalent(
        '"CHORD_PART_RETURN_LUA", "XXXX")',
        "the default for a Redis backend module without Celery's chord script: any text "
        "without SISMEMBER trusts no backend, as the empty one does (a test deletes it)",
    ),
    CHORDS + "x_claim_held_s__mutmut_8": Equivalent(
        "pipeline(transaction=None)",
        "GET and PTTL of one key read alike in a MULTI or not: the two replies are the "
        "same, and only their values are used",
    ),
    CHORDS + "x_claim_held_s__mutmut_9": Equivalent(
        "pipeline(transaction=True)",
        "the same (see `x_claim_held_s__mutmut_8`)",
    ),
    CHORDS + "x__count__mutmut_24": Equivalent(
        '"XXchord\'s body may not runXX"',
        "the warning's last words only; a test checks what it says (the part, the chord, "
        "the failed count) and that it carries the exception",
        wording=True,
    ),
    CHORDS + "x__count__mutmut_25": Equivalent(
        '"CHORD\'S BODY MAY NOT RUN"',
        "the same words in capitals (see `x__count__mutmut_24`)",
        wording=True,
    ),
    CHORDS + "x__count__mutmut_42": Equivalent(
        '"XXif the process that claimed it',
        "the warning's last words only; a test checks what it says (the part, the chord, "
        "the claim not read) and that it carries the exception",
        wording=True,
    ),
    CHORDS + "x__count__mutmut_43": Equivalent(
        '"IF THE PROCESS THAT CLAIMED IT',
        "the same words in capitals (see `x__count__mutmut_42`)",
        wording=True,
    ),
}

STANDING = "polygate_celery.core.standing."
EQUIVALENT |= {
    STANDING + "x_tag__mutmut_6": Equivalent(
        "finish is None or finish <= virtual else finish",
        "where the tenant's last tag equals the class's virtual time, both branches start "
        "the tag at that same value",
    ),
    STANDING + "x_rank_of__mutmut_2": Equivalent(
        "return int(score_ / RANK_SPAN)",
        "scores are never negative (a tag is at least 1 / weight above a virtual time that "
        "starts at 0), and for those `int` of the quotient floors as `//` does",
    ),
    STANDING + "x_next_class__mutmut_9": Equivalent(
        "if floor < 0:",
        "a class of floor 0 is then looked at, but its share (never negative) is never "
        "below 0, so it is never counted below its floor; the same class is served",
    ),
}

WAIT = "polygate_celery.governance.loop.xǁGovernedCallǁ_wait"
EQUIVALENT |= {
    ENGINE + "attempts.x__plan_next__mutmut_34": Equivalent(
        "if s not in state.excluded), )",
        "the 429's source was granted from the round's order, which holds no excluded "
        "source, and a 429 excludes none, so the search always finds one and its default "
        "is never used",
    ),
    ENGINE + "attempts.x_after_backoff__mutmut_17": Equivalent(
        "begin_round(state, None, now)",
        "`begin_round` never reads its event (see `attempts.x_after_backoff_stall__mutmut_16`)",
    ),
    ENGINE + "attempts.x_settled__mutmut_8": Equivalent(
        "charged=False, down=None)",
        "`_conclude` reads `down` only for its truth (see `x_outage_progress__mutmut_11`)",
    ),
    ENGINE + "attempts.x_settled__mutmut_20": Equivalent(
        "down=None, refund=True)",
        "`_conclude` reads `down` only for its truth (see `x_outage_progress__mutmut_11`)",
    ),
    ENGINE + "attempts.x_settled__mutmut_48": Equivalent(
        "charged=True, down=None)",
        "`_conclude` reads `down` only for its truth (see `x_outage_progress__mutmut_11`)",
    ),
    WAIT + "__mutmut_23": Equivalent(
        "woken = None",
        "the engine reads `Waited.woken` only for its truth (`rounds.after_queue_wait`); "
        "None and False are both false",
    ),
    WAIT + "__mutmut_24": Equivalent(
        "woken = True",
        "`woken` is read only after a wait in the queues, a jittered poll (at least "
        "0.005 s: `poll_interval_s` >= 0.01) cut to the deadline, so it is left unslept "
        "only once the deadline has come, when the engine begins a round woken or not",
    ),
    WAIT + "__mutmut_27": Equivalent(
        '"no_runnable" or released is not None',
        "a wait for a runnable source follows a refusal in the round whose release watch "
        "`_admit` opened (it ends with the round), a backoff follows a grant, which ended "
        "it: the watch is held exactly when the cause is `no_runnable`",
    ),
}

# Outcomes that leave a promise unchecked: mutmut's statuses other than these.
KILLED = {"killed", "timeout", "caught by type check"}
NOT_REACHED = "no tests"

# Where no mutant may be left (issue: the decision core, the lease and the stall rules):
# every module of core/, the lease renewer, and the governance loop's stall rules. The
# execution guard runs only in a worker; its rules are broken by name in mutations.md.
MUST_DIE_MODULES = ("polygate_celery.core.", "polygate_celery.governance.lease")
# The stall rules themselves (the checks, rule 15's charging, the waits after a refusal,
# the reopening estimate) are the engine's, in core/ above; the driver's wait remains.
STALL_RULES = ("polygate_celery.governance.loop.xǁGovernedCallǁ_wait",)


def must_die(name: str) -> bool:
    """Whether a mutant of this function surviving fails ``make mutate``."""
    return name.startswith(MUST_DIE_MODULES) or function_of(name) in STALL_RULES


def function_of(name: str) -> str:
    return name.rsplit("__mutmut_", maxsplit=1)[0]


def results() -> dict[str, str]:
    out = subprocess.run(
        [sys.executable, "-m", "mutmut", "results", "--all", "true"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    found = {}
    for line in out.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep and name.startswith("polygate_celery."):
            found[name] = status
    return found


def show(name: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "mutmut", "show", name],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return "\n".join(line for line in out.splitlines() if line.startswith(("-", "+", " ", "@")))


def module_of(name: str) -> str:
    return name.split(".x_", maxsplit=1)[0].split(".xǁ", maxsplit=1)[0]


def main() -> int:
    found = results()
    if not found:
        print("no mutmut results: run `mutmut run` first", file=sys.stderr)
        return 1
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--", "polygate_celery", "tests"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    unreached = {n for n, s in found.items() if s == NOT_REACHED}
    left = {n: s for n, s in found.items() if s not in KILLED and n not in unreached}
    diffs = {n: show(n) for n in left}
    stale = [n for n, e in EQUIVALENT.items() if n not in left or e.mutated not in diffs[n]]
    survivors = [n for n in left if n not in EQUIVALENT or n in stale]
    equivalent = [n for n in left if n not in survivors]
    failing = [n for n in survivors + sorted(unreached) if must_die(n)]

    per_module: dict[str, Counter[str]] = {}
    for name, status in found.items():
        counts = per_module.setdefault(module_of(name), Counter())
        counts["total"] += 1
        if status in KILLED:
            counts["killed"] += 1
        elif name in unreached:
            counts["not reached"] += 1
        elif name in equivalent:
            counts["wording only" if EQUIVALENT[name].wording else "equivalent"] += 1
        else:
            counts["survived"] += 1
    totals: Counter[str] = Counter()
    for counts in per_module.values():
        totals.update(counts)

    version = importlib.metadata.version("mutmut")
    with (ROOT / "pyproject.toml").open("rb") as file:
        settings = tomllib.load(file)["tool"]["mutmut"]
    lines = [
        "# mutmut over the decision core, the governance loop and the Celery layer",
        "",
        f"`make mutate` at commit {commit}{' (with uncommitted changes)' if dirty else ''}, "
        f"mutmut {version}: `{COMMAND}`, configured in `pyproject.toml` `[tool.mutmut]`, "
        "then `python -m tests.mutation.mutmut_report`. Mutated: "
        f"{', '.join(f'`{x}`' for x in settings['only_mutate'])}. Each mutant runs the "
        "tests that reach its function, of "
        f"{', '.join(f'`{x}`' for x in settings['pytest_add_cli_args_test_selection'])} "
        f"(`pytest {' '.join(shlex.quote(a) for a in settings['pytest_add_cli_args'])}`); "
        "killed counts timeouts. mutmut 3 leaves decorated functions alone (such as "
        "`StallClock.attempting`, a `@contextmanager`, and `Outcome.used_tokens`, a "
        "`@property`), and code outside functions.",
        "",
        "No mutant may be left in `core/`, the lease renewer "
        "(`governance/lease.py`) or the governance loop's stall rules ("
        + ", ".join(f"`{f.rsplit('ǁ', 1)[1]}`" for f in STALL_RULES)
        + "): one that is fails `make mutate`. Elsewhere a survivor is listed below with "
        "its diff. *Not reached* counts mutants of code that only a Celery worker runs: "
        "its tests are in `tests/celery` (real workers, not run per mutant), and its rules "
        "are broken by name in `mutations.md` (the execution guard, the poison cap, the "
        "done marker, the countdown strategy).",
        "",
        "| module | mutants | killed | equivalent | wording only | survived | not reached |",
        "|---|---|---|---|---|---|---|",
    ]
    for module in sorted(per_module):
        c = per_module[module]
        lines.append(
            f"| `{module}` | {c['total']} | {c['killed']} | {c['equivalent']} | "
            f"{c['wording only']} | {c['survived']} | {c['not reached']} |"
        )
    lines.append(
        f"| **all** | {totals['total']} | {totals['killed']} | {totals['equivalent']} | "
        f"{totals['wording only']} | **{totals['survived']}** | {totals['not reached']} |"
    )
    same = [n for n in equivalent if not EQUIVALENT[n].wording]
    wording = [n for n in equivalent if EQUIVALENT[n].wording]
    lines += ["", f"## Equivalent ({len(same)}): no behaviour tells them apart", ""]
    lines += [f"- `{n}`: {EQUIVALENT[n].reason}." for n in same] or ["None."]
    lines += ["", f"## Wording only ({len(wording)}): a log line's text, not a promise", ""]
    lines += [f"- `{n}`: {EQUIVALENT[n].reason}." for n in wording] or ["None."]
    lines += [
        "",
        f"## Survived ({len(survivors)}; where none may be: {sum(must_die(n) for n in survivors)})",
        "",
    ]
    if not survivors:
        lines.append("None.")
    for name in survivors:
        note = " (its equivalent entry no longer matches this mutant)" if name in stale else ""
        where = " **where none may be**" if must_die(name) else ""
        lines += [f"`{name}`: {left[name]}{where}{note}", "", "```diff", diffs[name], "```", ""]
    by_function = Counter(function_of(n) for n in unreached)
    lines += ["", f"## Not reached ({len(unreached)}), by function", ""]
    lines += [
        f"- `{f}`: {k}{' **where none may be**' if must_die(f + '__mutmut_1') else ''}"
        for f, k in sorted(by_function.items())
    ] or ["None."]
    missing = [n for n in stale if n not in left]
    if missing:
        lines += ["", "Equivalent entries naming no surviving mutant: "
                  + ", ".join(f"`{n}`" for n in missing) + "."]  # fmt: skip
    REPORT.write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
    print(f"{totals['total']} mutants: {totals['killed']} killed, {totals['equivalent']} "
          f"equivalent, {totals['wording only']} wording only, {totals['survived']} survived "
          f"({len([n for n in survivors if must_die(n)])} where none may be), "
          f"{totals['not reached']} not reached -> {REPORT.relative_to(ROOT)}")  # fmt: skip
    if stale:
        print("stale equivalent entries: " + " ".join(shlex.quote(n) for n in stale))
    return 1 if failing or stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
