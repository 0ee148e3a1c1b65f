"""Node drains over the API without a Ray cluster: who may drain, what a bad request is told, and
what happens when the cluster cannot be asked. (Draining a real node, the controller and the runtime
moving a job off it: ``tests/controller/test_drain.py``.)"""

from __future__ import annotations

import datetime as dt

import pytest

from service.db.models import NodeDrain
from tests.service.conftest import ADMIN, make_tenant

pytestmark = pytest.mark.postgres

NODE = "a" * 56


def test_only_the_admin_drains_and_bad_input_names_the_field(client) -> None:
    _, tenant = make_tenant(client, "drain-tenant")
    assert client.post(f"/v1/cluster/nodes/{NODE}/drain", json={"deadline_s": 60}).status_code == 401
    for path in ("drain", "undrain"):
        r = client.post(f"/v1/cluster/nodes/{NODE}/{path}", json={"deadline_s": 60}, headers=tenant)
        assert r.status_code == 403, r.text
    for body in ({"deadline_s": 0}, {"deadline_s": -5}, {"deadline_s": "60"}, {"deadline_s": 1e9}, {},
                 {"deadline_s": True}):
        r = client.post(f"/v1/cluster/nodes/{NODE}/drain", json=body, headers=ADMIN)
        assert r.status_code == 422, (body, r.text)
        assert r.json()["detail"][0]["loc"] == ["body", "deadline_s"], (body, r.json())
    r = client.post(f"/v1/cluster/nodes/{NODE}/drain", json={"deadline_s": 60, "grace": 1}, headers=ADMIN)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "grace"]
    r = client.post("/v1/cluster/nodes/bad%20node!/drain", json={"deadline_s": 60}, headers=ADMIN)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["path", "node_id"]


def test_without_the_cluster_a_drain_cannot_check_the_node_but_a_stored_one_shows_and_undrains(
        client, pg_sessions) -> None:
    import ray

    # alone, this process is not connected to Ray: the cluster view is unavailable. In the whole suite an
    # earlier test's session cluster may have connected it: then the cluster is asked, and has no such node
    connected = ray.is_initialized()
    r = client.post(f"/v1/cluster/nodes/{NODE}/drain", json={"deadline_s": 60}, headers=ADMIN)
    if connected:
        assert r.status_code == 404, r.text
    else:
        assert r.status_code == 503 and "could not be asked" in r.text and r.headers["Retry-After"]
    # a drain stored before (a restart of the service): shown, counted, undrained
    now = dt.datetime.now(dt.UTC)
    with pg_sessions() as s:
        s.add(NodeDrain(node_id=NODE, deadline_s=30.0, requested_at=now, deadline_at=now + dt.timedelta(seconds=30)))
        s.commit()
    cluster = client.get("/v1/cluster", headers=ADMIN).json()
    assert cluster["draining_nodes"] == 1
    # the cluster could not be asked: jobs may still hold GPUs there, so it is still "draining" (asked:
    # no placement group holds a GPU on a node it does not have, "drained")
    state = "drained" if connected else "draining"
    assert [(d["node_id"], d["state"], d["deadline_s"]) for d in cluster["drains"]] == [(NODE, state, 30.0)]
    _, tenant = make_tenant(client, "drain-viewer")
    seen = client.get("/v1/cluster", headers=tenant).json()
    assert seen["draining_nodes"] == 1 and seen["drains"] == []  # a tenant sees that nodes drain, not which
    r = client.post(f"/v1/cluster/nodes/{NODE}/undrain", headers=ADMIN)
    assert r.status_code == 200 and r.json()["state"] == "active", r.text
    assert client.get("/v1/cluster", headers=ADMIN).json()["draining_nodes"] == 0
    with pg_sessions() as s:
        assert s.get(NodeDrain, NODE) is None
