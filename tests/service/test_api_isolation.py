"""Tenant isolation matrix (OWASP API1): three tenants; every route with tenant B's token on tenant
A's ids answers 404 and changes nothing in the database; no list shows a foreign id."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import Session, sessionmaker

from service.db import transitions as tr
from service.db.models import Base, Job
from tests.service.conftest import ADMIN, job_body, make_tenant

pytestmark = pytest.mark.postgres


def snapshot(sessions: sessionmaker[Session]) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, in primary-key order."""
    out = {}
    with sessions() as s:
        for table in Base.metadata.sorted_tables:
            rows = s.execute(sa.select(table).order_by(*table.primary_key.columns)).all()
            out[table.name] = [tuple(r) for r in rows]
    return out


@pytest.fixture(scope="module")
def world(client, pg_sessions: sessionmaker[Session]) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:6]
    tenants: dict[str, Any] = {}
    for name in ("a", "b", "c"):
        tid, headers = make_tenant(client, f"iso-{name}-{tag}", max_jobs=1000, submit_per_minute=1000)
        ids = []
        for i in range(20):
            r = client.post("/v1/jobs", json=job_body(f"{name}{i}"), headers={**headers, "Idempotency-Key": f"k{i}"})
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])
        tenants[name] = {"id": tid, "h": headers, "jobs": ids}
    # give A's jobs some history: one running with GPUs, events, metrics, a checkpoint; one finished
    a0, a1 = tenants["a"]["jobs"][:2]
    with pg_sessions() as s:
        epoch = tr.start_attempt(s, a0, expected={"PENDING"}, new="ADMITTED", expected_epoch=0, reason="t", gpus=2)
        assert epoch == 1
        assert tr.transition(s, a0, expected={"ADMITTED"}, new="RUNNING", epoch=1, reason="t")
        assert tr.record_metric(s, a0, epoch=1, step=1, loss=3.0, tokens_per_s=10.0)
        assert tr.record_event(s, a0, epoch=1, source="a1", seq=0, type="step", payload={"step": 1})
        assert tr.record_checkpoint(s, a0, epoch=1, step=1, location="/x")
        assert tr.transition(s, a1, expected={"PENDING"}, new="CANCELLED", epoch=None, reason="t")
    return tenants


def _foreign_requests(job_id: int) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        ("GET", f"/v1/jobs/{job_id}", {}),
        ("POST", f"/v1/jobs/{job_id}/cancel", {}),
        ("GET", f"/v1/jobs/{job_id}/events", {}),
        ("GET", f"/v1/jobs/{job_id}/events?since=0&limit=1000", {}),
        ("GET", f"/v1/jobs/{job_id}/events?stream=true", {}),
        ("GET", f"/v1/jobs/{job_id}/events", {"Accept": "text/event-stream"}),
        ("GET", f"/v1/jobs/{job_id}/metrics", {}),
    ]


@pytest.mark.parametrize("owner,intruder", [("a", "b"), ("a", "c"), ("b", "a"), ("c", "b")])
def test_foreign_ids_are_404_and_change_nothing(client, pg_sessions, world, owner: str, intruder: str) -> None:
    before = snapshot(pg_sessions)
    headers = world[intruder]["h"]
    for job_id in world[owner]["jobs"][:3]:
        own = client.get(f"/v1/jobs/{job_id}", headers=world[owner]["h"])
        assert own.status_code == 200  # the id exists ...
        for method, path, extra in _foreign_requests(job_id):
            r = client.request(method, path, headers={**headers, **extra})
            assert r.status_code == 404, (method, path, r.status_code, r.text)  # ... but not for them
            assert r.json() == {"detail": "job not found"}
            assert str(job_id) not in r.text.replace(f"/v1/jobs/{job_id}", "")
    assert snapshot(pg_sessions) == before


def test_missing_ids_look_like_foreign_ids(client, world) -> None:
    """A never-used id and a foreign id give byte-identical answers (no existence oracle)."""
    headers = world["b"]["h"]
    foreign, missing = world["a"]["jobs"][5], 2**31 - 2
    for (m, p, e), (_, q, _) in zip(_foreign_requests(foreign), _foreign_requests(missing), strict=True):
        r1, r2 = client.request(m, p, headers={**headers, **e}), client.request(m, q, headers={**headers, **e})
        assert (r1.status_code, r1.content) == (r2.status_code, r2.content)


def _all_ids(client, headers: dict[str, str], page: int = 7, **params: Any) -> list[int]:
    ids: list[int] = []
    cursor = None
    while True:
        q = {**params, "limit": page, **({"cursor": cursor} if cursor else {})}
        r = client.get("/v1/jobs", params=q, headers=headers)
        assert r.status_code == 200
        body = r.json()
        ids += [j["id"] for j in body["items"]]
        cursor = body["next_cursor"]
        if cursor is None:
            return ids


@pytest.mark.parametrize("who", ["a", "b", "c"])
def test_lists_show_only_own_ids(client, world, who: str) -> None:
    mine = set(world[who]["jobs"])
    ids = _all_ids(client, world[who]["h"])
    assert set(ids) == mine and len(ids) == len(mine)
    assert ids == sorted(ids, reverse=True)
    for state in ("PENDING", "RUNNING", "CANCELLED"):
        assert set(_all_ids(client, world[who]["h"], state=state)) <= mine
    cluster = client.get("/v1/cluster", headers=world[who]["h"]).json()
    assert {j["id"] for j in cluster["jobs"]} <= mine
    assert cluster["nodes"] == [] and all(j["tenant_id"] is None for j in cluster["jobs"])


def test_admin_cluster_view_sees_all(client, world) -> None:
    cluster = client.get("/v1/cluster", headers=ADMIN).json()
    a0 = world["a"]["jobs"][0]
    assert {"id": a0, "tenant_id": world["a"]["id"], "gpus_allocated": 2}.items() <= next(
        j for j in cluster["jobs"] if j["id"] == a0
    ).items()


def test_owner_sees_history(client, world) -> None:
    a0 = world["a"]["jobs"][0]
    h = world["a"]["h"]
    events = client.get(f"/v1/jobs/{a0}/events", headers=h).json()
    assert [e["type"] for e in events] == ["submitted", "attempt_started", "transition", "step"]
    assert client.get(f"/v1/jobs/{a0}/events", params={"since": events[1]["id"]}, headers=h).json() == events[2:]
    metrics = client.get(f"/v1/jobs/{a0}/metrics", headers=h).json()
    assert [(m["step"], m["loss"], m["epoch"]) for m in metrics] == [(1, 3.0, 1)]


def test_tenant_tokens_cannot_use_admin_routes(client, pg_sessions, world) -> None:
    before = snapshot(pg_sessions)
    h = world["b"]["h"]
    a = world["a"]["id"]
    calls = [
        ("GET", "/v1/tenants", None), ("POST", "/v1/tenants", {"name": "evil"}),
        ("GET", f"/v1/tenants/{a}", None), ("PATCH", f"/v1/tenants/{a}", {"gpu_quota": 999}),
        ("POST", f"/v1/tenants/{a}/tokens", {}), ("DELETE", "/v1/tokens/1", None),
    ]
    for method, path, body in calls:
        r = client.request(method, path, json=body, headers=h)
        assert r.status_code == 403, (method, path, r.text)
    assert snapshot(pg_sessions) == before


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=6))
def test_random_submissions_never_leak(client, world, owners: list[str]) -> None:
    """Property: after any sequence of submissions, every list equals the tenant's own jobs."""
    for who in owners:
        r = client.post("/v1/jobs", json=job_body("p"), headers=world[who]["h"])
        assert r.status_code == 201
        world[who]["jobs"].append(r.json()["id"])
    for who in ("a", "b", "c"):
        assert set(_all_ids(client, world[who]["h"], page=100)) == set(world[who]["jobs"])


def test_job_rows_carry_the_token_tenant(client, pg_sessions, world) -> None:
    """A body cannot choose the tenant (mass assignment): tenant_id in the body is refused."""
    r = client.post("/v1/jobs", json={**job_body(), "tenant_id": world["a"]["id"]}, headers=world["b"]["h"])
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "tenant_id"]
    with pg_sessions() as s:
        owners = dict(s.execute(sa.select(Job.id, Job.tenant_id)).all())
    for who in ("a", "b", "c"):
        assert {owners[j] for j in world[who]["jobs"]} == {world[who]["id"]}
