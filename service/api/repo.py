"""Every query the API makes about a tenant's objects, scoped by tenant in SQL.

A job of another tenant is simply not found (the route answers 404, never 403). Submissions lock
the tenant row (``FOR NO KEY UPDATE``) so the rate limit and ``max_jobs`` are exact under
concurrency, and rely on ``UNIQUE (tenant_id, idempotency_key)`` for exactly-once creation.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from service.db.models import Event, Job, Metric, Tenant, utcnow
from workers.states import NON_TERMINAL, JobState

RATE_WINDOW_S = 60.0


class LimitExceeded(Exception):
    """The tenant is over its submission rate or its job limit; retry after ``retry_after`` s."""

    def __init__(self, msg: str, retry_after: int) -> None:
        super().__init__(msg)
        self.retry_after = retry_after


def get_job(db: Session, tenant_id: int, job_id: int) -> Job | None:
    return db.scalars(sa.select(Job).where(Job.id == job_id, Job.tenant_id == tenant_id)).one_or_none()


def job_by_key(db: Session, tenant_id: int, key: str) -> Job | None:
    return db.scalars(sa.select(Job).where(Job.tenant_id == tenant_id, Job.idempotency_key == key)).one_or_none()


def list_jobs(db: Session, tenant_id: int, *, state: str | None, cursor: int | None, limit: int) -> Sequence[Job]:
    """Newest first; ``cursor`` = the last id of the previous page."""
    q = sa.select(Job).where(Job.tenant_id == tenant_id)
    if state is not None:
        q = q.where(Job.state == state)
    if cursor is not None:
        q = q.where(Job.id < cursor)
    return db.scalars(q.order_by(Job.id.desc()).limit(limit)).all()


def check_limits(db: Session, tenant: Tenant, *, lock: bool, attempts: Sequence[dt.datetime] = (),
                 jobs: bool = True) -> None:
    """Raise :class:`LimitExceeded` when the tenant may not submit now: ``attempts`` (dry runs and
    refused submissions in the window, see ``service.api.attempts``) count toward the rate like the
    jobs created; ``jobs=False`` skips the ``max_jobs`` check (a dry run creates no job)."""
    if lock:  # serialises this tenant's submissions so the counts below are exact
        db.execute(sa.select(Tenant.id).where(Tenant.id == tenant.id).with_for_update(key_share=True))
    now = utcnow()
    since = now - dt.timedelta(seconds=RATE_WINDOW_S)
    # Both counts stop at the limit (an index range scan of at most that many rows), in one round trip:
    # the cost of a submission does not grow with the tenant's history.
    window = (
        sa.select(Job.created_at)
        .where(Job.tenant_id == tenant.id, Job.created_at > since)
        .order_by(Job.created_at)
        .limit(tenant.submit_per_minute)
        .subquery()
    )
    unfinished = (
        sa.select(Job.id)
        .where(Job.tenant_id == tenant.id, Job.state.in_(sorted(NON_TERMINAL)))
        .limit(tenant.max_jobs)
        .subquery()
    )
    recent, oldest, active = db.execute(
        sa.select(
            sa.select(sa.func.count()).select_from(window).scalar_subquery(),
            sa.select(sa.func.min(window.c.created_at)).scalar_subquery(),
            sa.select(sa.func.count()).select_from(unfinished).scalar_subquery(),
        )
    ).one()
    oldest = oldest.replace(tzinfo=dt.UTC) if oldest is not None and oldest.tzinfo is None else oldest
    if attempts:
        recent += len(attempts)
        oldest = min(attempts[0], oldest) if oldest is not None else attempts[0]
    if recent >= tenant.submit_per_minute:
        wait = RATE_WINDOW_S - (now - oldest).total_seconds() if oldest is not None else RATE_WINDOW_S
        raise LimitExceeded(f"over {tenant.submit_per_minute} submissions per minute", max(1, math.ceil(wait)))
    if jobs and (active or 0) >= tenant.max_jobs:
        raise LimitExceeded(f"{tenant.max_jobs} unfinished jobs already (max_jobs)", 30)


def create_job(
    db: Session, tenant: Tenant, *, name: str, spec: dict[str, object], min_gpus: int, max_gpus: int,
    priority: int, key: str | None, request_hash: str, attempts: Sequence[dt.datetime] = (),
) -> Job:
    """Insert a PENDING job and its ``submitted`` event (the caller commits)."""
    check_limits(db, tenant, lock=True, attempts=attempts)
    now = utcnow()
    job = Job(
        tenant_id=tenant.id, name=name, spec=spec, state=JobState.PENDING, reason="submitted", priority=priority,
        min_gpus=min_gpus, max_gpus=max_gpus, idempotency_key=key, request_hash=request_hash, event_seq=1,
        created_at=now, updated_at=now,
    )
    db.add(job)
    db.flush()
    db.add(Event(job_id=job.id, epoch=None, source="control", seq=1, type="submitted",
                 payload={"state": str(JobState.PENDING), "to": str(JobState.PENDING)}, ts=now))
    return job


def attempt_recovery(db: Session, job_id: int) -> dict[str, Any] | None:
    """The recovery choice of the job's latest attempt (its ``attempt_started`` event's ``recovery``,
    written by the controller); None before the first attempt."""
    payload = db.execute(
        sa.select(Event.payload).where(Event.job_id == job_id, Event.source == "control",
                                       Event.type == "attempt_started")
        .order_by(Event.id.desc()).limit(1)
    ).scalar_one_or_none()
    recovery = (payload or {}).get("recovery")
    return dict(recovery) if isinstance(recovery, dict) else None


def list_events(db: Session, job_id: int, *, since: int, limit: int) -> Sequence[Event]:
    """Events of a job (the caller checked the tenant) with ``id > since``, oldest first."""
    q = sa.select(Event).where(Event.job_id == job_id, Event.id > since).order_by(Event.id).limit(limit)
    return db.scalars(q).all()


def list_metrics(db: Session, job_id: int, *, since_step: int, limit: int) -> Sequence[Metric]:
    q = (
        sa.select(Metric)
        .where(Metric.job_id == job_id, Metric.step > since_step)
        .order_by(Metric.step, Metric.epoch)
        .limit(limit)
    )
    return db.scalars(q).all()
