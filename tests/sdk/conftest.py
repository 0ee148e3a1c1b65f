"""A real ``orthoplex serve`` process per backend (SQLite and PostgreSQL) for the SDK's tests,
with a short event-stream limit (so following a job crosses it), its own storage, and database
sessions standing in for the controller (the module the controller moves jobs with)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from service.db import migrate
from service.db.session import make_engine, make_sessionmaker
from tests.service.live import LiveServer

ADMIN_TOKEN = "sdk-admin-secret-for-tests"
#: the server's event-stream limit in these tests: a followed job outlives several streams
SSE_MAX_S = 1.0
_names = itertools.count()


@dataclass
class Service:
    backend: str
    url: str
    admin_token: str
    storage: Path
    sessions: sessionmaker[Session]
    server: LiveServer

    def tenant(self, **fields: object) -> tuple[int, str]:
        """A new tenant and a token for it (over the SDK's admin calls); returns (id, token)."""
        from orthoplex import Client

        with Client(self.url, self.admin_token) as admin:
            t = admin.admin.create_tenant(f"sdk-{self.backend}-{next(_names)}", **fields)
            return t.id, admin.admin.create_token(t.id, "sdk-test").token


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def service(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    work = tmp_path_factory.mktemp(f"sdk-{request.param}")
    if request.param == "sqlite":
        url = f"sqlite:///{work / 'orthoplex.db'}"
    else:
        url = request.getfixturevalue("pg_empty_db_url")
    migrate.upgrade(url)
    server = LiveServer(url, ADMIN_TOKEN, log_path=work / "server.log",
                        env={"ORTHOPLEX_STORAGE_PATH": str(work / "storage"),
                             "ORTHOPLEX_API_SSE_MAX_S": str(SSE_MAX_S), "ORTHOPLEX_API_SSE_POLL_S": "0.1"})
    server.start()
    engine = make_engine(url)
    try:
        yield Service(request.param, server.url, ADMIN_TOKEN, work / "storage", make_sessionmaker(engine), server)
    finally:
        server.stop()
        engine.dispose()
