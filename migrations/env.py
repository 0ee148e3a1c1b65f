"""Alembic environment of Orthoplex.

The URL, first match wins: ``config.attributes["connection"]`` (an open connection, used by tests),
``config.attributes["url"]`` (``service.db.migrate``), ``-x url=...`` on the command line, the
``sqlalchemy.url`` option, then the ``ORTHOPLEX_DATABASE_URL`` setting. SQLite runs in batch mode
(``render_as_batch``) because it cannot ALTER most things in place.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from service.db.models import Base
from service.db.session import make_engine, normalize_url

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = config.attributes.get("url") or context.get_x_argument(as_dictionary=True).get("url")
    url = url or config.get_main_option("sqlalchemy.url")
    if not url:
        from service.settings import get_settings

        url = get_settings().database_url
    return normalize_url(url)


def _configure(**kwargs: object) -> None:
    context.configure(target_metadata=target_metadata, compare_type=True, **kwargs)


def run_offline() -> None:
    url = _url()
    _configure(url=url, literal_binds=True, render_as_batch=url.startswith("sqlite"))
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection=connection, render_as_batch=connection.dialect.name == "sqlite")
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = make_engine(_url(), poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            _configure(connection=conn, render_as_batch=conn.dialect.name == "sqlite")
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
