"""Limits and validation: 413 over 1 MiB, 429 with Retry-After over the submission rate and the
job limit, list limits, 422 naming the field (also for specs the planner cannot fit), 409 for an
illegal state change, and idempotent submission."""

from __future__ import annotations

import json
import uuid

import pytest
from fastapi.testclient import TestClient

from service.db import transitions as tr
from tests.service.conftest import ADMIN, job_body, make_tenant

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def tenant(client: TestClient) -> dict[str, str]:
    return make_tenant(client, f"lim-{uuid.uuid4().hex[:6]}", submit_per_minute=1000, max_jobs=1000)[1]


def _loc(r) -> list[list[object]]:
    assert r.status_code == 422, r.text
    return [e["loc"] for e in r.json()["detail"]]


def test_body_over_one_mib_is_413(client: TestClient, tenant: dict[str, str]) -> None:
    big = {**job_body(), "name": "x" * (2 << 20)}
    r = client.post("/v1/jobs", json=big, headers=tenant)
    assert r.status_code == 413
    r = client.post("/v1/tenants", json={"name": "y" * (1 << 20)}, headers=ADMIN)
    assert r.status_code == 413

    def chunks():  # no Content-Length: the cap still holds
        for _ in range(40):
            yield b"x" * 65536

    r = client.post("/v1/jobs", content=chunks(), headers={**tenant, "Content-Type": "application/json"})
    assert r.status_code == 413
    ok = json.dumps(job_body(name="a" * 100)).encode()
    assert client.post("/v1/jobs", content=ok, headers={**tenant, "Content-Type": "application/json"}).status_code == 201


def test_submission_rate_is_429_with_retry_after(client: TestClient) -> None:
    _, h = make_tenant(client, f"rate-{uuid.uuid4().hex[:6]}", submit_per_minute=10)
    codes = [client.post("/v1/jobs", json=job_body(f"r{i}"), headers=h) for i in range(50)]
    assert sum(r.status_code == 201 for r in codes) == 10
    limited = [r for r in codes if r.status_code == 429]
    assert len(limited) == 40
    assert all(1 <= int(r.headers["retry-after"]) <= 60 for r in limited)


def test_max_jobs_is_429(client: TestClient, pg_sessions) -> None:
    _, h = make_tenant(client, f"max-{uuid.uuid4().hex[:6]}", max_jobs=3)
    ids = [client.post("/v1/jobs", json=job_body(), headers=h).json()["id"] for _ in range(3)]
    r = client.post("/v1/jobs", json=job_body(), headers=h)
    assert r.status_code == 429 and "max_jobs" in r.json()["detail"] and r.headers["retry-after"]
    assert client.post(f"/v1/jobs/{ids[0]}/cancel", headers=h).status_code == 200  # a slot frees up
    assert client.post("/v1/jobs", json=job_body(), headers=h).status_code == 201


@pytest.mark.parametrize("path", ["/v1/jobs?limit=101", "/v1/jobs?limit=0", "/v1/jobs?limit=1000",
                                  "/v1/jobs?limit=x", "/v1/jobs?cursor=-1", "/v1/jobs?state=DONE",
                                  "/v1/jobs/0", "/v1/jobs/99999999999", "/v1/jobs/1/events?limit=1001",
                                  "/v1/jobs/1/events?since=-1", "/v1/jobs/1/metrics?limit=5000"])
def test_query_limits_are_422(client: TestClient, tenant: dict[str, str], path: str) -> None:
    assert client.get(path, headers=tenant).status_code == 422


def test_admin_list_limit(client: TestClient) -> None:
    assert client.get("/v1/tenants?limit=101", headers=ADMIN).status_code == 422
    assert client.get("/v1/tenants?limit=100", headers=ADMIN).status_code == 200


@pytest.mark.parametrize("patch,loc", [
    ({"min_gpus": 4, "max_gpus": 2}, ["body", "max_gpus"]),
    ({"steps": 0}, ["body", "steps"]),
    ({"steps": "10"}, ["body", "steps"]),
    ({"steps": 1.5}, ["body", "steps"]),
    ({"max_gpus": 5000}, ["body", "max_gpus"]),
    ({"name": ""}, ["body", "name"]),
    ({"name": "bad name\x00"}, ["body", "name"]),
    ({"model": "gpt-9"}, ["body", "model", "preset"]),
    ({"model": {"layers": 2}}, ["body", "model", "shape", "hidden"]),
    ({"priority": 1000}, ["body", "priority"]),
    ({"lr": float("nan")}, ["body", "lr"]),
    ({"runtime": {"linger_s": 1}}, ["body", "runtime"]),
    ({"faults": []}, ["body", "faults"]),
    ({"model": {"layers": 2, "hidden": 64, "heads": 6, "kv_heads": 2, "ffn": 8, "vocab": 8, "seq_len": 8}},
     ["body", "model", "heads"]),
    ({"model": {"layers": 2, "hidden": 64, "heads": 8, "kv_heads": 3, "ffn": 8, "vocab": 8, "seq_len": 8}},
     ["body", "model", "kv_heads"]),
    ({"data": {"kind": "text", "paths": ["http://169.254.169.254/latest"]}}, ["body", "data", "paths", 0]),
    ({"data": {"kind": "text"}}, ["body", "data", "paths"]),
    ({"checkpoint": {"min_every_steps": 10, "max_every_steps": 5}}, ["body", "checkpoint", "max_every_steps"]),
    ({"layout_hint": {"tp": 4, "pp": 2}}, ["body", "layout_hint"]),
    ({"layout_hint": {"zero": 2}}, ["body", "layout_hint", "zero"]),
    ({"layout_hint": {"dp_replicate": 0}}, ["body", "layout_hint", "dp_replicate"]),
    ({"layout_hint": {"recompute": "sometimes"}}, ["body", "layout_hint", "recompute"]),
    ({"layout_hint": {"recompute": "layer:1"}}, ["body", "layout_hint", "recompute"]),
    ({"model": "llama3-405b", "min_gpus": 1, "max_gpus": 4}, ["body", "max_gpus"]),
])
def test_invalid_specs_are_422_naming_the_field(client: TestClient, tenant: dict[str, str], patch: dict[str, object],
                                                loc: list[object]) -> None:
    body = {**job_body(), **patch}
    r = client.post("/v1/jobs", content=json.dumps(body), headers={**tenant, "Content-Type": "application/json"})
    assert loc in _loc(r)
    if patch.get("model") == "llama3-405b":
        assert r.json()["detail"][0]["type"] == "plan_infeasible"
        assert "GiB per GPU" in r.json()["detail"][0]["msg"]
    r = client.post("/v1/plans", content=json.dumps(body), headers={**tenant, "Content-Type": "application/json"})
    assert r.status_code == 422


def test_unknown_recompute_lists_the_known_modes(client: TestClient, tenant: dict[str, str]) -> None:
    body = {**job_body(), "layout_hint": {"recompute": "sometimes"}}
    r = client.post("/v1/jobs", json=body, headers=tenant)
    assert r.status_code == 422
    msg = next(e["msg"] for e in r.json()["detail"] if e["loc"] == ["body", "layout_hint", "recompute"])
    for mode in ("none", "selective", "op", "layer:N", "full"):
        assert mode in msg


@pytest.mark.parametrize("mode,planned", [("full", "full"), ("selective", "selective"), ("op", "op"),
                                          ("selective_op", "op"), ("layer", "layer:2"), ("layer:4", "layer:4")])
def test_recompute_names_reach_the_planner(client: TestClient, tenant: dict[str, str], mode: str,
                                           planned: str) -> None:
    """TorchTitan's names pass the schema (one rule: planner.layout.recompute_error) and the planner
    plans them for the engine, which runs them all (planner.engine_rules.ENGINE_RECOMPUTE)."""
    body = {**job_body(max_gpus=4), "layout_hint": {"recompute": mode}}
    r = client.post("/v1/plans", json=body, headers=tenant)
    assert r.status_code == 200, r.text
    assert r.json()["plans"][0]["layout"]["recompute"] == planned


@pytest.mark.parametrize("raw", [b"", b"{", b"[]", b"null", b'"x"', b"\xff\xfe", b'{"name": NaN}'])
def test_malformed_bodies_are_422(client: TestClient, tenant: dict[str, str], raw: bytes) -> None:
    r = client.post("/v1/jobs", content=raw, headers={**tenant, "Content-Type": "application/json"})
    assert r.status_code == 422


def test_plans_dry_run(client: TestClient, tenant: dict[str, str]) -> None:
    r = client.post("/v1/plans?top_k=2", json=job_body(max_gpus=4), headers=tenant)
    assert r.status_code == 200, r.text
    body = r.json()
    assert 1 <= len(body["plans"]) <= 2 and body["searched"] > 0
    lay = body["plans"][0]["layout"]
    assert lay["tp"] * lay["pp"] * lay["cp"] * lay["dp"] <= 4


def test_idempotent_submission(client: TestClient, tenant: dict[str, str], pg_sessions) -> None:
    key = {"Idempotency-Key": f"idem-{uuid.uuid4().hex}"}
    r1 = client.post("/v1/jobs", json=job_body("idem"), headers={**tenant, **key})
    r2 = client.post("/v1/jobs", json=job_body("idem"), headers={**tenant, **key})
    assert (r1.status_code, r2.status_code) == (201, 200)
    assert r1.json()["id"] == r2.json()["id"] and r2.headers["location"] == f"/v1/jobs/{r1.json()['id']}"
    r3 = client.post("/v1/jobs", json=job_body("other"), headers={**tenant, **key})
    assert r3.status_code == 409
    _, other = make_tenant(client, f"idem2-{uuid.uuid4().hex[:6]}")
    r4 = client.post("/v1/jobs", json=job_body("idem"), headers={**other, **key})
    assert r4.status_code == 201 and r4.json()["id"] != r1.json()["id"]
    assert client.post("/v1/jobs", json=job_body(), headers={**tenant, "Idempotency-Key": ""}).status_code == 422


def test_cancel_of_finished_job_is_409(client: TestClient, tenant: dict[str, str], pg_sessions) -> None:
    jid = client.post("/v1/jobs", json=job_body(), headers=tenant).json()["id"]
    with pg_sessions() as s:
        assert tr.start_attempt(s, jid, expected={"PENDING"}, new="ADMITTED", expected_epoch=0, reason="t") == 1
        assert tr.transition(s, jid, expected={"ADMITTED"}, new="RUNNING", epoch=1, reason="t")
    r = client.post(f"/v1/jobs/{jid}/cancel", headers=tenant)
    assert r.status_code == 200 and r.json()["state"] == "RUNNING" and r.json()["cancel_requested"]
    with pg_sessions() as s:
        assert tr.transition(s, jid, expected={"RUNNING"}, new="CANCELLED", epoch=1, reason="stopped")
    assert client.post(f"/v1/jobs/{jid}/cancel", headers=tenant).status_code == 409


def test_sse_follows_until_terminal(client: TestClient, tenant: dict[str, str], pg_sessions) -> None:
    import threading
    import time

    jid = client.post("/v1/jobs", json=job_body(), headers=tenant).json()["id"]

    def finish() -> None:
        time.sleep(1.0)
        with pg_sessions() as s:
            tr.start_attempt(s, jid, expected={"PENDING"}, new="ADMITTED", expected_epoch=0, reason="go")
            tr.transition(s, jid, expected={"ADMITTED"}, new="RUNNING", epoch=1, reason="placed")
            tr.record_event(s, jid, epoch=1, source="a1", seq=0, type="step", payload={"loss": 1.0})
            tr.transition(s, jid, expected={"RUNNING"}, new="SUCCEEDED", epoch=1, reason="done")

    t = threading.Thread(target=finish)
    t.start()
    with client.stream("GET", f"/v1/jobs/{jid}/events?stream=true", headers=tenant) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        text = resp.read().decode()
    t.join()
    kinds = [line.split(": ", 1)[1] for line in text.splitlines() if line.startswith("event: ")]
    assert kinds == ["submitted", "attempt_started", "transition", "step", "transition", "end"]
    assert '"state":"SUCCEEDED"' in text


def test_health_ready_metrics(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ready", "checks": {"database": "ok"}, "warnings": []}
    text = client.get("/metrics", headers=ADMIN).text  # per-tenant series need the admin (or scrape) token
    for name in ("orthoplex_jobs{state=\"PENDING\"}", "orthoplex_queue_wait_seconds_bucket",
                 "orthoplex_gpus_allocated", "orthoplex_recoveries_total", "orthoplex_api_request_seconds_bucket"):
        assert name in text


def test_ready_is_503_when_ray_unreachable(pg_url: str) -> None:
    from service.api.app import create_app
    from service.settings import Settings

    app = create_app(Settings(database_url=pg_url, ray_address="127.0.0.1:9"))
    with TestClient(app) as c:
        r = c.get("/readyz")
    assert r.status_code == 503 and r.json()["checks"]["ray"].startswith("unreachable")
    bad_db = create_app(Settings(database_url="postgresql+psycopg://postgres@127.0.0.1:9/none"))
    with TestClient(bad_db) as c:
        assert c.get("/readyz").status_code == 503
        assert c.get("/healthz").status_code == 200


def test_stream_query_parameter_is_documented_and_checked(client: TestClient, tenant: dict[str, str]) -> None:
    params = {p["name"]: p for p in client.get("/openapi.json").json()["paths"]["/v1/jobs/{job_id}/events"]["get"]
              ["parameters"]}
    assert params["stream"]["schema"]["type"] == "boolean"
    jid = client.post("/v1/jobs", json=job_body(), headers=tenant).json()["id"]
    r = client.get(f"/v1/jobs/{jid}/events?stream=maybe", headers=tenant)
    assert r.status_code == 422 and "stream" in r.text
    assert client.get(f"/v1/jobs/{jid}/events?stream=false", headers=tenant).json()[0]["type"] == "submitted"


def test_replica_groups_reach_the_planner(client: TestClient, tenant: dict[str, str]) -> None:
    """``layout_hint.dp_replicate`` (HSDP) is planned as given; one that does not divide dp is a 422
    naming the field (the planner's rule)."""
    body = {**job_body(max_gpus=4), "layout_hint": {"dp": 4, "dp_replicate": 2, "zero": 3}}
    r = client.post("/v1/plans", json=body, headers=tenant)
    assert r.status_code == 200, r.text
    layout = r.json()["plans"][0]["layout"]
    assert (layout["dp"], layout["dp_replicate"], layout["zero"]) == (4, 2, 3)
    bad = {**job_body(max_gpus=4), "layout_hint": {"dp": 4, "dp_replicate": 3, "zero": 3}}
    r = client.post("/v1/plans", json=bad, headers=tenant)
    assert r.status_code == 422, r.text
    assert "dp_replicate" in json.dumps(r.json()["detail"])
