"""Authentication: missing, malformed, unknown, revoked, expired tokens and tokens of a deleted
tenant are 401; admin and tenant tokens are not interchangeable (403)."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from service.api.security import hash_token, is_admin_token, new_token
from service.db.models import ApiToken, Tenant
from tests.service.conftest import ADMIN, job_body, make_tenant

pytestmark = pytest.mark.postgres

TENANT_ROUTES = [("GET", "/v1/jobs"), ("POST", "/v1/jobs"), ("GET", "/v1/jobs/1"), ("POST", "/v1/jobs/1/cancel"),
                 ("GET", "/v1/jobs/1/events"), ("GET", "/v1/jobs/1/metrics"), ("POST", "/v1/plans"),
                 ("GET", "/v1/cluster")]
ADMIN_ROUTES = [("GET", "/v1/tenants"), ("POST", "/v1/tenants"), ("GET", "/v1/tenants/1"),
                ("PATCH", "/v1/tenants/1"), ("POST", "/v1/tenants/1/tokens"), ("DELETE", "/v1/tokens/1")]


def _call(client: TestClient, method: str, path: str, headers: dict[str, str]) -> int:
    body = job_body() if path in ("/v1/jobs", "/v1/plans") and method == "POST" else {"name": "x"}
    return client.request(method, path, json=body if method in ("POST", "PATCH") else None,
                          headers=headers).status_code


@pytest.mark.parametrize("headers", [
    {},
    {"Authorization": ""},
    {"Authorization": "Bearer"},
    {"Authorization": "Basic YWRtaW46YWRtaW4="},
    {"Authorization": "Bearer opx_nope_nope"},
    {"Authorization": "Bearer " + "x" * 300},
    {"Authorization": f"Bearer {ADMIN['Authorization'][7:]}x"},
], ids=["none", "empty", "no-token", "basic", "unknown", "huge", "admin-plus-one"])
@pytest.mark.parametrize("method,path", TENANT_ROUTES + ADMIN_ROUTES)
def test_bad_credentials_are_401(client: TestClient, headers: dict[str, str], method: str, path: str) -> None:
    assert _call(client, method, path, headers) == 401


def test_401_says_bearer(client: TestClient) -> None:
    r = client.get("/v1/jobs")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"


def test_revoked_token_is_401(client: TestClient) -> None:
    tid, h = make_tenant(client, f"rev-{uuid.uuid4().hex[:6]}")
    assert client.get("/v1/jobs", headers=h).status_code == 200
    r = client.post(f"/v1/tenants/{tid}/tokens", json={"name": "second"}, headers=ADMIN)
    second = {"Authorization": f"Bearer {r.json()['token']}"}
    assert client.delete(f"/v1/tokens/{r.json()['id']}", headers=ADMIN).status_code == 204
    assert client.delete(f"/v1/tokens/{r.json()['id']}", headers=ADMIN).status_code == 404
    for method, path in TENANT_ROUTES:
        assert _call(client, method, path, second) == 401
    assert client.get("/v1/jobs", headers=h).status_code == 200  # the other token still works


def test_expired_token_is_401(client: TestClient, pg_sessions) -> None:
    tid, h = make_tenant(client, f"exp-{uuid.uuid4().hex[:6]}")
    assert client.get("/v1/jobs", headers=h).status_code == 200
    with pg_sessions() as s:
        s.execute(sa.update(ApiToken).where(ApiToken.tenant_id == tid)
                  .values(expires_at=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)))
        s.commit()
    for method, path in TENANT_ROUTES:
        assert _call(client, method, path, h) == 401


def test_token_of_deleted_tenant_is_401(client: TestClient, pg_sessions) -> None:
    secret, prefix, digest = new_token()
    with pg_sessions() as s:
        t = Tenant(name=f"gone-{uuid.uuid4().hex[:6]}")
        s.add(t)
        s.flush()
        s.add(ApiToken(tenant_id=t.id, prefix=prefix, token_hash=digest))
        s.commit()
        h = {"Authorization": f"Bearer {secret}"}
        assert client.get("/v1/jobs", headers=h).status_code == 200
        s.delete(t)
        s.commit()
    assert client.get("/v1/jobs", headers=h).status_code == 401


def test_tokens_are_stored_hashed_and_shown_once(client: TestClient, pg_sessions) -> None:
    tid, _ = make_tenant(client, f"hash-{uuid.uuid4().hex[:6]}")
    r = client.post(f"/v1/tenants/{tid}/tokens", json={"name": "n", "expires_in_days": None}, headers=ADMIN)
    body = r.json()
    assert body["token"].startswith(body["prefix"]) and len(body["token"]) > 40 and body["expires_at"] is None
    with pg_sessions() as s:
        row = s.get(ApiToken, body["id"])
        assert row is not None and row.token_hash == hash_token(body["token"])
        assert body["token"] not in repr([getattr(row, c.key) for c in ApiToken.__table__.columns])
    listing = client.get("/v1/tenants", headers=ADMIN).text + client.get(f"/v1/tenants/{tid}", headers=ADMIN).text
    assert body["token"] not in listing


def test_admin_and_tenant_tokens_do_not_mix(client: TestClient) -> None:
    _, h = make_tenant(client, f"mix-{uuid.uuid4().hex[:6]}")
    for method, path in ADMIN_ROUTES:
        assert _call(client, method, path, h) == 403
    for method, path in TENANT_ROUTES:
        if path not in ("/v1/plans", "/v1/cluster"):  # any principal may plan and see the cluster
            assert _call(client, method, path, ADMIN) == 403


def test_no_admin_token_configured_means_no_admin(pg_url: str) -> None:
    from service.api.app import create_app
    from service.settings import Settings

    app = create_app(Settings(database_url=pg_url, admin_token=None))
    with TestClient(app) as c:
        for token in ("", "None", "null"):
            assert c.get("/v1/tenants", headers={"Authorization": f"Bearer {token}"}).status_code == 401


@pytest.mark.unit
def test_admin_compare() -> None:
    assert is_admin_token("s3cret", "s3cret")
    assert not is_admin_token("s3cret", None) and not is_admin_token("", "")
    assert not is_admin_token("s3cre", "s3cret") and not is_admin_token("s3cret\udcff", "s3cret")
