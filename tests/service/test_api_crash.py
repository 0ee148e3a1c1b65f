"""1,000 submissions with Idempotency-Keys while the API process is SIGKILLed and restarted
several times; clients retry every failed call: exactly 1,000 jobs, one per key, and every
client saw the id that is in the database."""

from __future__ import annotations

import queue
import random
import threading
import time
import uuid

import httpx
import pytest
import sqlalchemy as sa

from service.db.models import Job
from tests.service.conftest import ADMIN, ADMIN_TOKEN, job_body
from tests.service.live import LiveServer

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

N = 1000
CLIENTS = 8
KILL_AT = (80, 220, 380, 540, 700, 860)  # completed submissions at which the server is killed


@pytest.mark.timeout(600)
def test_kill_restart_exactly_once(pg_url: str, pg_sessions, tmp_path) -> None:
    server = LiveServer(pg_url, ADMIN_TOKEN, log_path=tmp_path / "server.log")
    server.start()
    try:
        r = httpx.post(f"{server.url}/v1/tenants", headers=ADMIN,
                       json={"name": f"crash-{uuid.uuid4().hex[:6]}", "submit_per_minute": 100_000,
                             "max_jobs": 100_000})
        tenant_id = r.json()["id"]
        token = httpx.post(f"{server.url}/v1/tenants/{tenant_id}/tokens", headers=ADMIN, json={}).json()["token"]
        run = uuid.uuid4().hex[:8]
        work: queue.Queue[int] = queue.Queue()
        for i in range(N):
            work.put(i)
        got: dict[int, int] = {}
        statuses: dict[int, int] = {}
        failures = [0]
        lock = threading.Lock()
        deadline = time.monotonic() + 480

        def client() -> None:
            with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"},
                              timeout=httpx.Timeout(10.0, connect=2.0)) as c:
                while True:
                    try:
                        i = work.get_nowait()
                    except queue.Empty:
                        return
                    tries = 0
                    while time.monotonic() < deadline:
                        try:
                            resp = c.post("/v1/jobs", json=job_body(f"c{i}"),
                                          headers={"Idempotency-Key": f"{run}-{i}"})
                        except httpx.TransportError:
                            resp = None
                        if resp is not None and resp.status_code in (200, 201):
                            with lock:
                                got[i] = resp.json()["id"]
                                statuses[resp.status_code] = statuses.get(resp.status_code, 0) + 1
                            break
                        with lock:
                            failures[0] += 1
                        assert resp is None or resp.status_code >= 500, resp.text  # only crashes may fail
                        tries += 1
                        time.sleep(min(0.02 * 2**tries, 0.5) * (0.5 + random.random()))  # backoff + jitter

        killer_error: list[BaseException] = []

        def killer() -> None:
            try:
                for mark in KILL_AT:
                    while len(got) < mark and time.monotonic() < deadline:
                        time.sleep(0.005)
                    server.kill()
                    time.sleep(random.random() * 0.2)
                    server.start(timeout_s=300)
            except BaseException as exc:  # surfaced in the test thread below
                killer_error.append(exc)

        started = time.monotonic()
        threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
        kt = threading.Thread(target=killer)
        for t in [*threads, kt]:
            t.start()
        for t in [*threads, kt]:
            t.join()
        elapsed = time.monotonic() - started
    finally:
        server.stop()
    assert not killer_error, f"restarting the server failed: {killer_error[0]!r}"

    assert server.starts == 1 + len(KILL_AT)
    assert len(got) == N, f"{N - len(got)} submissions never succeeded"
    assert len(set(got.values())) == N
    with pg_sessions() as s:
        rows = s.execute(sa.select(Job.idempotency_key, Job.id).where(Job.tenant_id == tenant_id)).all()
    assert len(rows) == N  # exactly 1,000 jobs
    assert dict(rows) == {f"{run}-{i}": got[i] for i in range(N)}  # and each client saw the stored one
    print(f"\n{N} submissions, {len(KILL_AT)} SIGKILLs, {failures[0]} failed calls retried, "
          f"statuses {statuses}, {elapsed:.1f} s")
