"""Fixtures of the controller tests: a migrated scratch database per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import make_empty_database


@pytest.fixture
def migrated_db_url(pg_server_url: str) -> Iterator[str]:
    """A new, empty database brought to the newest migration; dropped afterwards."""
    from service.db.migrate import upgrade

    url, drop = make_empty_database(pg_server_url)
    upgrade(url)
    try:
        yield url
    finally:
        drop()
