"""Fixtures of the browser tests: Debian's Chromium driven by Playwright, and the real demo behind it.

``demo`` runs ``orthoplex demo --keep --json-out FILE`` once per session: a local Ray cluster with
declared GPUs, ``orthoplex serve`` (API + controller) on SQLite, two tenants whose jobs train for real,
and a killed node that the bigger job recovers from. The tests read what it wrote to FILE and drive
the dashboard it serves. Nothing here is seeded: every row the pages show was written by the service.

A missing Chromium is a failure, not a skip (``.ci/run`` installs it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
REPO = Path(__file__).resolve().parents[2]
SHOTS = REPO / "var" / "screenshots"
DEMO_STEPS, DEMO_KILL_AT = 24, 4  # margin for the kill to land before the job ends


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.fail(f"Chromium is missing at {CHROMIUM}: `apt-get install -y chromium` (.ci/run does this)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        # launch() gives every browser a fresh, empty profile directory of its own
        b = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


class Stack:
    """The demo's service as the tests see it."""

    def __init__(self, info: dict[str, Any], workdir: Path) -> None:
        self.info = info
        self.workdir = workdir
        self.api = info["api_url"]
        self.ui = info["dashboard_url"]
        self.admin_token = info["admin_token"]
        self.tenants = {t["name"]: t for t in info["tenants"]}

    def client(self, token: str | None = None) -> httpx.Client:
        return httpx.Client(base_url=self.api, timeout=60,
                            headers={"Authorization": f"Bearer {token or self.admin_token}"})

    def tenant_id(self, name: str) -> int:
        with self.client() as c:
            return next(t["id"] for t in c.get("/v1/tenants").json()["items"] if t["name"] == name)


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("demo")
    out = workdir / "demo.json"
    (REPO / "var").mkdir(exist_ok=True)
    log_path = REPO / "var" / "browser-demo.log"  # kept after the run, beside the screenshots
    env = dict(os.environ)
    env.pop("ORTHOPLEX_DATABASE_URL", None)  # the demo's own SQLite file
    env.update({"PYTHONUNBUFFERED": "1", "RAY_AUTH_MODE": "disabled", "COLUMNS": "120"})
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "demo", "--keep", "--json-out", str(out), "--workdir", str(workdir),
             "--steps", str(DEMO_STEPS), "--kill-at-step", str(DEMO_KILL_AT), "--timeout-s", "840"],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 900  # about 90 s on a quiet machine; much more on a loaded one
        while not out.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the demo did not write {out.name} (exit {proc.poll()}):\n"
                            + log_path.read_text(errors="replace")[-4000:])
            time.sleep(1)
        stack = Stack(json.loads(out.read_text()), workdir)
        printed = time.monotonic() + 60  # the URL is printed right after the file is written
        while stack.ui not in log_path.read_text(errors="replace"):
            assert time.monotonic() < printed, "the demo did not print the dashboard URL"
            time.sleep(0.5)
        yield stack
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # the demo stops its service and cluster on Ctrl-C
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)


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


def sign_in(page: Any, stack: Stack, token: str) -> None:
    page.goto(stack.ui)
    page.get_by_test_id("token-input").fill(token)
    page.get_by_test_id("login").click()
    page.get_by_test_id("logout").wait_for()
