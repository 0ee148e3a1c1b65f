"""Fixtures of the storage tests: the e2e tests' fresh Postgres database per test."""

from tests.e2e.conftest import empty_db_url

__all__ = ["empty_db_url"]
