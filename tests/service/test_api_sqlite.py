"""The API on the zero-setup SQLite store (what ``./dev demo`` uses): the same paths work."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from service.db import transitions as tr
from service.db.session import make_engine, make_sessionmaker
from tests.service.conftest import ADMIN, ADMIN_TOKEN, job_body, make_tenant

pytestmark = pytest.mark.unit


def test_api_on_sqlite(sqlite_url: str) -> None:
    from service.api.app import create_app
    from service.api.config import ApiSettings
    from service.settings import Settings

    app = create_app(Settings(database_url=sqlite_url, admin_token=ADMIN_TOKEN), ApiSettings(metrics_cache_s=0))
    with TestClient(app) as c:
        _, a = make_tenant(c, "lite-a", submit_per_minute=3)
        _, b = make_tenant(c, "lite-b")
        r1 = c.post("/v1/jobs", json=job_body(), headers={**a, "Idempotency-Key": "k"})
        r2 = c.post("/v1/jobs", json=job_body(), headers={**a, "Idempotency-Key": "k"})
        assert (r1.status_code, r2.status_code, r1.json()["id"]) == (201, 200, r2.json()["id"])
        jid = r1.json()["id"]
        assert c.get(f"/v1/jobs/{jid}", headers=b).status_code == 404
        assert [j["id"] for j in c.get("/v1/jobs", headers=a).json()["items"]] == [jid]
        codes = [c.post("/v1/jobs", json=job_body(), headers=a).status_code for _ in range(4)]
        assert codes == [201, 201, 429, 429]
        engine = make_engine(sqlite_url)
        with make_sessionmaker(engine)() as s:
            assert tr.start_attempt(s, jid, expected={"PENDING"}, new="ADMITTED", expected_epoch=0, reason="t") == 1
            assert tr.transition(s, jid, expected={"ADMITTED"}, new="RUNNING", epoch=1, reason="t")
            assert tr.transition(s, jid, expected={"RUNNING"}, new="RECOVERING", epoch=1, reason="node lost")
            assert tr.record_metric(s, jid, epoch=1, step=3, loss=2.0)
        engine.dispose()
        r = c.post(f"/v1/jobs/{jid}/cancel", headers=a)
        assert r.status_code == 200 and r.json()["cancel_requested"]
        events = c.get(f"/v1/jobs/{jid}/events", headers=a).json()
        assert [e["type"] for e in events] == ["submitted", "attempt_started", "transition", "transition",
                                               "cancel_requested"]
        assert c.get(f"/v1/jobs/{jid}/metrics", headers=a).json()[0]["loss"] == 2.0
        text = c.get("/metrics").text
        assert 'orthoplex_jobs{state="RECOVERING"} 1.0' in text and "orthoplex_recoveries_total 1.0" in text
        assert 'orthoplex_gpus_allocated{tenant="lite-a"}' not in text  # no GPUs were allocated
        assert c.get("/readyz").json()["status"] == "ready"
        assert c.get("/v1/tenants", headers=ADMIN).json()["items"][0]["name"] == "lite-a"
