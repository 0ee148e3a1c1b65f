"""Fixtures of the control-plane tests: a migrated PostgreSQL database per session, sessions,
tenants and tokens, and an app bound to that database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from service.db import migrate
from service.db.models import Job, Tenant
from service.db.session import make_engine, make_sessionmaker


@pytest.fixture(scope="session")
def pg_url(pg_empty_db_url: str) -> str:
    """The session's PostgreSQL database, brought to the newest migration."""
    migrate.upgrade(pg_empty_db_url)
    return pg_empty_db_url


@pytest.fixture(scope="session")
def pg_engine(pg_url: str) -> Iterator[sa.Engine]:
    engine = make_engine(pg_url)
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def pg_sessions(pg_engine: sa.Engine) -> sessionmaker[Session]:
    return make_sessionmaker(pg_engine)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A migrated SQLite file database."""
    url = f"sqlite:///{tmp_path / 'orthoplex.db'}"
    migrate.upgrade(url)
    return url


def new_tenant(sessions: sessionmaker[Session], name: str, **kw: object) -> int:
    with sessions() as s:
        t = Tenant(name=name, **kw)
        s.add(t)
        s.commit()
        return t.id


def new_job(sessions: sessionmaker[Session], tenant_id: int, state: str = "PENDING", **kw: object) -> int:
    with sessions() as s:
        kw.setdefault("spec", {"name": "j", "model": "tiny", "steps": 10})
        kw.setdefault("min_gpus", 1)
        kw.setdefault("max_gpus", 2)
        j = Job(tenant_id=tenant_id, name="j", state=state, **kw)
        s.add(j)
        s.commit()
        return j.id


ADMIN_TOKEN = "admin-secret-for-tests"


@pytest.fixture(scope="session")
def app(pg_url: str):
    from service.api.app import create_app
    from service.api.config import ApiSettings
    from service.settings import Settings

    return create_app(Settings(database_url=pg_url, admin_token=ADMIN_TOKEN), ApiSettings(metrics_cache_s=0))


@pytest.fixture(scope="session")
def client(app):
    from fastapi.testclient import TestClient

    with TestClient(app) as c:
        yield c


ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def make_tenant(client, name: str, **kw: object) -> tuple[int, dict[str, str]]:
    """Create a tenant and a token over the API; returns its id and auth headers."""
    r = client.post("/v1/tenants", json={"name": name, **kw}, headers=ADMIN)
    assert r.status_code == 201, r.text
    tid = r.json()["id"]
    r = client.post(f"/v1/tenants/{tid}/tokens", json={"name": "t"}, headers=ADMIN)
    assert r.status_code == 201, r.text
    return tid, {"Authorization": f"Bearer {r.json()['token']}"}


def job_body(name: str = "j", **kw: object) -> dict[str, object]:
    return {"name": name, "model": "tiny", "steps": 10, "global_batch": 8, "min_gpus": 1, "max_gpus": 2, **kw}


@pytest.fixture(scope="session")
def live(pg_url: str, tmp_path_factory: pytest.TempPathFactory):
    """A real ``orthoplex serve`` process on the session database."""
    from tests.service.live import LiveServer

    server = LiveServer(pg_url, ADMIN_TOKEN, log_path=tmp_path_factory.mktemp("live") / "server.log")
    server.start()
    yield server
    server.stop()
