"""What a tenant sees of the runtime: events and job reasons name checkpoints and nodes by opaque
names, never by absolute paths (of the storage or anything else on the workers) or Ray node ids."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from service.db import transitions as tr
from tests.service.conftest import ADMIN_TOKEN, job_body, make_tenant

pytestmark = pytest.mark.unit
NODE = "3f" * 28


@pytest.fixture
def client(sqlite_url: str) -> Iterator[TestClient]:
    from service.api.app import create_app
    from service.api.config import ApiSettings
    from service.settings import Settings

    app = create_app(Settings(database_url=sqlite_url, admin_token=ADMIN_TOKEN), ApiSettings(fit_check=False))
    with TestClient(app) as c:
        yield c


def test_events_and_reasons_are_scrubbed(client: TestClient) -> None:
    _, a = make_tenant(client, "scrub")
    jid = client.post("/v1/jobs", json=job_body(), headers=a).json()["id"]
    with client.app.state.sessions() as s:
        epoch = tr.start_attempt(s, jid, expected={"PENDING"}, new="ADMITTED", expected_epoch=0, reason="t")
        assert tr.record_event(s, jid, epoch=epoch, source="runtime", seq=1, type="checkpoint_saved",
                               payload={"location": "/srv/orthoplex/storage/jobs/1/checkpoints/step_00000010",
                                        "node_id": NODE, "nodes": [NODE],
                                        "error": f"FileNotFoundError: '/etc/shadow.d/x.bin' on node {NODE}"})
        assert tr.transition(s, jid, expected={"ADMITTED"}, new="FAILED", epoch=epoch,
                             reason="OSError: [Errno 2] No such file: /home/other/secret.bin")
    text = client.get(f"/v1/jobs/{jid}/events", headers=a).text
    job = client.get(f"/v1/jobs/{jid}", headers=a).json()
    stream = client.get(f"/v1/jobs/{jid}/events?stream=true", headers=a).text
    for body in (text, stream, job["reason"]):
        for leak in ("/srv", "/etc", "/home", "orthoplex/storage", NODE):
            assert leak not in body, (leak, body)
    assert "step_00000010" in text and "node-" in text and "secret.bin" in job["reason"]
