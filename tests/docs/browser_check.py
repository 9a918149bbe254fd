"""The built manual in a real browser: headless Chromium (Debian's ``chromium``) driven by
Playwright, against the site served locally.

``make docs-check`` builds the site, then runs this. For the home page, the
configuration reference and the Python API page it checks that the page renders
(its title, its navigation, what the page is for: the settings table, the
parameter tables), that searching finds pages, and that the browser logged no
error (console, page or failed request); it saves a screenshot of each to
``docs/screenshots/``. Needs ``apt-get install chromium`` and the ``playwright``
package (no browser download: it drives ``/usr/bin/chromium``).
"""

from __future__ import annotations

import argparse
import functools
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from playwright.sync_api import ConsoleMessage, Page, Request, Response, sync_playwright

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
VIEWPORT = {"width": 1280, "height": 900}
SEARCH_WORD = "deferral"
TIMEOUT_MS = 15_000


@dataclass
class Check:
    name: str
    path: str
    title: str  # the page's h1
    content: Callable[[Page], str | None]  # None when the page shows what it is for
    problems: list[str] = field(default_factory=list)


def _configuration(page: Page) -> str | None:
    rows = page.locator("table tr", has_text="lease_s")
    if rows.count() == 0:
        return "no settings table with lease_s"
    if "1 to 3,600" not in rows.first.inner_text():
        return "lease_s's row does not show its range"
    return None


def _api(page: Page) -> str | None:
    if page.locator("[id='polygate_celery.Gateway']").count() == 0:
        return "no Gateway heading"
    gateway = page.locator("div.doc-object", has=page.locator("[id='polygate_celery.Gateway']"))
    if gateway.locator("table", has_text="scope_gate").count() == 0:
        return "no parameter table for Gateway"
    return None


def _home(page: Page) -> str | None:
    return None if page.locator("article").inner_text().strip() else "an empty page"


CHECKS = [
    Check("home", "/", "polygate_celery", _home),
    Check("configuration", "/reference/configuration/", "Configuration", _configuration),
    Check("api", "/reference/api/", "Python API", _api),
]


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def served(site: Path) -> Iterator[str]:
    """The built site over HTTP on a free local port (search needs HTTP, not file://)."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _watch(page: Page, problems: list[str]) -> None:
    def console(message: ConsoleMessage) -> None:
        if message.type == "error":
            problems.append(f"console error: {message.text}")

    def failed(request: Request) -> None:
        problems.append(f"request failed: {request.url} ({request.failure})")

    def response(answer: Response) -> None:
        if answer.status >= 400:
            problems.append(f"HTTP {answer.status}: {answer.url}")

    page.on("console", console)
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.on("requestfailed", failed)
    page.on("response", response)


def _search(page: Page) -> str | None:
    """Type a word into the search box; None when results list pages."""
    box = page.locator("input.md-search__input")
    box.click()
    box.press_sequentially(SEARCH_WORD, delay=30)  # typed, as a reader does
    results = page.locator(".md-search-result__item")
    try:
        results.first.wait_for(state="visible", timeout=TIMEOUT_MS)
    except Exception:
        return f"searching {SEARCH_WORD!r} showed no results"
    meta = page.locator(".md-search-result__meta").inner_text().strip()
    print(f"    search {SEARCH_WORD!r}: {meta}")
    return None


def check(check: Check, page: Page, base: str, screenshots: Path) -> None:
    _watch(page, check.problems)
    page.goto(base + check.path, wait_until="networkidle")
    title = page.locator("article h1").first.inner_text().strip().rstrip("¶").strip()
    if title != check.title:
        check.problems.append(f"title {title!r}, expected {check.title!r}")
    nav = page.locator("nav.md-nav--primary")
    links = nav.locator("a.md-nav__link").count()
    if links < 10 or nav.get_by_text("Reference").count() == 0:
        check.problems.append(f"navigation missing or short ({links} links)")
    problem = check.content(page)
    if problem:
        check.problems.append(problem)
    page.screenshot(path=screenshots / f"{check.name}.png")
    problem = _search(page)
    if problem:
        check.problems.append(problem)
    elif check.name == "home":
        page.screenshot(path=screenshots / "search.png")
    page.keyboard.press("Escape")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/docs/browser_check.py")
    parser.add_argument("--site", type=Path, default=ROOT / "site", help="the built site")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    parser.add_argument("--chromium", default=CHROMIUM, help="the browser's executable")
    args = parser.parse_args(argv)
    if not (args.site / "index.html").exists():
        print(f"error: no built site in {args.site} (run `make docs` first)", file=sys.stderr)
        return 2
    if not Path(args.chromium).exists():
        print(f"error: no {args.chromium}: apt-get install -y chromium", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    with served(args.site) as base, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=args.chromium)
        print(f"{browser.version} on {base}")
        try:
            for item in CHECKS:
                page = browser.new_page(viewport=VIEWPORT)  # type: ignore[arg-type]
                page.set_default_timeout(TIMEOUT_MS)
                try:
                    check(item, page, base, args.out)
                except Exception as exc:
                    item.problems.append(f"{type(exc).__name__}: {exc}")
                finally:
                    page.close()
                verdict = "ok" if not item.problems else "FAILED"
                print(f"{item.name} ({item.path}): {verdict}")
                for problem in item.problems:
                    print(f"    {problem}")
        finally:
            browser.close()
    failed = [item.name for item in CHECKS if item.problems]
    print(f"screenshots in {args.out}" if not failed else f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
