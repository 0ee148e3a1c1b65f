"""The ``recovery`` block over REST and in CLI job files: 422 / exit 2 naming the field, the dry run
says what ``auto`` chose and why, the stored spec keeps only what the user set, and the job shows
the latest attempt's choice (real PostgreSQL, the real app)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from service.cli.main import app as cli_app
from service.db import transitions as tr
from tests.service.conftest import job_body, make_tenant

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def tenant(client: TestClient) -> dict[str, str]:
    return make_tenant(client, f"rec-{uuid.uuid4().hex[:6]}", submit_per_minute=1000, max_jobs=1000)[1]


@pytest.mark.parametrize(("recovery", "loc"), [
    ({"policy": "sometimes"}, ["body", "recovery", "policy"]),
    ({"policy": "replan", "groups": 2}, ["body", "recovery", "groups"]),
    ({"policy": "replica_groups", "groups": 1}, ["body", "recovery", "groups"]),
    ({"policy": "restart", "snapshots": {"enabled": True}}, ["body", "recovery", "snapshots", "enabled"]),
    ({"snapshots": {"every": 0}}, ["body", "recovery", "snapshots", "every"]),
    ({"snapshots": {"enabled": "yes"}}, ["body", "recovery", "snapshots", "enabled"]),
    ({"warm_ranks": 99}, ["body", "recovery", "warm_ranks"]),
    ({"warm_ranks": True}, ["body", "recovery", "warm_ranks"]),
    ({"spares": 2}, ["body", "recovery", "spares"]),
])
def test_bad_recovery_blocks_are_422_naming_the_field(client: TestClient, tenant: dict[str, str],
                                                      recovery: dict[str, object], loc: list[object]) -> None:
    body = job_body(recovery=recovery)
    for path in ("/v1/jobs", "/v1/plans"):
        r = client.post(path, content=json.dumps(body), headers={**tenant, "Content-Type": "application/json"})
        assert r.status_code == 422, r.text
        assert loc in [e["loc"] for e in r.json()["detail"]], r.json()


def test_a_named_replica_policy_without_a_second_replica_is_422(client: TestClient, tenant: dict[str, str]) -> None:
    """One GPU is dp=1: no second replica to heal from; the planner's reason is the message."""
    body = job_body(max_gpus=1, recovery={"policy": "replica_groups"})
    for path in ("/v1/plans", "/v1/jobs"):
        r = client.post(path, json=body, headers=tenant)
        assert r.status_code == 422, r.text
        err = r.json()["detail"][0]
        assert err["loc"] == ["body", "recovery", "policy"] and "dp=1" in err["msg"], err


def test_the_dry_run_says_what_auto_chose_and_why(client: TestClient, tenant: dict[str, str]) -> None:
    r = client.post("/v1/plans", json=job_body(max_gpus=1), headers=tenant)
    assert r.status_code == 200, r.text
    rec = r.json()["recovery"]
    assert (rec["policy"], rec["runtime_policy"], rec["snapshots"], rec["source"]) == (
        "replan", "replan_memory", True, "rule")
    assert rec["warm_ranks"] >= 1 and rec["snapshot_every"] >= 1 and "dp=1" in rec["reason"]
    off = client.post("/v1/plans", json=job_body(max_gpus=1, recovery={"policy": "restart", "warm_ranks": 0}),
                      headers=tenant).json()["recovery"]
    assert (off["policy"], off["snapshots"], off["warm_ranks"], off["source"]) == ("restart", False, 0, "spec")
    # four GPUs of the tiny model: data parallelism holds full replicas; auto says so (replica groups,
    # or the re-plan the runtime falls back to where its replica path does not run the layout yet)
    four = client.post("/v1/plans", json=job_body(max_gpus=4), headers=tenant).json()["recovery"]
    assert "full replica" in four["reason"], four
    assert four["policy"] == "replica_groups" or "the runtime does not run these replica groups" in four["reason"]


def test_the_stored_spec_keeps_what_the_user_set_and_the_job_shows_the_attempts_choice(
        client: TestClient, tenant: dict[str, str], pg_sessions) -> None:
    block = {"policy": "replan", "snapshots": {"every": 2}, "warm_ranks": 0}
    r = client.post("/v1/jobs", json=job_body(max_gpus=1, recovery=block), headers=tenant)
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["spec"]["recovery"] == block and job["recovery"] is None  # no attempt yet
    choice = {"policy": "replan", "groups": 0, "snapshots": True, "snapshot_every": 2, "warm_ranks": 0,
              "reason": "re-plan, named in the spec"}
    with pg_sessions() as s:  # what the controller writes when it starts an attempt
        assert tr.start_attempt(s, job["id"], expected={"PENDING"}, new="ADMITTED", expected_epoch=0,
                                reason="t", gpus=1, payload={"recovery": choice}) == 1
    got = client.get(f"/v1/jobs/{job['id']}", headers=tenant).json()
    assert got["recovery"] == choice


def test_cli_job_files_with_a_bad_recovery_block_exit_2_naming_the_field(tmp_path: Path) -> None:
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps(job_body(recovery={"policy": "restart", "snapshots": {"enabled": True}})))
    res = CliRunner().invoke(cli_app, ["submit", str(spec), "--url", "http://127.0.0.1:9"])
    assert res.exit_code == 2, res.output
    assert "recovery.snapshots.enabled" in res.output, res.output


def test_cli_status_shows_the_jobs_recovery(capsys: pytest.CaptureFixture[str]) -> None:
    from service.cli.client import _job_detail
    from service.cli.progress import progress

    job = {"id": 3, "name": "r", "state": "RUNNING", "reason": "", "cancel_requested": False, "gpus_allocated": 6,
           "min_gpus": 2, "max_gpus": 6, "spec": {"steps": 10},
           "recovery": {"policy": "replica_groups", "groups": 3, "group_gpus": 2, "snapshots": True,
                        "snapshot_every": 1, "warm_ranks": 1, "reason": "zero=0: each of the dp=3 ranks holds a full replica"}}
    _job_detail(job, progress(job, [], []))
    out = capsys.readouterr().out
    assert "recovery (auto): replica_groups: 3 groups of 2 GPU(s)" in out and "full replica" in out, out
