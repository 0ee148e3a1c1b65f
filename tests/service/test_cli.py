"""The CLI against a real ``orthoplex serve`` process: admin commands (direct database access),
submit, status, events (also --follow), cancel; exit codes and messages."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
import pytest
import typer
from typer.testing import CliRunner

from service.cli import client as client_cli
from service.cli import server as server_cli

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def cli() -> typer.Typer:
    app = typer.Typer()
    server_cli.register(app)
    client_cli.register(app)
    return app


@pytest.fixture(scope="module")
def tenant_token(cli: typer.Typer, pg_url: str) -> str:
    runner = CliRunner()
    name = f"cli-{uuid.uuid4().hex[:6]}"
    r = runner.invoke(cli, ["admin", "create-tenant", name, "--quota", "4", "--weight", "2", "--database-url", pg_url])
    assert r.exit_code == 0, r.output
    assert f"tenant {name} id=" in r.stdout and "quota=4 weight=2" in r.stdout
    r = runner.invoke(cli, ["admin", "create-tenant", name, "--database-url", pg_url])
    assert r.exit_code == 1 and "exists" in r.output
    r = runner.invoke(cli, ["admin", "create-token", name, "--database-url", pg_url])
    assert r.exit_code == 0, r.output
    return r.stdout.strip().splitlines()[0]


def _run(cli: typer.Typer, live, token: str, *args: str) -> object:
    return CliRunner().invoke(cli, [*args, "--url", live.url, "--token", token])


def test_admin_input_errors(cli: typer.Typer, pg_url: str) -> None:
    runner = CliRunner()
    r = runner.invoke(cli, ["admin", "create-tenant", "Bad Name!", "--database-url", pg_url])
    assert r.exit_code == 2 and "name" in r.output
    r = runner.invoke(cli, ["admin", "create-token", "no-such-tenant-x", "--database-url", pg_url])
    assert r.exit_code == 1 and "no tenant" in r.output


def test_submit_status_events_cancel(cli: typer.Typer, live, tenant_token: str, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: cli-job\nmodel: tiny\nsteps: 20\nglobal_batch: 8\nmin_gpus: 1\nmax_gpus: 2\n")
    r = _run(cli, live, tenant_token, "submit", str(spec), "--json")
    assert r.exit_code == 0, r.output
    job = json.loads(r.stdout)
    assert job["state"] == "PENDING" and job["name"] == "cli-job"
    jid = str(job["id"])
    r = _run(cli, live, tenant_token, "status")
    assert r.exit_code == 0 and "cli-job" in r.stdout and "PENDING" in r.stdout
    r = _run(cli, live, tenant_token, "status", jid, "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["id"] == job["id"]
    r = _run(cli, live, tenant_token, "events", jid)
    assert r.exit_code == 0 and "submitted" in r.stdout
    r = _run(cli, live, tenant_token, "cancel", jid)
    assert r.exit_code == 0 and f"job {jid}: CANCELLED" in r.stdout
    r = _run(cli, live, tenant_token, "cancel", jid)
    assert r.exit_code == 1 and "409" in r.output and "ended" in r.output
    r = _run(cli, live, tenant_token, "status", jid)
    assert r.exit_code == 0, r.output
    assert "CANCELLED" in r.stdout and "0/20" in r.stdout and "last event" in r.stdout
    r = _run(cli, live, tenant_token, "status", jid, "--json")
    prog = json.loads(r.stdout)["progress"]
    assert prog["steps"] == 20 and prog["eta_s"] is None and prog["last_event"]["type"] == "transition"
    # --follow of a job that ended without succeeding: the events, then exit 4 (scripts can tell)
    r = _run(cli, live, tenant_token, "events", jid, "--follow")
    assert r.exit_code == client_cli.EXIT_JOB_UNSUCCESSFUL, r.output
    assert "PENDING -> CANCELLED" in r.stdout and f"job {jid} ended: CANCELLED" in r.stdout
    r = _run(cli, live, tenant_token, "events", jid, "--follow", "--json")
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert lines[-1] == {"type": "end", "job": int(jid), "state": "CANCELLED"}
    r = _run(cli, live, tenant_token, "cancel", jid, "--json")
    assert r.exit_code == 1 and "409" in r.output


def test_cli_prints_no_library_log_lines(live, tenant_token: str) -> None:
    """The real ``orthoplex`` app: no ``httpx`` request lines unless ``-v`` asks for them."""
    from service.cli.main import app

    args = ["status", "--url", live.url, "--token", tenant_token]
    quiet = CliRunner().invoke(app, args)
    assert quiet.exit_code == 0, quiet.output
    assert "HTTP Request" not in quiet.output
    loud = CliRunner().invoke(app, ["-v", *args])
    assert loud.exit_code == 0 and "HTTP Request" in loud.output


def test_submit_errors(cli: typer.Typer, live, tenant_token: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    assert _run(cli, live, tenant_token, "submit", str(bad)).exit_code == 2
    assert _run(cli, live, tenant_token, "submit", str(tmp_path / "missing.yaml")).exit_code == 2
    invalid = tmp_path / "invalid.yaml"
    invalid.write_text("name: x\nmodel: tiny\nsteps: 5\nglobal_batch: 8\nmin_gpus: 4\nmax_gpus: 2\n")
    r = _run(cli, live, tenant_token, "submit", str(invalid))  # the API's rules, checked before sending
    assert r.exit_code == 2 and "max_gpus: must be >= min_gpus" in r.output
    outside = tmp_path / "outside.yaml"  # what only the tenant's data area can tell: the API's 422
    outside.write_text("name: x\nmodel: {hf: no-such-dir}\nsteps: 5\nglobal_batch: 8\n")
    r = _run(cli, live, tenant_token, "submit", str(outside))
    assert r.exit_code == 1 and "422" in r.output and "model.hf" in r.output
    r = _run(cli, live, "not-a-token", "status")
    assert r.exit_code == 1 and "401" in r.output
    r = _run(cli, live, tenant_token, "status", "2147483000")
    assert r.exit_code == 1 and "404" in r.output


def test_unreachable_service_is_exit_3(cli: typer.Typer, tenant_token: str) -> None:
    from tests.service.live import free_port

    r = CliRunner().invoke(cli, ["status", "--url", f"http://127.0.0.1:{free_port()}", "--token", tenant_token])
    assert r.exit_code == 3 and "cannot reach" in r.output


def test_submit_retry_is_idempotent(cli: typer.Typer, live, tenant_token: str, tmp_path: Path) -> None:
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps({"name": "same", "model": "tiny", "steps": 5, "global_batch": 4}))
    ids = {json.loads(_run(cli, live, tenant_token, "submit", str(spec), "--key", "fixed", "--json").stdout)["id"]
           for _ in range(3)}
    assert len(ids) == 1


def test_serve_migrated_the_schema(live, pg_url: str) -> None:
    from alembic.script import ScriptDirectory

    from service.db import migrate

    assert migrate.current(pg_url) == ScriptDirectory.from_config(migrate.alembic_config()).get_current_head()
    assert httpx.get(f"{live.url}/healthz").json() == {"status": "ok"}


def test_admin_and_cluster_commands_speak_json(cli: typer.Typer, pg_url: str, tmp_path: Path) -> None:
    """Scripts read every command's result as JSON (``--json``), not by scraping text."""
    from service.cli import runtime as runtime_cli

    runner = CliRunner()
    name = f"json-{uuid.uuid4().hex[:6]}"
    r = runner.invoke(cli, ["admin", "create-tenant", name, "--quota", "2", "--json", "--database-url", pg_url])
    assert r.exit_code == 0, r.output
    tenant = json.loads(r.stdout)
    assert tenant["name"] == name and tenant["gpu_quota"] == 2 and isinstance(tenant["id"], int)
    r = runner.invoke(cli, ["admin", "create-token", name, "--json", "--database-url", pg_url])
    assert r.exit_code == 0, r.output
    tok = json.loads(r.stdout)
    assert tok["tenant_id"] == tenant["id"] and tok["token"].startswith(tok["prefix"])
    app = typer.Typer()
    runtime_cli.register(app)
    r = runner.invoke(app, ["cluster", "down", "--data-dir", str(tmp_path), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout) == {"stopped": 0}


def test_cluster_drain_and_undrain(cli: typer.Typer, live, tenant_token: str) -> None:
    from tests.service.conftest import ADMIN_TOKEN

    node = "b" * 56
    r = CliRunner().invoke(cli, ["cluster", "drain", node, "--deadline", "0", "--token", ADMIN_TOKEN])
    assert r.exit_code == 2 and "--deadline" in r.output  # bad input: no request sent
    r = _run(cli, live, tenant_token, "cluster", "drain", node, "--deadline", "60")
    assert r.exit_code == 1 and "admin" in r.output.lower(), r.output  # the API's 403
    # this server runs without a controller (no Ray): it cannot check the node, and says so
    r = _run(cli, live, ADMIN_TOKEN, "cluster", "drain", node, "--deadline", "60")
    assert r.exit_code == 3 and "could not be asked" in r.output, r.output
    r = _run(cli, live, ADMIN_TOKEN, "cluster", "undrain", node, "--json")
    assert r.exit_code == 3 and "could not be asked" in r.output, r.output
