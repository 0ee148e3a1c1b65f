"""Engines and sessions for PostgreSQL and SQLite.

``make_engine(url)`` returns a configured engine: on PostgreSQL a pooled psycopg 3 engine with
pre-ping; on SQLite WAL journaling, foreign keys on, a busy timeout, and every transaction opened
with ``BEGIN IMMEDIATE`` so that read-then-write transactions (the compare-and-set in
``service.db.transitions``) serialise instead of failing with ``database is locked``.
``make_sessionmaker(engine)`` gives sessions with ``expire_on_commit=False``.

Every engine made here records which thread holds each checked-out connection:
``connections_held()`` is how many the calling thread holds (a session holds one from its first
statement until commit, rollback or close). Slow work that must not run inside a transaction (the
planner) checks it is zero: on SQLite every transaction holds the write lock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker


def normalize_url(url: str) -> str:
    """Use the psycopg 3 driver for bare ``postgresql://`` / ``postgres://`` URLs."""
    for bare in ("postgresql://", "postgres://"):
        if url.startswith(bare):
            return "postgresql+psycopg://" + url[len(bare) :]
    return url


#: checked-out pool entries -> the thread that checked them out (dict operations are atomic)
_HOLDERS: dict[int, int] = {}


def _track_holders(engine: sa.Engine) -> None:
    @sa.event.listens_for(engine, "checkout")
    def _out(_dbapi: Any, record: Any, _proxy: Any) -> None:
        _HOLDERS[id(record)] = threading.get_ident()

    @sa.event.listens_for(engine, "checkin")
    def _in(_dbapi: Any, record: Any) -> None:
        _HOLDERS.pop(id(record), None)

    @sa.event.listens_for(engine, "detach")
    def _detach(_dbapi: Any, record: Any) -> None:
        _HOLDERS.pop(id(record), None)


def connections_held() -> int:
    """Database connections the calling thread holds checked out (of engines made by :func:`make_engine`)."""
    me = threading.get_ident()
    return sum(1 for t in list(_HOLDERS.values()) if t == me)


def _sqlite_setup(engine: sa.Engine) -> None:
    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # let SQLAlchemy emit BEGIN (below), not pysqlite
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA synchronous=NORMAL")
        mode = cur.execute("PRAGMA journal_mode").fetchone()[0]
        if str(mode).lower() not in ("wal", "memory"):
            cur.execute("PRAGMA journal_mode=WAL")
        cur.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def make_engine(url: str, **kwargs: Any) -> sa.Engine:
    """An engine for ``url`` (PostgreSQL or SQLite), configured as the module docstring says."""
    url = normalize_url(url)
    parsed = sa.make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        kwargs.setdefault("connect_args", {"check_same_thread": False, "timeout": 30})
        engine = sa.create_engine(url, **kwargs)
        _sqlite_setup(engine)
        _track_holders(engine)
        return engine
    if "poolclass" not in kwargs:
        kwargs.setdefault("pool_pre_ping", True)
        kwargs.setdefault("pool_size", 10)
        kwargs.setdefault("max_overflow", 20)
        kwargs.setdefault("pool_recycle", 1800)
    kwargs.setdefault("connect_args", {"connect_timeout": 5})
    engine = sa.create_engine(url, **kwargs)
    _track_holders(engine)
    return engine


def make_sessionmaker(engine: sa.Engine) -> sessionmaker[Session]:
    """A sessionmaker bound to ``engine`` (objects stay usable after commit)."""
    return sessionmaker(bind=engine, expire_on_commit=False)


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session that commits on success and rolls back on error."""
    with factory() as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise
