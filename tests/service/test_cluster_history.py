"""This cluster's recorded recoveries and node losses (service/cluster_history.py) in a real PostgreSQL
event store: they set the plan's recovery phases and failure rates, and the choice changes with them;
``POST /v1/plans``, ``orthoplex plan`` and ``orthoplex simulate --calibration cluster`` read them."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

import planner
from planner.recovery_cost import PRIOR
from service.cluster_history import MIN_NODE_DAYS, calibration, cluster_rates, planner_inputs
from service.db import migrate
from service.db.models import Attempt, Event
from service.db.session import make_engine, make_sessionmaker
from tests.conftest import make_empty_database
from tests.service.conftest import job_body, make_tenant, new_job, new_tenant

pytestmark = pytest.mark.postgres

BIG: dict[str, Any] = {"model": {"name": "llama3-405b", "seq_len": 8192},
                       "cluster": {"gpu_type": "H100", "num_gpus": 16_384, "gpus_per_node": 8},
                       "parallel": {"global_batch": 2048}, "precision": "bf16", "duration_days": 54}
SLOW = {"detect": 30.0, "plan": 1.0, "place": 20.0, "start": 120.0, "load": 60.0, "first_step": 5.0}
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@pytest.fixture
def store(pg_server_url: str) -> Iterator[tuple[str, sessionmaker[Session]]]:
    """An event store of its own (other tests' events must not leak into the calibration)."""
    url, drop = make_empty_database(pg_server_url)
    migrate.upgrade(url)
    engine = make_engine(url)
    try:
        yield url, make_sessionmaker(engine)
    finally:
        engine.dispose()
        drop()


def _event(s: Session, job: int, seq: int, type_: str, **payload: Any) -> None:
    s.add(Event(job_id=job, epoch=1, source="runtime", seq=seq, type=type_, payload=payload))


def _record_recoveries(sessions: sessionmaker[Session], job: int, n: int) -> None:
    with sessions() as s:
        for i in range(n):
            _event(s, job, 100 + i, "recovery", cause="node_lost", phases=SLOW, total_s=sum(SLOW.values()),
                   teardown_s=0.1, reason="recovered")
        # a planned switch (a resize) is not a failure's recovery: left out
        _event(s, job, 200, "recovery", cause="resize", phases={**SLOW, "detect": 0.0}, total_s=1.0, teardown_s=0.0,
               reason="resized")
        s.commit()


def test_recorded_recoveries_set_the_phases_and_change_the_choice(store: tuple[str, sessionmaker[Session]]) -> None:
    _, sessions = store
    with sessions() as db:
        assert calibration(db) is PRIOR
        keys, note = planner_inputs(db, "llama3", 8)
    before = planner.plan({**BIG, **keys}, top_k=1).plans[0]
    job = new_job(sessions, new_tenant(sessions, "hist"))
    _record_recoveries(sessions, job, 3)
    with sessions() as db:
        cal = calibration(db)
        keys, note = planner_inputs(db, "llama3", 8)
    assert cal.recorded == 3 and cal.phases.start == 120.0 and cal.phases.detect == 30.0
    assert keys["recovery_phases"]["recorded"] == 3 and note == ""
    after = planner.plan({**BIG, **keys}, top_k=1).plans[0]
    assert after.ettr < before.ettr
    assert (after.recovery["policy"], after.recovery["groups"]) != (before.recovery["policy"], before.recovery["groups"])


def test_cluster_failure_rates_need_enough_node_days(store: tuple[str, sessionmaker[Session]]) -> None:
    _, sessions = store
    tenant = new_tenant(sessions, "rates")
    job, injected = new_job(sessions, tenant), new_job(sessions, tenant)
    placement = {f"n{i}": 8 for i in range(8)}
    with sessions() as s:  # 8 nodes for 100 days: 800 node-days, 2 losses
        s.add(Attempt(job_id=job, number=1, epoch=1, state="SUCCEEDED", gpus=64, placement=placement,
                      started_at=T0, ended_at=T0 + dt.timedelta(days=100)))
        _event(s, job, 1, "node_lost", nodes=["n1"], ranks=[8], step=5)
        _event(s, job, 2, "node_lost", nodes=["n2"], ranks=[16], step=9)
        # a job with injected faults counts neither its losses nor its node-days
        s.add(Attempt(job_id=injected, number=1, epoch=1, state="SUCCEEDED", gpus=64, placement=placement,
                      started_at=T0, ended_at=T0 + dt.timedelta(days=500)))
        _event(s, injected, 1, "fault_injected", step=3, node="n3", ranks=[24], kind="kill", at_step=3, factor=1.0,
               amplitude=0.0)
        _event(s, injected, 2, "node_lost", nodes=["n3"], ranks=[24], step=3)
        s.commit()
    with sessions() as db:
        rates, note = cluster_rates(db, 8)
    assert rates == "llama3" and "800.0 node-days" in note and f"{MIN_NODE_DAYS:,.0f}" in note
    with sessions() as s:  # 50 more days on 8 nodes: 1,200 node-days, 3 losses
        s.add(Attempt(job_id=job, number=2, epoch=2, state="SUCCEEDED", gpus=64, placement=placement,
                      started_at=T0 + dt.timedelta(days=100), ended_at=T0 + dt.timedelta(days=150)))
        _event(s, job, 3, "node_lost", nodes=["n4"], ranks=[32], step=20)
        s.commit()
    with sessions() as db:
        rates, note = cluster_rates(db, 8)
        keys, _ = planner_inputs(db, "cluster", 8)
    assert isinstance(rates, dict) and rates["node_losses"] == 3 and rates["node_days"] == pytest.approx(1200.0)
    assert rates["node_failures_per_node_day"] == pytest.approx(3 / 1200)
    result = planner.plan({**BIG, **keys}, top_k=1)
    assert result.goodput["failure_rates"]["name"] == "cluster"
    # 2.5 losses per 1000 node-days is below Llama 3's 3.8: fewer failures, higher ETTR
    llama = planner.plan({**BIG, "failure_rates": "llama3"}, top_k=1)
    assert result.plans[0].ettr > llama.plans[0].ettr


def test_cli_reads_the_service_database(store: tuple[str, sessionmaker[Session]], tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from service.cli.main import app
    from service.settings import get_settings

    url, sessions = store
    _record_recoveries(sessions, new_job(sessions, new_tenant(sessions, "cli")), 2)
    monkeypatch.setenv("ORTHOPLEX_DATABASE_URL", url)
    get_settings.cache_clear()
    try:
        spec = tmp_path / "big.json"
        spec.write_text(json.dumps({k: v for k, v in BIG.items() if k != "duration_days"}))
        r = CliRunner().invoke(app, ["plan", "--spec", str(spec), "--duration-days", "54", "--calibration", "cluster",
                                     "--failure-rates", "cluster", "--top", "1", "--json"])
        assert r.exit_code == 0, r.output
        out = json.loads(r.stdout)
        assert out["goodput"]["recovery_phases"]["recorded"] == 2
        assert "node-days recorded" in out["goodput"]["note"]  # none yet: priced with llama3
        assert out["plans"][0]["recovery"]["policy"]
        r = CliRunner().invoke(app, ["simulate", "--gpus", "1024", "--days", "5", "--policy", "replan_memory",
                                     "--spares", "0", "--calibration", "cluster"])
        assert r.exit_code == 0, r.output
        assert "2 recorded recoveries" in r.output
        r = CliRunner().invoke(app, ["simulate", "--calibration", "guess"])
        assert r.exit_code == 2 and "calibration" in r.output
    finally:
        get_settings.cache_clear()


def test_plans_endpoint_returns_the_goodput_choice(client) -> None:
    _, headers = make_tenant(client, "goodput-plans")
    r = client.post("/v1/plans", json=job_body("g", duration_days=3, failure_rates="rsc"), headers=headers)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["goodput"]["failure_rates"]["name"] == "rsc" and body["goodput"]["ranking"]
    best = body["plans"][0]
    assert 0 < best["ettr"] <= 1 and best["recovery"]["policy"] and best["effective_tokens_per_s"] > 0
    r = client.post("/v1/plans", json=job_body("g", failure_rates="llama3"), headers=headers)
    assert r.status_code == 422 and "duration_days" in r.text
    r = client.post("/v1/plans", json=job_body("g", duration_days=3, failure_rates="mars"), headers=headers)
    assert r.status_code == 422 and "failure_rates" in r.text
    plain = client.post("/v1/plans", json=job_body("g"), headers=headers).json()
    assert plain.get("goodput") is None and "ettr" not in plain["plans"][0]


def test_job_page_explain_shows_the_goodput_choice(client) -> None:
    """The job page's "Why this plan" (``/v1/dashboard/jobs/{id}/explain``) carries the plan's ETTR and
    recovery choice for a job submitted with a duration; ``cluster`` rates are resolved from the store."""
    _, headers = make_tenant(client, "goodput-page")
    r = client.post("/v1/jobs", json=job_body("page", duration_days=2, failure_rates="cluster"), headers=headers)
    assert r.status_code == 201, r.text
    e = client.get(f"/v1/dashboard/jobs/{r.json()['id']}/explain", headers=headers).json()
    assert e["available"], e
    assert e["goodput"]["duration_days"] == 2 and "node-days recorded" in e["goodput"]["note"]
    best = e["plans"][0]
    assert best["recovery"]["policy"] and 0 < best["ettr"] <= 1
    plain = client.post("/v1/jobs", json=job_body("plain"), headers=headers).json()
    assert client.get(f"/v1/dashboard/jobs/{plain['id']}/explain", headers=headers).json()["goodput"] is None
