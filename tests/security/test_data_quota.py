"""A tenant's data area as a hostile tenant would fill it (issue 44): the quota counts entries
(files and directories) as well as bytes, paths nest at most ``data_max_depth`` directories,
``DELETE`` leaves no empty directories behind and removes empty ones, listings come in bounded
pages, and concurrent uploads cannot pass the byte quota together (each reserves its bytes before
writing them; at most ``upload_max_concurrent`` of a tenant's uploads run at once)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.service.conftest import ADMIN, ADMIN_TOKEN, make_tenant
from tests.service.live import LiveServer
from workers.data_area import tenant_area

pytestmark = pytest.mark.unit
MIB = 1 << 20


def _env(sqlite_url: str, tmp_path: Path, **settings: object) -> Iterator[tuple[TestClient, dict, Path]]:
    from service.api.app import create_app
    from service.api.config import ApiSettings
    from service.settings import Settings

    storage = tmp_path / "storage"
    s = Settings(database_url=sqlite_url, admin_token=ADMIN_TOKEN, storage_path=storage, **settings)
    with TestClient(create_app(s, ApiSettings(metrics_cache_s=0, fit_check=False))) as c:
        ta, a = make_tenant(c, "quota-a", submit_per_minute=1000)
        yield c, a, tenant_area(storage, ta)


@pytest.fixture
def env(sqlite_url: str, tmp_path: Path) -> Iterator[tuple[TestClient, dict, Path]]:
    yield from _env(sqlite_url, tmp_path, tenant_quota_entries=20, data_max_depth=4)


def _entries(area: Path) -> list[str]:
    return sorted(p.relative_to(area).as_posix() for p in area.rglob("*") if ".uploads" not in p.parts)


def test_deep_paths_and_entry_floods_are_refused(env) -> None:
    c, a, area = env
    deep = "/".join(["d"] * 500) + "/f"  # the 500-deep empty files
    r = c.put(f"/v1/data/{deep}", content=b"", headers=a)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["path", "path"], r.text
    assert "deep" in r.json()["detail"][0]["msg"]
    assert c.put("/v1/data/a/b/c/d/e/f", content=b"", headers=a).status_code == 422  # 5 directories
    assert c.put("/v1/data/a/b/c/d/f", content=b"", headers=a).status_code == 201  # 4: allowed
    # empty files count: 5 entries so far; 15 more fit in the quota of 20, then 413
    codes = [c.put(f"/v1/data/a/f{i}", content=b"", headers=a).status_code for i in range(17)]
    assert codes == [201] * 15 + [413, 413], codes
    assert len(_entries(area)) == 20
    listing = c.get("/v1/data", headers=a).json()
    assert listing["used_entries"] == 20 and listing["quota_entries"] == 20 and listing["used_bytes"] == 0
    r = c.put("/v1/data/new-dir/x", content=b"", headers=a)
    assert r.status_code == 413 and "files and directories" in r.json()["detail"], r.text
    # replacing an existing file creates no entry
    assert c.put("/v1/data/a/f0", content=b"again", headers=a).status_code == 201


def test_delete_leaves_no_empty_directories(env) -> None:
    c, a, area = env
    for _ in range(3):  # the loop: upload deep, delete, again: nothing may pile up
        assert c.put("/v1/data/x/y/z/f.txt", content=b"", headers=a).status_code == 201
        assert c.delete("/v1/data/x/y/z/f.txt", headers=a).status_code == 204
        assert _entries(area) == []
    assert c.get("/v1/data", headers=a).json()["used_entries"] == 0
    assert c.put("/v1/data/p/q/one", content=b"1", headers=a).status_code == 201
    assert c.put("/v1/data/p/two", content=b"22", headers=a).status_code == 201
    assert c.delete("/v1/data/p/q/one", headers=a).status_code == 204
    assert _entries(area) == ["p", "p/two"]  # q went with its last file, p still holds two
    r = c.delete("/v1/data/p", headers=a)
    assert r.status_code == 409 and "not empty" in r.json()["detail"], r.text
    (area / "p" / "empty" / "deeper").mkdir(parents=True)  # left behind by an older version
    assert c.delete("/v1/data/p/empty/deeper", headers=a).status_code == 204
    assert c.delete("/v1/data/p/two", headers=a).status_code == 204
    assert _entries(area) == []
    assert c.delete("/v1/data/p", headers=a).status_code == 404


def test_listings_are_paginated(env) -> None:
    c, a, _ = env
    names = ["a.txt", "a/b.txt", "a/c/d.txt", "a-b.txt", "b", "c/e.txt", "z.txt"]
    for n in names:
        assert c.put(f"/v1/data/{n}", content=n.encode(), headers=a).status_code == 201
    pages, cursor = [], None
    while True:
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        r = c.get("/v1/data", params=params, headers=a)
        assert r.status_code == 200, r.text
        page = r.json()
        assert len(page["items"]) <= 3
        pages.append([f["path"] for f in page["items"]])
        cursor = page["next_cursor"]
        assert page["truncated"] is (cursor is not None)
        if cursor is None:
            break
    flat = [p for page in pages for p in page]
    assert flat == sorted(names) and len(pages) == 3, pages
    assert c.get("/v1/data", params={"limit": 1001}, headers=a).status_code == 422


@pytest.fixture
def live(sqlite_url: str, tmp_path: Path) -> Iterator[tuple[str, dict, Path]]:
    """A real ``orthoplex serve`` (uploads stream over a socket) with a 1.5 MiB quota, 2 uploads at once."""
    storage = tmp_path / "storage"
    server = LiveServer(sqlite_url, ADMIN_TOKEN, log_path=tmp_path / "server.log",
                        env={"ORTHOPLEX_STORAGE_PATH": str(storage), "ORTHOPLEX_TENANT_QUOTA_BYTES": str(3 * MIB // 2),
                             "ORTHOPLEX_UPLOAD_MAX_CONCURRENT": "2"})
    server.start()
    try:
        tid = httpx.post(f"{server.url}/v1/tenants", headers=ADMIN, json={"name": "slow"}, timeout=20).json()["id"]
        token = httpx.post(f"{server.url}/v1/tenants/{tid}/tokens", headers=ADMIN, json={}, timeout=20).json()["token"]
        yield server.url, {"Authorization": f"Bearer {token}"}, tenant_area(storage, tid)
    finally:
        server.stop()


def _until(cond: Callable[[], bool], what: str) -> None:
    """Wait (on an event, in short slices) until ``cond`` holds; a ceiling only, no timing asserted."""
    ev = threading.Event()
    for _ in range(600):
        if cond():
            return
        ev.wait(0.05)
    raise AssertionError(f"never happened: {what}")


def test_concurrent_uploads_cannot_pass_the_quota(live) -> None:
    """The issue's slow 1 MiB uploads against a small quota: two stream at once and the others are
    429 while they do; of the two, only what fits the quota lands (bytes reserved before written)."""
    url, a, area = live
    go = threading.Event()
    results: dict[int, int] = {}

    def slow() -> Iterator[bytes]:
        yield b"x" * (MIB // 2)
        assert go.wait(60)
        yield b"x" * (MIB // 2)

    def put(i: int, body: object) -> None:
        with httpx.Client(timeout=60) as c:
            results[i] = c.put(f"{url}/v1/data/slow-{i}.bin", content=body, headers=a).status_code

    tmp = area / ".uploads"
    threads = []
    for i in range(2):  # two slow uploads, each streaming (its temporary file exists) before the next
        threads.append(threading.Thread(target=put, args=(i, slow()), daemon=True))
        threads[-1].start()
        _until(lambda n=i + 1: tmp.is_dir() and len(os.listdir(tmp)) == n, f"upload {i} streaming")
    quick = [threading.Thread(target=put, args=(i, b"y" * (64 << 10)), daemon=True) for i in range(2, 8)]
    for t in quick:
        t.start()
    for t in quick:
        t.join(60)
    assert [results[i] for i in range(2, 8)] == [429] * 6, results
    go.set()
    for t in threads:
        t.join(60)
    assert sorted(results.values()) == [201, 413] + [429] * 6, results
    files = [p for p in area.iterdir() if p.is_file()]
    assert [f.stat().st_size for f in files] == [MIB], files
    assert os.listdir(tmp) == []
    assert httpx.get(f"{url}/v1/data", headers=a, timeout=20).json()["used_bytes"] == MIB


def test_the_sdk_and_the_cli_follow_the_listing_pages(live, tmp_path: Path) -> None:
    """``Client.data.list(cursor, limit)`` returns one page and its cursor; ``orthoplex data list
    --all`` follows every page, ``--limit`` alone prints the first and how to go on."""
    from typer.testing import CliRunner

    from orthoplex import Client
    from service.cli.main import app

    url, headers, _ = live
    token = headers["Authorization"].split()[1]
    names = [f"p/{i:02d}.txt" for i in range(5)]
    with Client(url=url, token=token) as c:
        for n in names:
            src = tmp_path / "x.txt"
            src.write_text(n)
            c.data.upload(src, n)
        first = c.data.list(limit=2)
        assert [f.path for f in first.items] == names[:2] and first.next_cursor == names[1]
        rest = c.data.list(first.next_cursor, limit=10)
        assert [f.path for f in rest.items] == names[2:] and rest.next_cursor is None
    conn = ["--url", url, "--token", token]
    one = CliRunner().invoke(app, ["data", "list", "--limit", "2", *conn])
    assert one.exit_code == 0, one.output
    assert "p/01.txt" in one.output and "p/02.txt" not in one.output and "--cursor p/01.txt" in one.output
    every = CliRunner().invoke(app, ["data", "list", "--limit", "2", "--all", *conn])
    assert every.exit_code == 0, every.output
    assert all(n in every.output for n in names) and "--cursor" not in every.output
    bad = CliRunner().invoke(app, ["data", "list", "--limit", "0", *conn])
    assert bad.exit_code == 2 and "limit" in bad.output.lower()
