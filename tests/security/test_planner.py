"""The planner as a hostile tenant would use it: no database transaction is open while it
searches, it never fails open (busy or timed out is 503 with Retry-After, and nothing is created),
and dry runs and refused submissions count toward the tenant's rate."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api import fit_check
from tests.service.conftest import ADMIN_TOKEN, job_body, make_tenant

pytestmark = pytest.mark.unit


def _client(url: str, **api: Any) -> Iterator[TestClient]:
    from service.api.app import create_app
    from service.api.config import ApiSettings
    from service.settings import Settings

    app = create_app(Settings(database_url=url, admin_token=ADMIN_TOKEN), ApiSettings(metrics_cache_s=0, **api))
    with TestClient(app) as c:
        yield c


@pytest.fixture
def client(sqlite_url: str) -> Iterator[TestClient]:
    yield from _client(sqlite_url)


def _jobs(c: TestClient, headers: dict[str, str]) -> int:
    return len(c.get("/v1/jobs", headers=headers).json()["items"])


def test_no_transaction_open_while_planning(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = client.app.state.engine
    seen: list[int] = []
    real = fit_check._run_plan

    def watched(pspec: dict[str, Any], top_k: int) -> Any:
        seen.append(engine.pool.checkedout())
        return real(pspec, top_k)

    monkeypatch.setattr(fit_check, "_run_plan", watched)
    _, a = make_tenant(client, "planner-tx")
    assert client.post("/v1/jobs", json=job_body(name="tx", global_batch=24), headers=a).status_code == 201
    r = client.post("/v1/plans", json=job_body(name="tx2", global_batch=40), headers=a)
    assert r.status_code == 200, r.text
    assert seen and all(n == 0 for n in seen), f"connections checked out during the search: {seen}"


def test_busy_planner_refuses_and_creates_nothing(client: TestClient) -> None:
    _, a = make_tenant(client, "planner-busy", submit_per_minute=1000)
    for _ in range(fit_check._WORKERS):  # every planner slot taken by someone else's search
        assert fit_check._SLOTS.acquire(timeout=5)
    try:
        r = client.post("/v1/jobs", json=job_body(name="busy", global_batch=56), headers=a)
        assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1, r.text
        r = client.post("/v1/plans", json=job_body(name="busy", global_batch=56), headers=a)
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1, r.text  # a dry run: load shedding
    finally:
        for _ in range(fit_check._WORKERS):
            fit_check._SLOTS.release()
    assert _jobs(client, a) == 0


def test_timed_out_planner_is_503_not_acceptance(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()

    def slow(pspec: dict[str, Any], top_k: int) -> Any:
        release.wait(10)
        raise RuntimeError("abandoned search")  # its answer is not waited for

    monkeypatch.setattr(fit_check, "_run_plan", slow)
    for c in _client(sqlite_url, plan_timeout_s=0.05):
        _, a = make_tenant(c, "planner-slow", submit_per_minute=1000)
        # a model that fits nowhere, over a huge GPU range: it used to get 201 when the search timed out
        body = job_body(name="huge", min_gpus=1, max_gpus=4096,
                        model={"layers": 1024, "hidden": 65536, "heads": 64, "kv_heads": 64,
                               "ffn": 262144, "vocab": 32000, "seq_len": 4096})
        r = c.post("/v1/jobs", json=body, headers=a)
        release.set()
        assert r.status_code == 503 and "Retry-After" in r.headers, r.text
        assert _jobs(c, a) == 0


def test_plans_and_refusals_count_toward_the_rate(client: TestClient) -> None:
    _, a = make_tenant(client, "planner-flood", submit_per_minute=4)
    codes = [client.post("/v1/plans", json=job_body(name=f"p{i}"), headers=a).status_code for i in range(3)]
    assert codes == [200, 200, 200]
    bad = job_body(name="bad", min_gpus=4, max_gpus=2)  # refused (422) but counted
    assert client.post("/v1/jobs", json=bad, headers=a).status_code == 422
    for path in ("/v1/plans", "/v1/jobs"):
        r = client.post(path, json=job_body(name="late"), headers=a)
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1, (path, r.text)
    assert _jobs(client, a) == 0
    # another tenant is not affected by the flood
    _, b = make_tenant(client, "planner-calm")
    t0 = time.monotonic()
    assert client.post("/v1/jobs", json=job_body(name="calm"), headers=b).status_code == 201
    assert time.monotonic() - t0 >= 0


def test_concurrent_identical_submissions_share_one_search_and_wait_for_a_slot(
        client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three tenants' identical specs at once (the e2e test's start) are one search, not a 503; a
    submission that finds both slots taken waits for one (within ``plan_timeout_s``)."""
    from service.api.config import ApiSettings
    from service.api.schemas import JobSpec

    calls: list[int] = []
    real = fit_check._run_plan

    def slow(pspec: dict[str, Any], top_k: int) -> Any:
        calls.append(1)
        time.sleep(0.4)
        return real(pspec, top_k)

    monkeypatch.setattr(fit_check, "_run_plan", slow)
    spec = JobSpec.model_validate(job_body(name="same", global_batch=88))
    errors: list[BaseException] = []

    def check() -> None:
        try:
            fit_check.check_fit(spec, ApiSettings())
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=check) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(calls) == 1, (errors, calls)

    # both slots taken by other searches; they end 0.5 s later and the submission goes through
    for _ in range(fit_check._WORKERS):
        assert fit_check._SLOTS.acquire(timeout=5)
    timer = threading.Timer(0.5, lambda: [fit_check._SLOTS.release() for _ in range(fit_check._WORKERS)])
    timer.start()
    _, a = make_tenant(client, "planner-wait", submit_per_minute=1000)
    r = client.post("/v1/jobs", json=job_body(name="waits", global_batch=72), headers=a)
    timer.join()
    assert r.status_code == 201, r.text
