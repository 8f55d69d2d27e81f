"""Fixtures: a real `sandbank serve` with the scripted model, and Debian's Chromium driven by Playwright."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, Playwright, sync_playwright

from tests.interpreter.fake_llm import FakeLLM, fake_llm
from tests.interpreter.harness import Client, Server, openai_env, running
from tests.tiers import needs

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-gpu",
    "--disable-component-update",
    "--no-first-run",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
UPLOAD_CAP = 100_000  # bytes: small, so that a refused upload is quick to make
TRUSTED_HEADER = "X-Remote-User"
# Chromium logs every 4xx answer of fetch() as "Failed to load resource" on the console.
NETWORK_ERROR = re.compile(r"^Failed to load resource: the server responded with a status of (\d+)")


@pytest.fixture(scope="package")  # torn down with the package: Playwright holds an event loop
def llm() -> Iterator[FakeLLM]:
    with fake_llm() as fake:
        yield fake


@pytest.fixture(scope="package")  # torn down with the package: Playwright holds an event loop
@needs("root")
def server(llm: FakeLLM) -> Iterator[Server]:
    """One server for the suite; a browser sending the trusted header plays the proxy."""
    env = {
        **openai_env(llm.url),
        "SANDBANK_PUT_FILE_MAX_BYTES": str(UPLOAD_CAP),
        "SANDBANK_TRUSTED_USER_HEADER": TRUSTED_HEADER,
        "SANDBANK_TRUSTED_PROXIES": "127.0.0.1/32",
    }
    with running(env) as s:
        yield s


@pytest.fixture
def user(server: Server) -> Iterator[Client]:
    with server.new_user() as client:
        yield client


@pytest.fixture(scope="package")  # torn down with the package: Playwright holds an event loop
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="package")  # torn down with the package: Playwright holds an event loop
@needs("chromium")
def browser(playwright: Playwright) -> Iterator[Browser]:
    # No skip on failure: a browser that does not start fails every test that needs it.
    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    yield browser
    browser.close()


@dataclass
class Console:
    """What the page reported: console errors and warnings, uncaught exceptions, requests."""

    messages: list[tuple[str, str, str]] = field(default_factory=list)  # (type, text, url)
    exceptions: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def watch(self, page: Page) -> None:
        page.on("console", self._on_console)
        page.on("pageerror", lambda e: self.exceptions.append(str(e)))
        page.on("request", lambda r: self.requests.append(r.url))

    def _on_console(self, message: ConsoleMessage) -> None:
        if message.type in ("error", "warning"):
            self.messages.append((message.type, message.text, message.location.get("url", "")))

    def unexpected(self, *refusals: tuple[int, str]) -> list[str]:
        """Everything reported but the API's refusals the test caused: (status, path prefix)."""
        found = list(self.exceptions)
        for kind, text, url in self.messages:
            network = NETWORK_ERROR.match(text)
            path = urlsplit(url).path
            if network and any(
                int(network.group(1)) == status and path.startswith(prefix)
                for status, prefix in refusals
            ):
                continue
            found.append(f"{kind}: {text} ({url})")
        return found


# The page asks GET /api/sessions without a key once, to learn whether a proxy signs users in.
PROBE = (403, "/api/sessions")


@dataclass
class Tab:
    page: Page
    console: Console
    base_url: str

    def shot(self, name: str) -> None:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=SCREENSHOTS / f"{name}.png", full_page=True)


@pytest.fixture
def tab(browser: Browser, server: Server) -> Iterator[Tab]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    console = Console()
    console.watch(page)
    yield Tab(page, console, server.url)
    context.close()
