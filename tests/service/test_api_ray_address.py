"""The Ray address and the insecure-Ray opt-out in the API (issue 43): a tenant sees neither the
cluster's address nor Ray's error text (which names addresses); the admin sees the address (never a
token: the service holds none in its settings' output) and whether ORTHOPLEX_ALLOW_INSECURE_RAY is
set; ``/readyz`` lists the opt-out as a warning."""

from __future__ import annotations

import uuid

from fastapi.testclient import TestClient

from tests.service.conftest import ADMIN, ADMIN_TOKEN, make_tenant

ADDRESS = "127.0.0.1:9"  # nothing listens: the cluster view is unavailable, with Ray's error text


def _app(pg_url: str, **kw: object) -> TestClient:
    from service.api.app import create_app
    from service.settings import Settings

    return TestClient(create_app(Settings(database_url=pg_url, admin_token=ADMIN_TOKEN, ray_address=ADDRESS, **kw)))


def test_tenants_never_see_the_ray_address_and_the_admin_does(pg_url: str) -> None:
    with _app(pg_url, allow_insecure_ray=True) as c:
        _, tenant = make_tenant(c, f"ray-{uuid.uuid4().hex[:8]}")
        mine = c.get("/v1/cluster", headers=tenant)
        admin = c.get("/v1/cluster", headers=ADMIN).json()
        ready = c.get("/readyz").json()
    assert mine.status_code == 200
    assert ADDRESS not in mine.text and "127.0.0.1" not in mine.text, mine.text
    assert mine.json()["ray_address"] is None and mine.json()["ray_insecure"] is None
    assert admin["ray_address"] == ADDRESS and admin["ray_insecure"] is True
    assert any("ORTHOPLEX_ALLOW_INSECURE_RAY" in w for w in ready["warnings"]), ready


def test_no_warning_without_the_opt_out(pg_url: str) -> None:
    with _app(pg_url) as c:
        assert c.get("/readyz").json()["warnings"] == []
        assert c.get("/v1/cluster", headers=ADMIN).json()["ray_insecure"] is False
