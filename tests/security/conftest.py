"""Fixtures of the adversarial suite: the control-plane fixtures (a migrated PostgreSQL database
per session, SQLite files) and live API processes on either store."""

from __future__ import annotations

from tests.service.conftest import pg_engine, pg_sessions, pg_url, sqlite_url  # noqa: F401
