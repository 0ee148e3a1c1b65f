"""No request holds the database while the planner runs (issue 44): with explains, dry runs and a
submission all inside the planner at once (held there by an event), no connection is checked out,
``/healthz``, another tenant's reads and writes and the admin's writes complete, on SQLite (where a
transaction holds the write lock) and on PostgreSQL. Every planner call a tenant can trigger counts
toward its rate and is cached by the planner's input: a flood of explains is one search, then 429."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api import fit_check
from service.db.session import connections_held
from tests.service.conftest import ADMIN, ADMIN_TOKEN, job_body, make_tenant

pytestmark = pytest.mark.unit
WAIT_S = 30.0  # a ceiling only: a request blocked on a lock shows up as not finished by then


def _client(url: str) -> Iterator[TestClient]:
    from service.api.app import create_app
    from service.api.config import ApiSettings
    from service.settings import Settings

    app = create_app(Settings(database_url=url, admin_token=ADMIN_TOKEN),
                     ApiSettings(metrics_cache_s=0, plan_timeout_s=WAIT_S, dryrun_timeout_s=WAIT_S))
    with TestClient(app) as c:
        yield c


@pytest.fixture(params=["sqlite", "postgres"])
def client(request: pytest.FixtureRequest) -> Iterator[TestClient]:
    url = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")
    yield from _client(url)


class Gate:
    """Holds every planner search at its start until released; counts the searches."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.active = False
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()
        self.searches = 0
        real = fit_check._run_plan

        def gated(pspec: dict[str, Any], top_k: int) -> Any:
            self.searches += 1
            if self.active:
                self.entered.release()
                assert self.release.wait(WAIT_S)
            return real(pspec, top_k)

        monkeypatch.setattr(fit_check, "_run_plan", gated)


class Call(threading.Thread):
    def __init__(self, fn: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.fn, self.result, self.error = fn, None, None
        self.start()

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def get(self) -> Any:
        self.join(WAIT_S)
        assert not self.is_alive(), "the request did not finish: it waits on something a planning request holds"
        assert self.error is None, self.error
        return self.result


def _no_connection_checked_out(client: TestClient) -> None:
    """The pool reaches zero checked-out connections (a ceiling of ``WAIT_S``, no timing asserted)."""
    ev = threading.Event()
    for _ in range(int(WAIT_S / 0.02)):
        if client.app.state.engine.pool.checkedout() == 0:
            return
        ev.wait(0.02)
    raise AssertionError(f"{client.app.state.engine.pool.checkedout()} connection(s) held while planning")


def test_nothing_waits_on_a_planning_request(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = Gate(monkeypatch)
    n = uuid.uuid4().int % 500 * 8 + 4000  # global batches no earlier test planned (answers are cached)
    _, a = make_tenant(client, f"lock-a-{uuid.uuid4().hex[:6]}", submit_per_minute=1000)
    tb, b = make_tenant(client, f"lock-b-{uuid.uuid4().hex[:6]}", submit_per_minute=1000)
    r = client.post("/v1/jobs", json=job_body(name="a", global_batch=n), headers=a)
    assert r.status_code == 201, r.text
    job_a = r.json()["id"]
    r = client.post("/v1/jobs", json=job_body(name="b", global_batch=n + 8), headers=b)
    assert r.status_code == 201, r.text
    job_b = r.json()["id"]

    gate.active = True
    try:
        explain = Call(lambda: client.get(f"/v1/dashboard/jobs/{job_a}/explain", headers=a))
        dry = Call(lambda: client.post("/v1/plans", json=job_body(name="d", global_batch=n + 16), headers=a))
        for _ in range(2):  # both planner slots now held by A's searches
            assert gate.entered.acquire(timeout=WAIT_S), "a planning request never reached the planner"
        submit = Call(lambda: client.post("/v1/jobs", json=job_body(name="s", global_batch=n + 24), headers=a))
        # a second explain of the same job waits for the first one's search (one search per question)
        explain2 = Call(lambda: client.get(f"/v1/dashboard/jobs/{job_a}/explain", headers=a))
        # while A's explain and dry run sit in the planner: no connection stays checked out (the submit
        # and the second explain, just started, may still be in their short reads; none holds one
        # across the planner, or this never reaches zero while the planner is held) ...
        _no_connection_checked_out(client)
        # ... and everyone else's requests complete, reads and writes (on SQLite a write needs the lock)
        others = [
            Call(lambda: client.get("/healthz")),
            Call(lambda: client.get("/v1/jobs", headers=b)),
            Call(lambda: client.get(f"/v1/dashboard/jobs/{job_b}", headers=b)),
            Call(lambda: client.get("/v1/dashboard/jobs", headers=b)),
            Call(lambda: client.post(f"/v1/jobs/{job_b}/cancel", headers=b)),
            Call(lambda: client.post(f"/v1/tenants/{tb}/tokens", json={"name": "t2"}, headers=ADMIN)),
        ]
        codes = [c.get().status_code for c in others]
        assert codes == [200, 200, 200, 200, 200, 201], codes
        assert explain.is_alive() and dry.is_alive(), "the planning requests were held all along"
        _no_connection_checked_out(client)
    finally:
        gate.release.set()
    r = explain.get()
    assert r.status_code == 200 and r.json()["available"] is True, r.text
    assert explain2.get().json() == r.json()
    assert dry.get().status_code == 200
    assert submit.get().status_code == 201
    assert connections_held() == 0


def test_explain_is_counted_and_cached(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = Gate(monkeypatch)
    n = uuid.uuid4().int % 500 * 8 + 8000
    _, a = make_tenant(client, f"explain-{uuid.uuid4().hex[:6]}", submit_per_minute=4)
    r = client.post("/v1/jobs", json=job_body(name="a", global_batch=n), headers=a)
    assert r.status_code == 201, r.text
    searches = gate.searches
    codes = [client.get(f"/v1/dashboard/jobs/{r.json()['id']}/explain", headers=a).status_code for _ in range(5)]
    # the job and three explains fill the rate of 4 per minute; the fifth is refused
    assert codes == [200, 200, 200, 429, 429], codes
    assert gate.searches - searches == 1, "explains of one spec are one search (cached)"
    # a dry run of an identical spec is refused over the rate too, and searches nothing
    r = client.post("/v1/plans", json=job_body(name="again", global_batch=n), headers=a)
    assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
    assert gate.searches - searches == 1


def test_dry_runs_are_cached_by_the_plans_inputs(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = Gate(monkeypatch)
    n = uuid.uuid4().int % 500 * 8 + 12000
    _, a = make_tenant(client, f"dry-{uuid.uuid4().hex[:6]}", submit_per_minute=1000)
    first = client.post("/v1/plans", json=job_body(name="x", global_batch=n), headers=a)
    again = client.post("/v1/plans", json=job_body(name="other-name", global_batch=n), headers=a)
    assert first.status_code == again.status_code == 200 and first.json() == again.json()
    assert gate.searches == 1
    assert client.post("/v1/plans?top_k=1", json=job_body(name="x", global_batch=n), headers=a).status_code == 200
    assert client.post("/v1/plans", json=job_body(name="x", global_batch=n + 8), headers=a).status_code == 200
    assert gate.searches == 3  # another top_k or another batch is another question
