"""The dashboard's views (``/v1/dashboard``): tenant isolation, admin-only routes, pagination,
downsampling, and the dashboard's static files under ``/ui/``."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from service.db import transitions as tr
from service.db.models import Metric
from tests.service.conftest import ADMIN, job_body, make_tenant

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def world(client, pg_sessions: sessionmaker[Session]) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:6]
    out: dict[str, Any] = {}
    for name in ("a", "b"):
        tid, headers = make_tenant(client, f"dash-{name}-{tag}", max_jobs=1000, submit_per_minute=1000, gpu_quota=1)
        ids = []
        for i in range(7):
            r = client.post("/v1/jobs", json=job_body(f"{name}{i}"), headers=headers)
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])
        out[name] = {"id": tid, "name": f"dash-{name}-{tag}", "h": headers, "jobs": ids}
    a0 = out["a"]["jobs"][0]
    with pg_sessions() as s:
        assert tr.start_attempt(s, a0, expected={"PENDING"}, new="ADMITTED", expected_epoch=0, reason="t", gpus=2) == 1
        assert tr.transition(s, a0, expected={"ADMITTED"}, new="RUNNING", epoch=1, reason="t")
        assert tr.record_event(s, a0, epoch=1, source="runtime:a1", seq=1, type="plan",
                               payload={"short": "tp1·pp1·cp1·dp2", "num_gpus": 2})
        assert tr.record_event(s, a0, epoch=1, source="control", seq=99, type="decision",
                               payload={"kind": "admit", "gpus": 2, "reason": "within quota", "outcome": "admitted"})
        s.add_all([Metric(job_id=a0, epoch=1, step=i, loss=10.0 - i * 1e-3, tokens_per_s=100.0 + i)
                   for i in range(1, 3001)])
        s.commit()
    return out


def _new_routes(job_id: int) -> list[str]:
    return [f"/v1/dashboard/jobs/{job_id}", f"/v1/dashboard/jobs/{job_id}/curve",
            f"/v1/dashboard/jobs/{job_id}/explain"]


def test_another_tenants_job_is_404_on_every_view(client, world) -> None:
    for job_id in world["a"]["jobs"]:
        for path in _new_routes(job_id):
            r = client.get(path, headers=world["b"]["h"])
            assert r.status_code == 404, (path, r.text)
            assert r.json() == {"detail": "job not found"}
            assert client.get(path, headers=world["a"]["h"]).status_code == 200, path


def test_job_rows_show_only_own_jobs_and_paginate(client, world) -> None:
    seen: list[int] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 3}
        if cursor:
            params["cursor"] = cursor
        r = client.get("/v1/dashboard/jobs", params=params, headers=world["b"]["h"])
        assert r.status_code == 200, r.text
        body = r.json()
        assert len(body["items"]) <= 3
        seen += [j["id"] for j in body["items"]]
        assert all(j["tenant"] is None for j in body["items"])
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted(world["b"]["jobs"], reverse=True)
    assert not set(seen) & set(world["a"]["jobs"])


def test_job_row_has_progress_layout_and_last_event(client, world) -> None:
    a0 = world["a"]["jobs"][0]
    rows = client.get("/v1/dashboard/jobs", params={"state": "RUNNING", "limit": 100}, headers=world["a"]["h"]).json()
    row = next(j for j in rows["items"] if j["id"] == a0)
    assert row["step"] == 3000 and row["steps"] == 10
    assert row["layout"] == "tp1·pp1·cp1·dp2"
    assert row["tokens_per_s"] == pytest.approx(100.0 + 3000)
    assert row["last_event"]["type"] == "decision"


def test_admin_sees_every_tenants_rows_but_tenants_do_not_see_admin_views(client, world) -> None:
    r = client.get("/v1/dashboard/jobs", params={"limit": 100}, headers=ADMIN)
    assert r.status_code == 200
    names = {j["tenant"] for j in r.json()["items"]}
    assert {world["a"]["name"], world["b"]["name"]} <= names
    for path in ("/v1/dashboard/tenants", "/v1/dashboard/decisions"):
        assert client.get(path, headers=world["a"]["h"]).status_code == 403
        assert client.get(path).status_code == 401
    tenants = {t["name"]: t for t in client.get("/v1/dashboard/tenants", headers=ADMIN).json()["items"]}
    a = tenants[world["a"]["name"]]
    assert (a["gpu_quota"], a["gpus_used"], a["gpus_borrowed"]) == (1, 2, 1)
    assert a["jobs"]["RUNNING"] == 1
    decisions = client.get("/v1/dashboard/decisions", headers=ADMIN).json()["items"]
    mine = [d for d in decisions if d["job_id"] == world["a"]["jobs"][0]]
    assert mine and mine[0]["reason"] == "within quota" and mine[0]["tenant"] == world["a"]["name"]


def test_curve_returns_every_point_up_to_max_points_then_downsamples(client, world,
                                                                    pg_sessions: sessionmaker[Session]) -> None:
    a0 = world["a"]["jobs"][0]
    full = client.get(f"/v1/dashboard/jobs/{a0}/curve", params={"max_points": 5000}, headers=world["a"]["h"]).json()
    assert full["total_points"] == 3000 and full["width"] == 1 and len(full["points"]) == 3000
    small = client.get(f"/v1/dashboard/jobs/{a0}/curve", params={"max_points": 100}, headers=world["a"]["h"]).json()
    assert small["total_points"] == 3000 and 50 <= len(small["points"]) <= 100
    assert small["points"][0]["step"] == 1
    # the bucket mean lies between the bucket's min and max, and the curve keeps its trend
    for p in small["points"]:
        assert p["loss_min"] <= p["loss"] <= p["loss_max"]
    assert small["points"][0]["loss"] > small["points"][-1]["loss"]
    with pg_sessions() as s:
        lo, hi = s.execute(sa.select(sa.func.min(Metric.loss), sa.func.max(Metric.loss)).where(Metric.job_id == a0)).one()
    assert min(p["loss_min"] for p in small["points"]) == pytest.approx(lo)
    assert max(p["loss_max"] for p in small["points"]) == pytest.approx(hi)


@pytest.mark.parametrize("params", [{"max_points": 9}, {"max_points": 10_001}, {"max_points": "x"}])
def test_curve_bad_max_points_is_422_naming_it(client, world, params) -> None:
    r = client.get(f"/v1/dashboard/jobs/{world['a']['jobs'][0]}/curve", params=params, headers=world["a"]["h"])
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["query", "max_points"]


def test_existing_metrics_route_keeps_its_default(client, world) -> None:
    r = client.get(f"/v1/jobs/{world['a']['jobs'][0]}/metrics", headers=world["a"]["h"])
    assert r.status_code == 200 and len(r.json()) == 1000


def test_job_view_has_timeline_without_steps(client, world) -> None:
    a0 = world["a"]["jobs"][0]
    d = client.get(f"/v1/dashboard/jobs/{a0}", headers=world["a"]["h"]).json()
    types = [e["type"] for e in d["events"]]
    assert "step" not in types and "plan" in types and "decision" in types
    assert d["step"] == 3000 and d["ledger"] == [] and d["grid"] is None


def test_ui_is_served_with_deep_links_and_no_foreign_origins(client) -> None:
    for path in ("/ui/", "/ui/jobs/7", "/ui/cluster", "/ui/submit"):
        r = client.get(path)
        assert r.status_code == 200 and "text/html" in r.headers["content-type"]
        assert '<main id="main"' in r.text
        assert "default-src 'self'" in r.headers["content-security-policy"]
    for asset in ("app.js", "api.js", "charts.js", "dom.js", "style.css", "icon.svg"):
        r = client.get(f"/ui/static/{asset}")
        assert r.status_code == 200, asset
        text = r.text.replace("http://www.w3.org/2000/svg", "")  # the SVG namespace is a name, not a fetch
        assert "http://" not in text and "https://" not in text and "//cdn" not in text, asset
    assert client.get("/ui", follow_redirects=False).status_code == 308
    assert client.get("/ui/static/nope.js").status_code == 404


def test_val_loss_reaches_the_metrics_route_and_the_curve(client, world, pg_sessions: sessionmaker[Session]) -> None:
    """A job that evaluates every 2nd step (``eval_every``): the REST metrics carry ``val_loss`` on
    those steps only, and the dashboard's curve lists them; a job that never evaluated has none."""
    job, own, other = world["b"]["jobs"][0], world["b"]["h"], world["a"]["h"]
    with pg_sessions() as s:
        assert tr.start_attempt(s, job, expected={"PENDING"}, new="ADMITTED", expected_epoch=0, reason="t", gpus=1) == 1
        for step in range(1, 7):
            assert tr.record_metric(s, job, epoch=1, step=step, loss=5.0 - step * 0.1, tokens_per_s=50.0,
                                    val_loss=(6.0 - step * 0.1) if step % 2 == 0 else None) is tr.Recorded.WRITTEN
    rows = client.get(f"/v1/jobs/{job}/metrics", headers=own).json()
    assert [(m["step"], m["val_loss"]) for m in rows] == [
        (1, None), (2, pytest.approx(5.8)), (3, None), (4, pytest.approx(5.6)), (5, None), (6, pytest.approx(5.4))]
    curve = client.get(f"/v1/dashboard/jobs/{job}/curve", headers=own).json()
    assert [(p["step"], p["loss"]) for p in curve["val_loss"]] == [
        (2, pytest.approx(5.8)), (4, pytest.approx(5.6)), (6, pytest.approx(5.4))]
    assert client.get(f"/v1/dashboard/jobs/{job}/curve", headers=other).status_code == 404
    never = client.get(f"/v1/dashboard/jobs/{world['a']['jobs'][0]}/curve", headers=world["a"]["h"]).json()
    assert never["val_loss"] is None
