"""Read the built book in headless Chromium, as a reader would, for tests/test_book.py.

The book is served over HTTP from 127.0.0.1 under its project sub-path (``/<repo>/``, as
GitHub Pages serves a project site), with the book's own ``404.html`` for a missing page.
Chromium is driven by Playwright; every host other than 127.0.0.1 fails to resolve, so a
page that needs the network to read well fails its test. Accessibility is checked with
axe-core (``axe-playwright-python``).
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import Page, sync_playwright

# Debian's Chromium where there is one (the course's CI machine); elsewhere, such as
# GitHub's Ubuntu runners, Playwright's own (`python -m playwright install chromium`).
CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
]
VIEWPORT = {"width": 1280, "height": 1000}
# The rules of WCAG 2.0 and 2.1, levels A and AA; and label-in-name (WCAG 2.5.3, level A),
# which axe-core runs only when asked, since it is marked experimental
WCAG_21_AA = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]
EXPERIMENTAL_RULES = {"label-content-name-mismatch": {"enabled": True}}


def chromium_executable() -> str | None:
    """Debian's chromium (installed with apt when missing and we are root, as on the
    course's CI); None to use Playwright's own Chromium."""
    if not Path(CHROMIUM).exists() and os.geteuid() == 0 and shutil.which("apt-get"):
        for command in (
            ["apt-get", "update"],
            ["apt-get", "install", "-y", "chromium"],
        ):
            subprocess.run(command, check=True, capture_output=True, timeout=900)
    return CHROMIUM if Path(CHROMIUM).exists() else None


class _BookHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the book under ``prefix`` and answers a missing page with its 404.html."""

    prefix = "/"

    def translate_path(self, path):
        if not path.startswith(self.prefix):
            return str(Path(self.directory) / "__outside_the_book__")
        return super().translate_path("/" + path[len(self.prefix) :])

    def send_error(self, code, message=None, explain=None):
        page = Path(self.directory) / "404.html"
        if code != 404 or not page.exists():
            return super().send_error(code, message, explain)
        body = page.read_bytes()
        self.send_response(404)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, *args):
        pass


def axe_violations(page: Page) -> list[dict]:
    """axe-core's WCAG 2.0/2.1 A and AA violations on ``page``, once its math is
    typeset."""
    page.wait_for_function("() => !window.MathJax || MathJax.startup?.promise")
    page.evaluate("async () => { await window.MathJax?.startup?.promise; }")
    options = {
        "runOnly": {"type": "tag", "values": WCAG_21_AA},
        "rules": EXPERIMENTAL_RULES,
    }
    return Axe().run(page, options=options).response["violations"]


class Site:
    """The built book served over HTTP on 127.0.0.1 under ``prefix``, from a thread."""

    def __init__(self, root: Path, prefix: str):
        handler = functools.partial(
            type("Handler", (_BookHandler,), {"prefix": prefix}), directory=str(root)
        )
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.origin = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.url = self.origin + prefix
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Visit:
    """What one page did as it loaded: the script's value and the page's traffic."""

    value: object = None
    status: int | None = None
    requested: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # "url: status or error"
    errors: list[str] = field(default_factory=list)  # uncaught JavaScript errors
    # axe-core's WCAG 2.0/2.1 A and AA violations, when the visit asked for them
    violations: list[dict] | None = None


class Browser:
    """One headless Chromium; each page opens in a fresh page of its own context."""

    def __init__(self, timeout: float = 180.0):
        self._playwright = sync_playwright().start()
        self.browser = self._playwright.chromium.launch(
            executable_path=chromium_executable(), args=FLAGS, headless=True
        )
        self.timeout_ms = timeout * 1000

    def open(self, url: str, dark: bool = False) -> tuple[Page, Visit]:
        """A new page at ``url``, loaded (the caller closes its context)."""
        context = self.browser.new_context(
            viewport=VIEWPORT, color_scheme="dark" if dark else "light"
        )
        if dark:  # the theme's own switch, as a reader who chose dark mode has it
            context.add_init_script("localStorage.setItem('theme', 'dark')")
        page = context.new_page()
        page.set_default_timeout(self.timeout_ms)
        visit = Visit()
        page.on("request", lambda r: visit.requested.append(r.url))
        page.on("requestfailed", lambda r: visit.failed.append(f"{r.url}: {r.failure}"))
        page.on(
            "response",
            lambda r: r.status >= 400 and visit.failed.append(f"{r.url}: {r.status}"),
        )
        page.on("pageerror", lambda e: visit.errors.append(str(e)))
        response = page.goto(url, wait_until="load")
        visit.status = response.status if response else None
        return page, visit

    def visit(
        self,
        url: str,
        script: str,
        screenshot: Path | None = None,
        dark=False,
        axe=False,
    ) -> Visit:
        """Open ``url``, evaluate ``script`` (an async function body returning JSON-able
        data) once it has loaded, and report; with ``axe``, also axe-core's violations
        on the same page (one load serves both)."""
        page, visit = self.open(url, dark)
        try:
            visit.value = page.evaluate(f"async () => {{ {script} }}")
            if (
                axe
            ):  # axe-core fetches the page's stylesheets itself: not the page's doing
                page_did = [
                    list(x) for x in (visit.requested, visit.failed, visit.errors)
                ]
                visit.violations = axe_violations(page)
                visit.requested, visit.failed, visit.errors = page_did
            if screenshot is not None:
                screenshot.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(screenshot), full_page=True)
            return visit
        finally:
            page.context.close()

    def accessibility_violations(self, url: str, dark: bool = False) -> list[dict]:
        """axe-core's WCAG 2.0/2.1 A and AA violations on the page at ``url``."""
        page, _ = self.open(url, dark)
        try:
            return axe_violations(page)
        finally:
            page.context.close()

    def close(self):
        self.browser.close()
        self._playwright.stop()
