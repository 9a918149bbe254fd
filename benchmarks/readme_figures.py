"""The measured figures of the README and the manual, generated from the committed
results files.

Each figure block of README.md or of a page under docs/ sits between
``<!-- figures:NAME -->`` and ``<!-- /figures:NAME -->``; this script renders every
block from the files in ``benchmarks/`` that a passing run wrote, so no page can
quote a figure no committed result supports. A block may appear on several pages;
every block appears on one at least. ``tests/benchmarks/test_readme_figures.py``
fails when a block differs from what the results say.

Usage: ``python benchmarks/readme_figures.py`` prints the blocks;
``--write`` puts them into README.md and the pages of docs/.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
GOODPUT = ROOT / "benchmarks" / "RESULTS.md"
README = ROOT / "README.md"
DOCS = ROOT / "docs"

CONTENDERS = {
    "openai client, default retries": "openai client, its default retries",
    "Celery autoretry_for + retry_backoff": (
        "Celery `autoretry_for`, `retry_backoff`, `max_retries=5`"
    ),
    "tenacity wait_random_exponential": (
        "tenacity `wait_random_exponential(min=1, max=60)`, 6 attempts"
    ),
    "polygate_celery": "**polygate_celery**",
}
TIMES = "\u00d7"  # the multiplication sign of the README's figures


def table_rows(text: str, heading: str) -> dict[str, list[str]]:
    """The first table after the heading that starts with `heading`: first cell -> cells."""
    start = text.index(heading)
    rows: dict[str, list[str]] = {}
    for line in text[start:].splitlines()[1:]:
        if line.startswith("## "):
            break
        if line.startswith("| ") and not line.startswith("|--") and "---" not in line:
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            rows.setdefault(cells[0], cells[1:])
        elif rows and not line.startswith("|"):
            break
    return rows


def whole(number: str) -> str:
    """`number` rounded to a whole number, halves up (156.5 -> 157)."""
    return str(Decimal(number).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def goodput() -> str:
    """The side-by-side goodput table, steady and with the outage, and its settings."""
    text = GOODPUT.read_text(encoding="utf-8")
    steady = table_rows(text, "## Scenario `steady`")
    outage = table_rows(text, "## Scenario `outage`")
    lines = [
        "| | tasks completed / failed | requests sent | 429s | finish |",
        "|---|---|---|---|---|",
    ]
    for key, name in CONTENDERS.items():
        for row_name, rows in ((name, steady), ("with a 60 s outage", outage)):
            done, failed, lost, attempts, limited, _, finish = rows[key][:7]
            label = row_name
            outcome = f"{done} / {failed}" + (f", {lost} never finished" if lost != "0" else "")
            finish = "—" if finish == "—" else f"{whole(finish)} s"
            cells = [outcome, f"{int(attempts):,}", f"{int(limited):,}", finish]
            if key == "polygate_celery":
                label = f"**{label}**" if label != name else label
                cells = [f"**{cell}**" for cell in cells]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    settings = re.search(r"```toml\n(.*?)```", text, re.S)
    assert settings is not None, "RESULTS.md names no configuration"
    names = re.findall(r"^(\w+) = (.+)$", settings.group(1), re.M)
    structure = ("base_url", "model", "api_key_env", "kind", "sources")
    chosen = [f"`{k} = {v}`" for k, v in names if k not in structure]
    lines += [
        "",
        "The governed contender's settings besides the defaults: " + ", ".join(chosen) + ".",
    ]
    return "\n".join(lines)


def deferral() -> str:
    """The Celery deferral benchmark's summary rows."""
    text = (RESULTS / "celery_deferral.md").read_text(encoding="utf-8")
    rows = table_rows(text, "## Summary")
    commit = re.search(r"polygate_celery at commit (\w+)", text)
    park = rows["worker RSS growth, 10,000 tasks deferred at once, `park`"][0]
    lag_key = next(k for k in rows if k.startswith("release lag"))
    ratio_key = next(k for k in rows if "governed no-op task" in k)
    source = "`python benchmarks/celery_deferral.py` → `benchmarks/results/celery_deferral.md`"
    at = f" (commit {commit.group(1)})" if commit else ""
    return "\n".join(
        [
            f"| worker memory, 10,000 tasks deferred at once (parking) | +{park} | {source}{at} |",
            f"| release lag of due parked tasks, p99 | {rows[lag_key][0]} "
            f"({rows[lag_key][2].strip('*').lower()} against {rows[lag_key][1]}) | same |",
            f"| governed ÷ plain no-op task throughput | {rows[ratio_key][0]} "
            f"(target {rows[ratio_key][1]}) | same |",
        ]
    )


def redis_store() -> str:
    """Round trips and overhead per governed call, from the store benchmark."""
    text = (RESULTS / "redis_store.md").read_text(encoding="utf-8")
    trips = re.search(r"\*\*total round trips\*\* \| \*\*([\d.]+)\*\*", text)
    ratio = re.search(r"overhead / PING \(medians\): \*\*([\d.]+)\*\* \(target (.+?)\)", text)
    assert trips, "redis_store.md lost its round-trip line"
    assert ratio, "redis_store.md lost its ratio line"
    latency = table_rows(text, "## Latency")
    governed = latency["governed, Redis store"][0]
    ping = latency["async PING, same client"][0]
    source = "`python benchmarks/redis_store.py` → `benchmarks/results/redis_store.md`"
    return "\n".join(
        [
            f"| Redis round trips per successful call | {float(trips.group(1)):g} (admit, settle) "
            f"| {source} |",
            f"| governance overhead per uncontended call, Redis store | {ratio.group(1)} {TIMES} "
            f"an async PING ({ratio.group(2)}): {governed} µs median, a PING {ping} µs, in one run "
            "| same |",
        ]
    )


def goodput_rows() -> str:
    """The governed contender's rows of the goodput benchmark, per scenario."""
    text = GOODPUT.read_text(encoding="utf-8")
    scenarios = {
        "steady": "300 tasks under a 120 RPM token-bucket quota",
        "outage": "the same with a 60 s outage",
        "undeclared": "the same with no rpm declared (OpenAI's headers)",
        "undeclared-anthropic": "the same with no rpm declared (Anthropic's headers)",
        "window": "a provider counting 60 s windows, rpm declared, no window declared",
    }
    lines = []
    for scenario, what in scenarios.items():
        heading = f"## Scenario `{scenario}`"
        ideal = re.search(re.escape(heading) + r".*?ideal finish ([\d.]+ s)", text)
        done, failed, lost, attempts, limited, _, finish = table_rows(text, heading)[
            "polygate_celery"
        ][:7]
        source = "`make bench` → `benchmarks/RESULTS.md`" if not lines else "same"
        lines.append(
            f"| {what} | {done} / {failed} completed / failed, {lost} lost; {attempts} requests, "
            f"{limited} refused (429); finish {finish} s (ideal {ideal.group(1) if ideal else '?'})"
            f" | {source} |"
        )
    return "\n".join(lines)


def wakeups() -> str:
    """Refused admissions and cost per acquisition as the fleet grows, before and after."""
    text = (RESULTS / "fleet_wakeups.md").read_text(encoding="utf-8")
    before = table_rows(text, "### before")
    after = table_rows(text, "### after, with the fair queue")
    fifo = table_rows(
        text[text.index("### after, with the fair queue") :], "FIFO list semaphore, right after"
    )
    most = list(after)[-1]  # the most processes
    b_row, a_row, f_row = before[most], after[most], fifo[most]
    return (
        f"| permit waiters across {most.replace(' x ', ' processes x ')} callers, cap 4 "
        f"| {a_row[1]} refused admissions per acquisition ({b_row[1]} before fleet-wide "
        f"hand-over), {a_row[2]} Redis commands and {a_row[3]} of Redis CPU per acquisition; "
        f"slowest wait {a_row[5].split(' / ')[-1]} against a first-come-first-served "
        f"{a_row[6]} at that rate, and {f_row[5].split(' / ')[-1]} for a FIFO list "
        f"semaphore (BLPOP, no lease) on the same machine "
        f"| `python benchmarks/fleet_wakeups.py [--semaphore fifo]` → "
        "`benchmarks/results/fleet_wakeups.md` |"
    )


STATIC = """\
| 1,000 tasks through an outage longer than the stall window | all SUCCESS, executions = \
deferrals + 1 | `tests/celery/test_outage_run.py` |
| SIGKILL of a pool process mid-call | redelivered, its permit back within the lease (checked \
on Redis's clock) | `tests/celery/test_worker_processes.py` (`make soak`: 20 trials) |
| deferral under 13 Celery features {TIMES} 5 faults, real workers | every cell: final state once, \
one completed run per submission, nothing left | `tests/celery/test_matrix.py` (`make soak` → \
`benchmarks/results/soak.md`) |
| heavy fault trials (20,000 contended acquisitions, 20 + 20 worker kills, Redis frozen \
then killed under 1,000 tasks) | rows only from runs whose tests passed | `make soak` → \
`benchmarks/results/soak.md` |
| every guarded rule broken on purpose | each makes its tests fail | `make mutate` → \
`benchmarks/results/mutations.md` |"""


def mutmut() -> str:
    """What mutmut's mutants of the core, the loop and the Celery layer came to."""
    text = (RESULTS / "mutmut.md").read_text(encoding="utf-8")
    cells = table_rows(text, "| module |")["**all**"]
    total, killed, equivalent, wording, survived, unreached = (int(c.strip("*")) for c in cells)
    where = re.search(r"## Survived \((\d+); where none may be: (\d+)\)", text)
    assert where, "mutmut.md lost its Survived heading"
    return (
        "| mutants of the decision core, the governance loop and the Celery layer (mutmut) "
        f"| {total:,} made: {killed:,} killed, {equivalent + wording:,} equivalent or log "
        f"wording, {survived} survived, {where.group(2)} of them in `core/`, the lease or "
        f"the stall rules; {unreached:,} in worker-only code, not run per mutant "
        "| `make mutate` → `benchmarks/results/mutmut.md` |"
    )


FAULTS = {
    "pool_kill": "pool-child SIGKILL",
    "conn_drop": "`CLIENT KILL` of broker connections",
    "cold_shutdown": "cold shutdown",
    "redis_restart": "Redis restart with tasks parked",
}


def matrix() -> str:
    """What the soak tier's matrix groups met, from their rows in soak.md."""
    text = (RESULTS / "soak.md").read_text(encoding="utf-8")
    groups = re.findall(
        r"^\| `tests/celery/test_matrix\.py::test_a_deferred_task_survives_the_fault"
        r"\[(\w+)-(\w+)\]` \| (.*?) \| (.*?) \|$",
        text,
        re.M,
    )
    assert groups, "soak.md has no matrix rows"
    injected: dict[str, list[str]] = {}
    reruns = plain = lost = 0
    for fault, _pool, figures, _run in groups:
        if fault in FAULTS:
            count = re.search(r"; (\d+) injections", figures)
            assert count, f"a matrix row without its injections: {figures[:60]}"
            injected.setdefault(fault, []).append(count.group(1))
        reruns += sum(int(n) for n in re.findall(r"(\d+) run\(s\) again after a kill", figures))
        plain += sum(int(n) for n in re.findall(r"(\d+) plain follow-up run\(s\) again", figures))
        lost += sum(int(n) for n in re.findall(r"(\d+) task\(s\) never read", figures))
    runs = sorted({run.split(", exit")[0] for *_, run in groups})
    faults = "; ".join(
        f"{FAULTS[fault]}: {' and '.join(counts)}" for fault, counts in injected.items()
    )
    return (
        f"The soak tier ran every cell at 200 tasks per row, and every group passed "
        f"(`benchmarks/results/soak.md`, {' and '.join(runs)}; {len(groups)} groups; "
        f"injections per group: {faults}; {reruns} run(s) of a body again after a kill "
        f"between its end and its stored outcome, {plain} plain follow-up run(s) again; "
        f"{lost} task(s) lost in delivery):"
    )


def memory() -> str:
    """The key layout's table of measured sizes, and what an entity costs, from the
    store benchmark's MEMORY USAGE table."""
    text = (RESULTS / "redis_store.md").read_text(encoding="utf-8")
    rows = table_rows(text, "## Memory").items()
    size = {key.strip("`"): int(cells[0]) for key, cells in rows if cells[0].isdigit()}

    def entry(prefix: str) -> int:
        found = [n for key, n in size.items() if key.startswith(prefix)]
        assert found, f"redis_store.md has no MEMORY USAGE row for {prefix!r}"
        return found[0]

    one, eight = entry("src:fast:permits (1 held)"), entry("src:fast:permits (8 held)")
    state, bucket = entry("src:fast:state"), entry("quota:source:fast")
    small, large = entry("quota:full-120:log"), entry("quota:full-10000:log")
    progress = entry("scope:bench:progress")

    def kb(n: float) -> str:
        return f"{n / 1000:.2g} KB"

    return "\n".join(
        [
            "| key | type | holds | bytes (measured) |",
            "|---|---|---|---|",
            "| `{t}:v1:src:<source>:permits` | sorted set | permit id → lease expiry "
            f"| {one:,} with 1 lease, {eight:,} with 8; gone when none |",
            "| `{t}:v1:src:<source>:state` | hash | breaker, AIMD limit, pause, learned quota "
            f"| {state:,} (without a learned quota) |",
            "| `{t}:v1:quota:<group>` | hash | bucket (GCRA) times for RPM and TPM "
            f"| {bucket:,} |",
            "| `{t}:v1:quota:<group>:log` | sorted set, TTL one window | the RPM sliding window: "
            "one admission time per request, at most rpm (those past the window are dropped "
            f"once it is full) | {small:,} at 120 RPM, {large / 1e6:.2f} MB at 10,000 RPM |",
            "| `{t}:v1:scope:<scope>:progress` | string, TTL 3,600 s | time of the last success "
            f"| {progress:,} |",
            "",
            "(`{t}`: `{<prefix>}`, or `{<prefix>/<group>}` on a cluster.)",
            "",
            f"A source therefore costs about {kb(one + state)} plus {(eight - one) / 7:.0f} "
            f"bytes per lease in flight, a quota group {kb(bucket)} plus, with "
            f'`rpm_window = "sliding"`, about {small / 120:.0f} bytes per request a minute up '
            f"to 128 RPM and {large / 10_000:.0f} bytes above (the default bucket keeps no "
            f"log), a scope {kb(progress)}.",
        ]
    )


def measured() -> str:
    """The Measured table: every row from a committed results file or a named test."""
    header = "| what | figure | how |\n|---|---|---|"
    static = STATIC.replace("\\\n", "").replace("{TIMES}", TIMES)
    return "\n".join(
        [header, redis_store(), wakeups(), deferral(), goodput_rows(), static, mutmut()]
    )


def table_lines(text: str, header: str) -> list[str]:
    """The lines of the table whose header row starts with `header`, as written."""
    lines = []
    for line in text[text.index(header) :].splitlines():
        if not line.startswith("|"):
            break
        lines.append(line)
    return lines


def demo() -> str:
    """The demo's runs, idle and beside CPU-bound processes, as demo_runs.md has them."""
    text = (RESULTS / "demo_runs.md").read_text(encoding="utf-8")
    return "\n".join(table_lines(text, "| run | load |"))


def fairness() -> str:
    """Waiting for a shared quota, before and after bookings, as quota_fairness.md has it."""
    text = (RESULTS / "quota_fairness.md").read_text(encoding="utf-8")
    return "\n".join(table_lines(text, "| run | processes x callers |"))


def priority() -> str:
    """Interactive calls behind a batch backlog on a shared quota, as priority.md has it."""
    text = (RESULTS / "priority.md").read_text(encoding="utf-8")
    return "\n".join(table_lines(text, "| phase | interactive calls |"))


def fair_share() -> str:
    """Three tenants' token shares of one quota, as fair_share.md has it."""
    text = (RESULTS / "fair_share.md").read_text(encoding="utf-8")
    return "\n".join(table_lines(text, "| window | tokens a / b / c |"))


def tenant_caps() -> str:
    """Tenants' caps counted at the provider, as tenant_caps.md has it."""
    text = (RESULTS / "tenant_caps.md").read_text(encoding="utf-8")
    return "\n".join(table_lines(text, "| tenant | cap |"))


def fleet() -> str:
    """1,000+ concurrent governed calls under one cap and one quota, as fleet.md has it."""
    text = (RESULTS / "fleet.md").read_text(encoding="utf-8")
    return "\n".join(table_lines(text, "| what | figure |"))


BLOCKS: dict[str, Callable[[], str]] = {
    "goodput": goodput,
    "memory": memory,
    "measured": measured,
    "matrix": matrix,
    "demo": demo,
    "fairness": fairness,
    "priority": priority,
    "fairshare": fair_share,
    "tenantcaps": tenant_caps,
    "fleet": fleet,
}

OPENING = re.compile(r"<!-- figures:(\w+) -->")


def pages() -> list[Path]:
    """The files that may hold figure blocks: README.md and every page of docs/."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def render(text: str, where: str = "README.md") -> str:
    """`text` with every figure block it holds rendered anew."""
    unknown = sorted(set(OPENING.findall(text)) - BLOCKS.keys())
    if unknown:
        raise SystemExit(f"{where} has figure blocks no results file renders: {unknown}")
    for name, make in BLOCKS.items():
        pattern = re.compile(
            rf"(<!-- figures:{name} -->\n)(?:.*?\n)?(<!-- /figures:{name} -->)", re.S
        )
        if not pattern.search(text):
            continue
        body = make()
        text = pattern.sub(lambda m, body=body: m.group(1) + body + "\n" + m.group(2), text)
    return text


def unplaced(texts: list[str]) -> list[str]:
    """The blocks no page holds (a block dropped from every page goes unchecked)."""
    return [name for name in BLOCKS if not any(f"<!-- figures:{name} -->" in t for t in texts)]


def main(argv: list[str]) -> int:
    if "--write" in argv:
        for page in pages():
            text = page.read_text(encoding="utf-8")
            rendered = render(text, str(page.relative_to(ROOT)))
            if rendered != text:
                page.write_text(rendered, encoding="utf-8")
    else:
        for name, make in BLOCKS.items():
            print(f"<!-- figures:{name} -->\n{make()}\n<!-- /figures:{name} -->\n")
    missing = unplaced([page.read_text(encoding="utf-8") for page in pages()])
    if missing:
        print(f"no page holds the figure blocks {missing}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
