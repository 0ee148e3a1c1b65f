"""Fixtures of the browser tests: Debian's Chromium driven by Playwright, and the real demo behind it.

``demo`` (``tests/fixtures/demo_stack.py``, one per session, shared with the e2e demo test) runs
``orthoplex demo --keep --json-out FILE``; the tests read what it wrote to FILE and drive the
dashboard it serves. Nothing here is seeded: every row the pages show was written by the service.

A missing Chromium is a failure, not a skip (``.ci/run`` installs it).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.demo_stack import REPO, DemoStack

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
SHOTS = REPO / "var" / "screenshots"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium for one test module. Not session-scoped: Playwright's sync API keeps an asyncio loop
    running in the main thread while it is open, and every later ``asyncio.run`` (the SDK's async
    tests) or second ``sync_playwright()`` (tests/security/test_headers.py) in the session would fail."""
    if not CHROMIUM.exists():
        pytest.fail(f"Chromium is missing at {CHROMIUM}: `apt-get install -y chromium` (.ci/run does this)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        # launch() gives every browser a fresh, empty profile directory of its own
        b = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A fresh browser context (empty session storage) at 1280x800; page errors fail the test."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    ctx.set_default_timeout(30_000)
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    yield pg
    ctx.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def shot(page: Any, name: str) -> Path:
    """Save a full-page screenshot under var/screenshots/ (the CI's test artifacts)."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def sign_in(page: Any, stack: DemoStack, token: str) -> None:
    page.goto(stack.ui)
    page.get_by_test_id("token-input").fill(token)
    page.get_by_test_id("login").click()
    page.get_by_test_id("logout").wait_for()
