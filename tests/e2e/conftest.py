"""Fixtures of the e2e tests: a new, empty Postgres database per test (``orthoplex serve`` migrates it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import make_empty_database


@pytest.fixture
def empty_db_url(pg_server_url: str) -> Iterator[str]:
    url, drop = make_empty_database(pg_server_url)
    try:
        yield url
    finally:
        drop()
