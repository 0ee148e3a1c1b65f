"""Drain a node through the service: the REST call, the controller, the runtime, and back.

Real everything: the API (in this process, on Postgres, asking the session Ray cluster), a controller
process, a tiny job (``tp=2,dp=2`` on 4 GPUs, memory snapshots on) trained by the real runtime:

1. the admin drains the job's node (``POST /v1/cluster/nodes/{node}/drain``, 60 s): the node is
   ``draining``; the controller tells the job's supervisor, which moves off at a step boundary from
   its memory snapshot (``resumed``: cause ``drain``, source ``memory``, 0 steps redone; ``drained``),
   one attempt throughout; the node becomes ``drained`` (no GPU held there);
2. a job submitted now is not placed on the drained node;
3. a new API process on the same database (a service restart) still shows the drain;
4. undrain: the node is ``active`` again; an unknown node is a 404.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from service.db import transitions as tx
from service.db.session import make_engine, make_sessionmaker
from tests.controller import helpers as h

pytestmark = [pytest.mark.postgres, pytest.mark.cluster]

ADMIN_TOKEN = "drain-admin-token"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def _api(db_url: str) -> Any:
    from fastapi.testclient import TestClient

    from service.api.app import create_app
    from service.api.config import ApiSettings
    from service.settings import Settings

    return TestClient(create_app(Settings(database_url=db_url, admin_token=ADMIN_TOKEN), ApiSettings(metrics_cache_s=0)))


def _runtime(engine: Any, job_id: int, type_: str) -> list[Any]:
    return [e for e in h.events(engine, job_id, type_=type_) if e.source.startswith("runtime:")]


def _drain_of(client: Any, node: str) -> str | None:
    r = client.get("/v1/cluster", headers=ADMIN)
    assert r.status_code == 200, r.text
    return next((n["drain"] for n in r.json()["nodes"] if n["node_id"] == node), "missing")


@pytest.mark.timeout(900)
def test_drain_moves_the_job_off_with_nothing_redone_and_keeps_new_work_away(
        ray_cluster, migrated_db_url: str, tmp_path: Path) -> None:
    engine = make_engine(migrated_db_url)
    overrides = {"runtime": {**h.SERVICE_RUNTIME, "snapshots": True}}
    proc = h.ControllerProcess(migrated_db_url, ray_cluster.address, tmp_path / "storage", tmp_path / "c.log",
                               holder="drain", spec_overrides=overrides)
    tenant = h.add_tenant(engine, "t", quota=12)
    job = h.add_job(engine, tenant, "moved", h.tiny_spec(100_000, every=100_000, layout_hint={"tp": 2, "dp": 2}),
                    gpus=4)
    later = None
    try:
        with _api(migrated_db_url) as api:
            h.wait_for(lambda: len(h.metrics(engine, job)) >= 2, 300, "the job training")
            node = next(iter(h.attempts(engine, job)[-1].placement))
            r = api.post(f"/v1/cluster/nodes/{node}/drain", json={"deadline_s": 60}, headers=ADMIN)
            assert r.status_code == 200, r.text
            assert r.json()["node_id"] == node and r.json()["state"] == "draining" and r.json()["deadline_s"] == 60

            # 1. the job moves off at a step boundary, from memory, nothing redone, in the same attempt
            moved = h.wait_for(lambda: _runtime(engine, job, "resumed"), 300, "resumed after the drain")[0]
            assert (moved.payload["cause"], moved.payload["source"], moved.payload["steps_redone"]) == (
                "drain", "memory", 0)
            drained = h.wait_for(lambda: _runtime(engine, job, "drained"), 60, "drained")[0]
            assert drained.payload["nodes"] == [node] and drained.payload["how"] == "replan"
            h.wait_for(lambda: node not in (h.attempts(engine, job)[-1].placement or {}), 60, "placement moved")
            h.wait_for(lambda: _drain_of(api, node) == "drained", 60, "the node drained")
            assert [a.number for a in h.attempts(engine, job)] == [1]
            h.wait_for(lambda: len(h.metrics(engine, job)) > moved.payload["from_step"] + 1, 120, "steps after it")
            steps = [m.step for m in h.metrics(engine, job)]
            assert steps == list(range(1, len(steps) + 1)), steps[:50]  # every step once: nothing redone

            # 2. new work goes elsewhere (a tenant sees that a node drains, not which)
            later = h.add_job(engine, tenant, "later", h.tiny_spec(100_000, every=100_000), gpus=2)
            h.wait_for(lambda: h.attempts(engine, later), 120, "the later job admitted")
            assert node not in (h.attempts(engine, later)[-1].placement or {})
            cluster = api.get("/v1/cluster", headers=ADMIN).json()
            assert cluster["draining_nodes"] == 1 and [d["node_id"] for d in cluster["drains"]] == [node]

        # 3. a restart of the service: the drain is still there (the database's)
        with _api(migrated_db_url) as api:
            assert _drain_of(api, node) == "drained"
            # 4. undrain, then an unknown node
            r = api.post(f"/v1/cluster/nodes/{node}/undrain", headers=ADMIN)
            assert r.status_code == 200 and r.json()["state"] == "active", r.text
            assert _drain_of(api, node) is None and api.get("/v1/cluster", headers=ADMIN).json()["drains"] == []
            r = api.post("/v1/cluster/nodes/no-such-node/drain", json={"deadline_s": 5}, headers=ADMIN)
            assert r.status_code == 404 and "not found" in r.text
            assert api.post("/v1/cluster/nodes/no-such-node/undrain", headers=ADMIN).status_code == 404
        with make_sessionmaker(engine)() as s:
            for j in (job, later):
                assert tx.request_cancel(s, j) is tx.CancelOutcome.REQUESTED
        for j in (job, later):
            h.wait_for(lambda j=j: h.job(engine, j).state == "CANCELLED", 120, f"job {j} CANCELLED")
            h.wait_for(lambda j=j: not h.live_supervisors(j), 60, "no supervisor left")
    finally:
        proc.stop()
        engine.dispose()
