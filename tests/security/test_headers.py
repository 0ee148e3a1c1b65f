"""Headers as a hostile page would probe them (issue 44), against a real ``orthoplex serve``: every
``/ui`` response, the static files included, carries the CSP with ``frame-ancestors 'none'``,
``X-Frame-Options`` and ``nosniff`` (``/ui/static/index.html`` could be framed before); every
``/v1`` answer is ``Cache-Control: no-store`` (the one-time token included); ``/docs`` loads
nothing from another origin, checked in Chromium."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.conftest import CHROMIUM_ARGS
from tests.service.conftest import ADMIN, ADMIN_TOKEN
from tests.service.live import LiveServer

pytestmark = pytest.mark.unit
CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    from service.db import migrate

    tmp = tmp_path_factory.mktemp("headers")
    url = f"sqlite:///{tmp / 'orthoplex.db'}"
    migrate.upgrade(url)
    s = LiveServer(url, ADMIN_TOKEN, env={"ORTHOPLEX_STORAGE_PATH": str(tmp / "storage")},
                   log_path=tmp / "server.log")
    s.start()
    yield s
    s.stop()


def _page_headers_ok(r: httpx.Response) -> None:
    csp = r.headers.get("content-security-policy", "")
    assert "frame-ancestors 'none'" in csp and "default-src 'self'" in csp, (r.url, csp)
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]
    assert r.headers.get("x-frame-options") == "DENY", r.url
    assert r.headers.get("x-content-type-options") == "nosniff", r.url


def test_every_ui_response_has_the_page_headers(server: LiveServer) -> None:
    for path in ("/ui/", "/ui/jobs/7", "/ui/static/index.html", "/ui/static/app.js", "/ui/static/style.css",
                 "/ui/static/icon.svg", "/ui/static/no-such-file.js", "/docs", "/docs/init.js",
                 "/docs/static/swagger-ui-bundle.js"):
        r = httpx.get(server.url + path, timeout=20)
        assert r.status_code in (200, 404), (path, r.status_code)
        _page_headers_ok(r)


def test_authenticated_json_is_never_cached(server: LiveServer) -> None:
    r = httpx.post(f"{server.url}/v1/tenants", json={"name": "cache-a"}, headers=ADMIN, timeout=20)
    assert r.status_code == 201 and r.headers["cache-control"] == "no-store"
    tid = r.json()["id"]
    r = httpx.post(f"{server.url}/v1/tenants/{tid}/tokens", json={"name": "t"}, headers=ADMIN, timeout=20)
    assert r.status_code == 201 and r.json()["token"] and r.headers["cache-control"] == "no-store"
    a = {"Authorization": f"Bearer {r.json()['token']}"}
    for path in ("/v1/jobs", "/v1/dashboard/jobs", "/v1/data", "/v1/cluster", "/v1/jobs/999"):
        r = httpx.get(server.url + path, headers=a, timeout=20)
        assert r.headers.get("cache-control") == "no-store", (path, r.status_code, r.headers)
    assert httpx.get(f"{server.url}/v1/jobs", timeout=20).headers["cache-control"] == "no-store"  # 401 too


def test_docs_need_no_cdn(server: LiveServer) -> None:
    r = httpx.get(f"{server.url}/docs", timeout=20)
    assert r.status_code == 200
    refs = re.findall(r'(?:src|href)="([^"]+)"', r.text)
    assert refs and all(u.startswith("/") and not u.startswith("//") for u in refs), refs
    assert httpx.get(f"{server.url}/redoc", timeout=20).status_code == 404  # ReDoc would need a CDN
    assert httpx.get(f"{server.url}/openapi.json", timeout=20).json()["info"]["title"] == "Orthoplex"


def test_docs_boot_in_a_browser_from_this_origin_only(server: LiveServer) -> None:
    if not CHROMIUM.exists():
        pytest.fail(f"Chromium is missing at {CHROMIUM}: `apt-get install -y chromium` (.ci/run does this)")
    from playwright.sync_api import sync_playwright

    requested: list[str] = []
    problems: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            page: Any = browser.new_page()
            page.on("request", lambda req: requested.append(req.url))
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.on("console", lambda m: problems.append(m.text) if "Content Security Policy" in m.text else None)
            page.goto(f"{server.url}/docs")
            page.locator(".swagger-ui .info .title").wait_for(timeout=30_000)
            assert "Orthoplex" in page.locator(".swagger-ui .info .title").inner_text()
            page.locator(".opblock-tag", has_text="jobs").first.wait_for()
        finally:
            browser.close()
    outside = [u for u in requested if not u.startswith(server.url) and not u.startswith("data:")]
    assert outside == [] and problems == [], (outside, problems)
