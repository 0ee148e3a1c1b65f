"""Shared test fixtures: a real PostgreSQL database per test session; the Ray cluster plugin."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

pytest_plugins = ["tests.fixtures.s3_server", "tests.fixtures.ray_cluster", "tests.fixtures.netns_cluster",
                  "tests.fixtures.demo_stack"]

DEFAULT_SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def _server_url() -> str:
    """The server to create scratch databases on: ORTHOPLEX_TEST_DATABASE_URL's server, else local."""
    url = os.environ.get("ORTHOPLEX_TEST_DATABASE_URL") or DEFAULT_SERVER
    return url.rsplit("/", 1)[0] + "/postgres"


def _admin_execute(server_url: str, sql: str) -> None:
    import psycopg

    conninfo = server_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(conninfo, autocommit=True, connect_timeout=5) as conn:
        conn.execute(sql)


@pytest.fixture(scope="session")
def pg_server_url() -> str:
    """URL of a reachable PostgreSQL server; a test marked ``postgres`` fails (never skips) without one."""
    import psycopg

    url = _server_url()
    try:
        _admin_execute(url, "SELECT 1")
    except psycopg.Error as exc:  # pragma: no cover - depends on the machine
        pytest.fail(
            f"PostgreSQL is not reachable at {url} ({exc}); start it or set ORTHOPLEX_TEST_DATABASE_URL",
            pytrace=False,
        )
    return url


@pytest.fixture(scope="session")
def pg_empty_db_url(pg_server_url: str) -> Iterator[str]:
    """A fresh, empty database for this test session, dropped afterwards."""
    name = f"orthoplex_t_{uuid.uuid4().hex[:10]}"
    _admin_execute(pg_server_url, f'CREATE DATABASE "{name}"')
    try:
        yield pg_server_url.rsplit("/", 1)[0] + "/" + name
    finally:
        _admin_execute(pg_server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def make_empty_database(pg_server_url: str) -> tuple[str, callable]:
    """Create another scratch database; returns its URL and a function that drops it."""
    name = f"orthoplex_t_{uuid.uuid4().hex[:10]}"
    _admin_execute(pg_server_url, f'CREATE DATABASE "{name}"')
    return pg_server_url.rsplit("/", 1)[0] + "/" + name, lambda: _admin_execute(
        pg_server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'
    )
