"""The API as a real server and a real headless Chromium that can reach nothing but it.

- `ApiServer(settings)`: `uvicorn api.main:app` as a child process on a free loopback port, on the
  test's private settings (the API keys included); `.url`, `.wait_ready()`; a `Process` (stop, log).
- `chromium()`: Debian's Chromium (`/usr/bin/chromium`, installed by `.ci/run`) driven by Playwright
  (its own browser download is not used: the machine cannot fetch it).
- `OfflinePage(browser, url)`: a fresh browser context (its own sessionStorage) whose every request
  to another origin is aborted and recorded in `.blocked`, with the page's uncaught script errors in
  `.errors`: a page that needs the internet, or throws, shows there.

Import from this module directly (not from tests.support): it needs Playwright, the unit tests do not.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from playwright.sync_api import Browser, Page, Route, sync_playwright

from infra.private import free_port
from producers.settings import Settings
from tests.support.processes import Process
from tests.support.waiting import wait_for

__all__ = ["CHROMIUM", "ApiServer", "OfflinePage", "chromium", "free_port"]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


class ApiServer(Process):
    """`uvicorn api.main:app` on a free loopback port, reading exactly `settings` (as `ledger serve` would)."""

    name = "api"

    def __init__(self, settings: Settings, **extra_env: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = ["-m", "uvicorn", "api.main:app", "--host", "127.0.0.1", "--port", str(self.port)]
        super().__init__(settings, [*argv, "--log-level", "warning"], **extra_env)

    def wait_ready(self, timeout: float = 90.0) -> ApiServer:
        """Until /v1/health answers 200 (fails at once, with the log, if the server exited)."""

        def up() -> bool:
            self.check()
            try:
                return httpx.get(f"{self.url}/v1/health", timeout=5).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(up, timeout, 0.2, "the API server")
        return self

    def start(self) -> ApiServer:
        super().start()
        return self


@contextmanager
def chromium() -> Iterator[Browser]:
    """A headless Chromium (the system's), closed on exit."""
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield browser
        finally:
            browser.close()


class OfflinePage:
    """A page in a fresh context that may load only from `base_url`'s origin; `.close()` when done."""

    def __init__(self, browser: Browser, base_url: str, *, width: int = 1440, height: int = 900) -> None:
        self.origin = base_url.rstrip("/")
        self.blocked: list[str] = []
        self.errors: list[str] = []  # uncaught script errors
        self.console_errors: list[str] = []  # console.error lines (the browser logs each 4xx answer there too)
        self.context = browser.new_context(base_url=self.origin, viewport={"width": width, "height": height})
        self.context.route("**/*", self._gate)
        self.page: Page = self.context.new_page()
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        self.page.on("console", lambda msg: self.console_errors.append(msg.text) if msg.type == "error" else None)

    def _gate(self, route: Route) -> None:
        url = route.request.url
        if url == self.origin or url.startswith(self.origin + "/"):
            route.continue_()
        else:
            self.blocked.append(url)
            route.abort("blockedbyclient")

    def close(self) -> None:
        self.context.close()

    def __enter__(self) -> OfflinePage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
