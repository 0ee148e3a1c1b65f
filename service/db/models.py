"""SQLAlchemy 2 models of the job store (PostgreSQL in production, SQLite as the zero-setup default).

Alembic owns the schema (``migrations/``); a test compares ``alembic upgrade head`` with this
metadata and fails on any drift. Every row that belongs to a tenant carries ``tenant_id NOT NULL``
(directly, or through its job). JSON columns use ``sa.JSON`` so both dialects work. Timestamps are
timezone-aware UTC (:class:`UTCDateTime` adds the zone SQLite drops).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from workers.states import AttemptState, JobState

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> dt.datetime:
    """Now, timezone-aware UTC."""
    return dt.datetime.now(dt.UTC)


class UTCDateTime(sa.types.TypeDecorator[dt.datetime]):
    """``TIMESTAMP WITH TIME ZONE`` that always hands back aware UTC datetimes (SQLite included)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: sa.Dialect) -> dt.datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        if value is not None and dialect.name == "sqlite":
            value = value.astimezone(dt.UTC)
        return value

    def process_result_value(self, value: dt.datetime | None, dialect: sa.Dialect) -> dt.datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return value


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(str(v)) for v in values)})"


class Base(DeclarativeBase):
    metadata = sa.MetaData(naming_convention=NAMING)
    type_annotation_map = {dt.datetime: UTCDateTime(), dict[str, Any]: sa.JSON()}


#: 64-bit ids for the tables that grow with training steps (SQLite needs INTEGER to autoincrement)
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


class Tenant(Base):
    __tablename__ = "tenants"
    __table_args__ = (
        sa.CheckConstraint("gpu_quota >= 0", name="gpu_quota_nonneg"),
        sa.CheckConstraint("weight > 0", name="weight_pos"),
        sa.CheckConstraint("max_jobs >= 1", name="max_jobs_pos"),
        sa.CheckConstraint("submit_per_minute >= 1", name="submit_rate_pos"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(64), unique=True)
    gpu_quota: Mapped[int] = mapped_column(default=0)
    weight: Mapped[float] = mapped_column(sa.Float, default=1.0)
    max_jobs: Mapped[int] = mapped_column(default=100, doc="most non-terminal jobs at once")
    submit_per_minute: Mapped[int] = mapped_column(default=60, doc="submission rate limit")
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow, server_default=sa.func.now())


class ApiToken(Base):
    """A tenant's API token: only the sha256 of the secret is stored; ``prefix`` identifies it."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(sa.ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(sa.String(64), default="")
    prefix: Mapped[str] = mapped_column(sa.String(16))
    token_hash: Mapped[str] = mapped_column(sa.String(64), unique=True)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow, server_default=sa.func.now())
    expires_at: Mapped[dt.datetime | None]
    revoked_at: Mapped[dt.datetime | None]


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        sa.CheckConstraint(_in("state", tuple(JobState)), name="state_valid"),
        sa.CheckConstraint("min_gpus >= 1 AND max_gpus >= min_gpus", name="gpu_range"),
        sa.CheckConstraint("gpus_allocated >= 0", name="gpus_allocated_nonneg"),
        sa.UniqueConstraint("tenant_id", "idempotency_key"),
        sa.Index(None, "tenant_id", "id"),
        sa.Index(None, "tenant_id", "state", "id"),
        sa.Index(None, "state", "priority", "id"),
        sa.Index(None, "tenant_id", "created_at"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(sa.ForeignKey("tenants.id", ondelete="RESTRICT"))
    name: Mapped[str] = mapped_column(sa.String(128))
    spec: Mapped[dict[str, Any]]
    state: Mapped[str] = mapped_column(sa.String(16), default=JobState.PENDING.value)
    reason: Mapped[str] = mapped_column(sa.String(1024), default="", doc="reason of the last transition")
    priority: Mapped[int] = mapped_column(default=0)
    min_gpus: Mapped[int]
    max_gpus: Mapped[int]
    cancel_requested: Mapped[bool] = mapped_column(default=False)
    idempotency_key: Mapped[str | None] = mapped_column(sa.String(128))
    request_hash: Mapped[str | None] = mapped_column(sa.String(64), doc="sha256 of the submitted spec")
    attempt: Mapped[int] = mapped_column(default=0, doc="number of the current (last) attempt; 0 = none yet")
    epoch: Mapped[int] = mapped_column(default=0, doc="fencing epoch of the current attempt")
    event_seq: Mapped[int] = mapped_column(default=0, doc="last seq of control-plane events")
    gpus_allocated: Mapped[int] = mapped_column(default=0)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow, server_default=sa.func.now())
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow, server_default=sa.func.now())
    admitted_at: Mapped[dt.datetime | None]
    started_at: Mapped[dt.datetime | None]
    finished_at: Mapped[dt.datetime | None]
    final_loss: Mapped[float | None] = mapped_column(sa.Float)
    final_step: Mapped[int | None]


class Attempt(Base):
    """One run of a job by one supervisor, fenced by ``epoch`` (unique per job)."""

    __tablename__ = "attempts"
    __table_args__ = (
        sa.CheckConstraint(_in("state", tuple(AttemptState)), name="state_valid"),
        sa.UniqueConstraint("job_id", "epoch"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(sa.ForeignKey("jobs.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(doc="1, 2, ... per job")
    epoch: Mapped[int]
    state: Mapped[str] = mapped_column(sa.String(16), default=AttemptState.STARTING.value)
    plan: Mapped[dict[str, Any] | None]
    gpus: Mapped[int] = mapped_column(default=0)
    reason: Mapped[str] = mapped_column(sa.String(1024), default="")
    supervisor: Mapped[str | None] = mapped_column(sa.String(255), doc="Ray actor name of the supervisor")
    started_at: Mapped[dt.datetime] = mapped_column(default=utcnow, server_default=sa.func.now())
    ended_at: Mapped[dt.datetime | None]
    placement: Mapped[dict[str, Any] | None] = mapped_column(
        doc="node id -> GPUs the attempt holds there: the scheduler's placement at the start, then where "
        "the runtime's gang was placed (its ``placed`` event)"
    )
    placement_group: Mapped[str | None] = mapped_column(sa.String(255), doc="name of the gang's placement group")


class Event(Base):
    """A job's event: control-plane transitions (source ``control``) and pulled runtime events.

    ``(job_id, source, seq)`` is unique so an event pulled twice is recorded once; the API pages by
    ``id`` (global, increasing).
    """

    __tablename__ = "events"
    __table_args__ = (
        sa.UniqueConstraint("job_id", "source", "seq"),
        sa.Index(None, "job_id", "id"),
        sa.Index(None, "type"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_id: Mapped[int] = mapped_column(sa.ForeignKey("jobs.id", ondelete="CASCADE"))
    epoch: Mapped[int | None] = mapped_column(doc="fencing epoch of the attempt that produced it; None: control")
    source: Mapped[str] = mapped_column(sa.String(32), default="control")
    seq: Mapped[int]
    type: Mapped[str] = mapped_column(sa.String(32))
    payload: Mapped[dict[str, Any]] = mapped_column(default=dict)
    ts: Mapped[dt.datetime] = mapped_column(default=utcnow, server_default=sa.func.now())


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (sa.UniqueConstraint("job_id", "step"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(sa.ForeignKey("jobs.id", ondelete="CASCADE"))
    epoch: Mapped[int] = mapped_column(doc="fencing epoch of the attempt that committed it")
    step: Mapped[int]
    location: Mapped[str] = mapped_column(sa.String(1024))
    layout: Mapped[dict[str, Any] | None]
    manifest_sha256: Mapped[str | None] = mapped_column(sa.String(64))
    bytes: Mapped[int | None] = mapped_column(sa.BigInteger)
    verified: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow, server_default=sa.func.now())


class Metric(Base):
    __tablename__ = "metrics"
    __table_args__ = (sa.UniqueConstraint("job_id", "step", "epoch"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_id: Mapped[int] = mapped_column(sa.ForeignKey("jobs.id", ondelete="CASCADE"))
    epoch: Mapped[int] = mapped_column(doc="fencing epoch of the attempt that measured it")
    step: Mapped[int]
    loss: Mapped[float | None] = mapped_column(sa.Float)
    tokens_per_s: Mapped[float | None] = mapped_column(sa.Float)
    ts: Mapped[dt.datetime] = mapped_column(default=utcnow, server_default=sa.func.now())
    val_loss: Mapped[float | None] = mapped_column(sa.Float, doc="validation loss (steps the job evaluated)")


class Lease(Base):
    """A named lease (the controller's leader election): ``epoch`` grows with every new holder."""

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(sa.String(255))
    epoch: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    expires_at: Mapped[dt.datetime]


class NodeDrain(Base):
    """A drained Ray node: it takes no new work, and every job on it moves off before ``deadline_at``
    (``POST /v1/cluster/nodes/{node}/drain``); undrain deletes the row."""

    __tablename__ = "node_drains"
    __table_args__ = (sa.CheckConstraint("deadline_s > 0", name="deadline_pos"),)

    node_id: Mapped[str] = mapped_column(sa.String(128), primary_key=True)
    deadline_s: Mapped[float] = mapped_column(sa.Float, doc="seconds the jobs on it were given to move off")
    requested_at: Mapped[dt.datetime] = mapped_column(default=utcnow, server_default=sa.func.now())
    deadline_at: Mapped[dt.datetime]
