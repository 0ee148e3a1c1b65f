"""Event streams as a hostile tenant would use them: an open stream must not stall anyone (SQLite
and PostgreSQL, real server processes), a flood of streams gets 429, and a token revoked while its
stream is open ends the stream."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.service.conftest import ADMIN, ADMIN_TOKEN, job_body
from tests.service.live import LiveServer

# every HTTP call has this ceiling: a store locked by an open stream shows up as a timeout
CALL_S = 20.0
STREAM_ENV = {"ORTHOPLEX_API_SSE_POLL_S": "0.1", "ORTHOPLEX_API_SSE_RECHECK_S": "0.5",
              "ORTHOPLEX_API_SSE_MAX_PER_TENANT": "2", "ORTHOPLEX_API_FIT_CHECK": "false"}


def _tenant(url: str, name: str) -> tuple[int, str, dict[str, str]]:
    r = httpx.post(f"{url}/v1/tenants", headers=ADMIN, timeout=CALL_S,
                   json={"name": f"{name}-{uuid.uuid4().hex[:6]}", "submit_per_minute": 1000, "max_jobs": 1000})
    assert r.status_code == 201, r.text
    tid = r.json()["id"]
    r = httpx.post(f"{url}/v1/tenants/{tid}/tokens", headers=ADMIN, json={}, timeout=CALL_S)
    assert r.status_code == 201, r.text
    return tid, r.json()["id"], {"Authorization": f"Bearer {r.json()['token']}"}


def _server(url: str, tmp: Path) -> Iterator[LiveServer]:
    server = LiveServer(url, ADMIN_TOKEN, env=STREAM_ENV, log_path=tmp / "server.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def sqlite_server(sqlite_url: str, tmp_path: Path) -> Iterator[LiveServer]:
    yield from _server(sqlite_url, tmp_path)


@pytest.fixture(scope="module")
def pg_server(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    yield from _server(pg_url, tmp_path_factory.mktemp("pg-server"))


class Stream:
    """An SSE stream read on a thread: ``frames`` are (event, data) pairs as they arrive."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        self.frames: list[tuple[str, dict]] = []
        self.status: int | None = None
        self.opened = threading.Event()
        self.got = threading.Condition()
        self.client = httpx.Client(timeout=httpx.Timeout(CALL_S, read=60.0))
        self.thread = threading.Thread(target=self._run, args=(url, headers), daemon=True)
        self.thread.start()
        assert self.opened.wait(CALL_S)

    def _run(self, url: str, headers: dict[str, str]) -> None:
        try:
            with self.client.stream("GET", url, headers={**headers, "Accept": "text/event-stream"}) as r:
                self.status = r.status_code
                self.opened.set()
                event = None
                for line in r.iter_lines():
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: ") and event is not None:
                        with self.got:
                            self.frames.append((event, json.loads(line[6:])))
                            self.got.notify_all()
        except httpx.HTTPError:
            pass
        finally:
            self.opened.set()
            with self.got:
                self.frames.append(("closed", {}))
                self.got.notify_all()

    def wait_for(self, event: str, timeout: float = 60.0) -> dict:
        with self.got:
            ok = self.got.wait_for(lambda: any(e in (event, "closed") for e, _ in self.frames), timeout)
        assert ok, f"no {event!r} frame; got {self.frames}"
        hit = [d for e, d in self.frames if e == event]
        assert hit, f"stream closed before {event!r}: {self.frames}"
        return hit[0]

    def close(self) -> None:
        self.client.close()
        self.thread.join(10)


def _stream_does_not_stall(server: LiveServer) -> None:
    url = server.url
    _, _, a = _tenant(url, "streamer")
    _, _, b = _tenant(url, "other")
    jid = httpx.post(f"{url}/v1/jobs", json=job_body(), headers=a, timeout=CALL_S).json()["id"]
    stream = Stream(f"{url}/v1/jobs/{jid}/events", a)
    try:
        assert stream.status == 200
        assert stream.wait_for("submitted")["type"] == "submitted"  # the stream sends while open
        for i in range(5):  # another tenant writes and reads while the stream stays open
            r = httpx.post(f"{url}/v1/jobs", json=job_body(f"b{i}"), headers=b, timeout=CALL_S)
            assert r.status_code == 201, r.text
            r = httpx.get(f"{url}/v1/jobs", headers=b, timeout=CALL_S)
            assert r.status_code == 200 and len(r.json()["items"]) == i + 1
        # the streamed job changes: the stream sees it and ends
        assert httpx.post(f"{url}/v1/jobs/{jid}/cancel", headers=a, timeout=CALL_S).status_code == 200
        assert stream.wait_for("end")["state"] == "CANCELLED"
    finally:
        stream.close()


@pytest.mark.unit
def test_open_stream_does_not_stall_sqlite(sqlite_server: LiveServer) -> None:
    _stream_does_not_stall(sqlite_server)


@pytest.mark.postgres
def test_open_stream_does_not_stall_postgres(pg_server: LiveServer) -> None:
    _stream_does_not_stall(pg_server)


@pytest.mark.postgres
def test_stream_flood_and_revoked_token(pg_server: LiveServer) -> None:
    url = pg_server.url
    tid, token_id, a = _tenant(url, "flooder")
    _, _, b = _tenant(url, "bystander")
    jid = httpx.post(f"{url}/v1/jobs", json=job_body(), headers=a, timeout=CALL_S).json()["id"]
    jb = httpx.post(f"{url}/v1/jobs", json=job_body(), headers=b, timeout=CALL_S).json()["id"]
    s1 = Stream(f"{url}/v1/jobs/{jid}/events", a)
    s2 = Stream(f"{url}/v1/jobs/{jid}/events", a)
    try:
        assert (s1.status, s2.status) == (200, 200)
        s1.wait_for("submitted")
        s2.wait_for("submitted")
        r = httpx.get(f"{url}/v1/jobs/{jid}/events?stream=true", headers=a, timeout=CALL_S)
        assert r.status_code == 429 and "stream" in r.json()["detail"] and int(r.headers["Retry-After"]) >= 1
        # the cap is per tenant: another tenant still streams
        sb = Stream(f"{url}/v1/jobs/{jb}/events", b)
        assert sb.status == 200
        sb.close()
        # the admin revokes the token: both open streams end, and the token opens nothing new
        r = httpx.delete(f"{url}/v1/tokens/{token_id}", headers=ADMIN, timeout=CALL_S)
        assert r.status_code in (200, 204), r.text
        assert s1.wait_for("end")["reason"] == "token revoked or expired"
        assert s2.wait_for("end")["reason"] == "token revoked or expired"
        r = httpx.get(f"{url}/v1/jobs/{jid}/events?stream=true", headers=a, timeout=CALL_S)
        assert r.status_code == 401
    finally:
        s1.close()
        s2.close()
    # closed streams free their slots (the tenant gets a new token)
    tok = httpx.post(f"{url}/v1/tenants/{tid}/tokens", headers=ADMIN, json={}, timeout=CALL_S).json()["token"]
    s3 = Stream(f"{url}/v1/jobs/{jid}/events", {"Authorization": f"Bearer {tok}"})
    try:
        assert s3.status == 200
    finally:
        s3.close()
