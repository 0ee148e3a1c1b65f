"""``/metrics`` as a hostile caller would use it: per-tenant series only for the admin or the
scrape token, and label values from bounded sets (random HTTP methods do not grow the label set)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from service.db import transitions as tr
from tests.service.conftest import ADMIN, ADMIN_TOKEN, job_body, make_tenant

pytestmark = pytest.mark.unit
SCRAPE = "scrape-secret-for-tests"


@pytest.fixture
def client(sqlite_url: str) -> Iterator[TestClient]:
    from service.api.app import create_app
    from service.api.config import ApiSettings
    from service.settings import Settings

    app = create_app(Settings(database_url=sqlite_url, admin_token=ADMIN_TOKEN, metrics_token=SCRAPE),
                     ApiSettings(metrics_cache_s=0, fit_check=False))
    with TestClient(app) as c:
        yield c


def test_tenant_series_need_admin_or_scrape_token(client: TestClient) -> None:
    _, a = make_tenant(client, "secret-customer-name")
    jid = client.post("/v1/jobs", json=job_body(), headers=a).json()["id"]
    with client.app.state.sessions() as s:
        assert tr.start_attempt(s, jid, expected={"PENDING"}, new="ADMITTED", expected_epoch=0, reason="t", gpus=2)
    public = client.get("/metrics")
    assert public.status_code == 200 and "orthoplex_jobs" in public.text
    assert "secret-customer-name" not in public.text and "tenant=" not in public.text
    assert "secret-customer-name" not in client.get("/metrics", headers=a).text  # a tenant token is not enough
    for headers in (ADMIN, {"Authorization": f"Bearer {SCRAPE}"}):
        text = client.get("/metrics", headers=headers).text
        assert 'orthoplex_gpus_allocated{tenant="secret-customer-name"} 2.0' in text
    wrong = client.get("/metrics", headers={"Authorization": "Bearer wrong"})
    assert wrong.status_code == 200 and "secret-customer-name" not in wrong.text


def test_method_label_is_bounded(client: TestClient) -> None:
    for i in range(30):
        client.request(f"X{i}FLOOD", "/v1/jobs")
    text = client.get("/metrics", headers=ADMIN).text
    assert "FLOOD" not in text
    assert 'method="other"' in text
