"""The job state machine and every fenced write to the job store.

Each function here is ONE transaction (it commits unless called with ``commit=False``, in which
case the caller commits, e.g. to batch many ``record_metric`` calls) and checks, in SQL, the state
it expects (compare-and-set) and, where given, the attempt's fencing epoch (``jobs.epoch``). A
writer holding an older epoch writes nothing. The names are a contract with the controller:

``TRANSITIONS`` / ``is_legal(old, new)``
    The legal edges (docs/architecture.md): ``PENDING → ADMITTED → RUNNING ⇄ RECOVERING → SUCCEEDED | FAILED |
    CANCELLED``, ``RUNNING → PREEMPTED → PENDING``, cancel from any non-terminal state. Two more
    edges let the controller undo an admission that could not be launched: ``ADMITTED → PENDING``
    (placement timed out; requeue) and ``ADMITTED → FAILED`` (the supervisor could not start).
``transition(session, job_id, *, expected, new, epoch, reason, payload=None, fields=None) -> bool``
    ``UPDATE jobs SET state=new ... WHERE id=:id AND state=<current, one of expected> [AND
    epoch=:epoch]`` plus a ``transition`` event (source ``control``) in the same transaction.
    Returns False (and writes nothing) when the job is missing, in another state, or fenced off.
    Raises :class:`IllegalTransition` when some state in ``expected`` may not go to ``new``.
    A job with ``cancel_requested`` never goes back to PENDING (a preemption or a requeue racing a
    cancel): it becomes CANCELLED instead, and the call returns True.
    ``fields`` may set ``gpus_allocated``, ``final_loss``, ``final_step``, ``cancel_requested``.
    Timestamps are kept: ``admitted_at`` (→ADMITTED), ``started_at`` (first →RUNNING),
    ``finished_at`` (→terminal); ``gpus_allocated`` drops to 0 on →PENDING and →terminal.
``start_attempt(session, job_id, *, expected, new, expected_epoch, reason, plan, gpus, placement, supervisor)``
    -> the new epoch or None. Bumps ``jobs.epoch`` and ``jobs.attempt`` by one (compare-and-set on
    state and on the current epoch), moves the job to ``new`` (a legal edge, or staying in the same
    state, e.g. RECOVERING → RECOVERING with a fresh attempt) and inserts the ``attempts`` row
    (state ``STARTING``), all in one transaction. Every older attempt is fenced from then on.
``end_attempt(session, job_id, *, epoch, state, reason) -> bool``
    Closes an attempt row (sets its state and ``ended_at``) once.
``set_attempt_state(session, job_id, *, epoch, state, plan=None, reason="") -> bool``
    Updates a live attempt (e.g. STARTING → RUNNING, a new plan after a re-plan); fenced.
``set_allocation(session, job_id, *, epoch, gpus, placement=None, placement_group=None) -> bool``
    The GPUs the live attempt holds (``jobs.gpus_allocated``) and where (``attempts.placement``:
    node id -> GPUs, and its placement group); fenced.
``request_cancel(session, job_id, *, tenant_id=None, reason) -> CancelOutcome``
    PENDING/PREEMPTED jobs become CANCELLED at once; ADMITTED/RUNNING/RECOVERING get
    ``cancel_requested=true`` (the controller stops the supervisor, then transitions); terminal
    jobs answer ``TERMINAL``; a job of another tenant is ``MISSING``.
``set_wait_reason(session, job_id, *, epoch, reason) -> bool``
    a PENDING job's ``reason`` becomes why it still waits (the scheduler's latest ``Wait``).
``record_event(session, job_id, *, epoch, source, seq, type, payload, ts=None) -> Recorded``
``record_checkpoint(session, job_id, *, epoch, step, location, layout=None, verified=False,
manifest_sha256=None, nbytes=None) -> Recorded``
``record_metric(session, job_id, *, epoch, step, loss, tokens_per_s=None, ts=None, val_loss=None) -> Recorded``
    Idempotent inserts (``ON CONFLICT DO NOTHING`` on the unique keys ``(job_id, source, seq)``,
    ``(job_id, step)``, ``(job_id, step, attempt)``), fenced: written only while ``epoch`` is the
    job's current epoch (the job row is read ``FOR SHARE``, so a concurrent epoch bump waits).
    ``Recorded`` is WRITTEN, DUPLICATE, STALE (fenced off: the caller must stop) or MISSING;
    ``bool(result)`` is True only for WRITTEN.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Iterable, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from service.db.models import Attempt, Checkpoint, Event, Job, Metric, utcnow
from workers.states import ACTIVE, NON_TERMINAL, TERMINAL, TRANSITIONS, AttemptState, JobState

_SETTABLE_FIELDS = frozenset({"gpus_allocated", "final_loss", "final_step", "cancel_requested"})
_jobs = Job.__table__


class IllegalTransition(ValueError):
    """A transition the state machine does not allow (a programming error, not a lost race)."""


class Recorded(enum.Enum):
    """Outcome of a fenced, idempotent insert."""

    WRITTEN = "written"
    DUPLICATE = "duplicate"
    STALE = "stale"
    MISSING = "missing"

    def __bool__(self) -> bool:
        return self is Recorded.WRITTEN


class CancelOutcome(enum.Enum):
    CANCELLED = "cancelled"
    REQUESTED = "requested"
    ALREADY_REQUESTED = "already_requested"
    TERMINAL = "terminal"
    MISSING = "missing"


def is_legal(old: str, new: str) -> bool:
    """Whether the state machine allows ``old → new``."""
    return new in TRANSITIONS.get(old, frozenset())


def _finish(session: Session, commit: bool) -> None:
    if commit:
        session.commit()


def _expire_job(session: Session, job_id: int) -> None:
    for obj in list(session.identity_map.values()):
        if isinstance(obj, Job) and obj.id == job_id:
            session.expire(obj)


def _lock_job(session: Session, job_id: int, *, share: bool = False, tenant_id: int | None = None) -> Any:
    q = sa.select(_jobs.c.state, _jobs.c.epoch, _jobs.c.cancel_requested).where(_jobs.c.id == job_id)
    if tenant_id is not None:
        q = q.where(_jobs.c.tenant_id == tenant_id)
    return session.execute(q.with_for_update(read=share)).one_or_none()


def _bump(session: Session, job_id: int, where: list[Any], values: dict[str, Any]) -> int | None:
    """``UPDATE jobs SET ..., event_seq = event_seq + 1 WHERE id AND <where> RETURNING event_seq``."""
    stmt = (
        _jobs.update()
        .where(_jobs.c.id == job_id, *where)
        .values(event_seq=_jobs.c.event_seq + 1, updated_at=utcnow(), **values)
        .returning(_jobs.c.event_seq)
    )
    seq = session.execute(stmt).scalar_one_or_none()
    _expire_job(session, job_id)
    return seq


def _event(session: Session, job_id: int, seq: int, epoch: int, type_: str, payload: dict[str, Any]) -> None:
    session.execute(
        sa.insert(Event).values(
            job_id=job_id, epoch=epoch or None, source="control", seq=seq, type=type_, payload=payload, ts=utcnow()
        )
    )


def _transition_values(new: str, fields: Mapping[str, Any] | None) -> dict[str, Any]:
    extra = dict(fields or {})
    unknown = set(extra) - _SETTABLE_FIELDS
    if unknown:
        raise ValueError(f"transition cannot set {sorted(unknown)}; allowed: {sorted(_SETTABLE_FIELDS)}")
    now = utcnow()
    values: dict[str, Any] = {"state": new}
    if new == JobState.ADMITTED:
        values["admitted_at"] = now
    if new == JobState.RUNNING:
        values["started_at"] = sa.func.coalesce(_jobs.c.started_at, now)
    if new in TERMINAL:
        values["finished_at"] = now
    if new in TERMINAL or new == JobState.PENDING:
        values["gpus_allocated"] = 0
    values.update(extra)
    return values


def _check_legal(expected: Iterable[str], new: str) -> frozenset[str]:
    exp = frozenset(expected)
    if new not in JobState.__members__:
        raise IllegalTransition(f"unknown state {new!r}")
    bad = sorted(s for s in exp if not is_legal(s, new))
    if not exp or bad:
        raise IllegalTransition(f"illegal transition {bad or '{}'} -> {new}")
    return exp


def transition(
    session: Session,
    job_id: int,
    *,
    expected: Iterable[str],
    new: str,
    epoch: int | None,
    reason: str,
    payload: Mapping[str, Any] | None = None,
    fields: Mapping[str, Any] | None = None,
    commit: bool = True,
) -> bool:
    """Compare-and-set the job's state (see the module docstring); True when it moved."""
    exp = _check_legal(expected, new)
    row = _lock_job(session, job_id)
    if row is None or row.state not in exp or (epoch is not None and row.epoch != epoch):
        _finish(session, commit)
        return False
    if new == JobState.PENDING and row.cancel_requested:
        # the cancel wins a race with a preemption or a requeue: the job never goes back to the queue
        new, reason = JobState.CANCELLED, f"cancelled by user (requested before: {reason})"
    values = _transition_values(new, fields)
    where = [_jobs.c.state == row.state]
    if epoch is not None:
        where.append(_jobs.c.epoch == epoch)
    seq = _bump(session, job_id, where, {**values, "reason": reason[:1024]})
    if seq is None:
        _finish(session, commit)
        return False
    body = {"from": row.state, "to": new, "reason": reason, **dict(payload or {})}
    _event(session, job_id, seq, row.epoch, "transition", body)
    _finish(session, commit)
    return True


def start_attempt(
    session: Session,
    job_id: int,
    *,
    expected: Iterable[str],
    new: str,
    expected_epoch: int,
    reason: str,
    plan: dict[str, Any] | None = None,
    gpus: int = 0,
    placement: dict[str, int] | None = None,
    supervisor: str | None = None,
    payload: Mapping[str, Any] | None = None,
    commit: bool = True,
) -> int | None:
    """Open a new attempt with epoch ``expected_epoch + 1``; returns it, or None if the CAS failed.
    ``placement``: node id -> GPUs the scheduler granted (where the attempt's GPUs are until its
    gang reports where it landed, see ``set_allocation``). ``payload``: more of the attempt's
    ``attempt_started`` event (the controller's ``recovery`` choice for it)."""
    exp = frozenset(expected)
    if not exp <= NON_TERMINAL or new not in NON_TERMINAL or any(s != new and not is_legal(s, new) for s in exp):
        raise IllegalTransition(f"cannot start an attempt moving {sorted(exp)} -> {new}")
    row = _lock_job(session, job_id)
    if row is None or row.state not in exp or row.epoch != expected_epoch:
        _finish(session, commit)
        return None
    values = _transition_values(new, {"gpus_allocated": gpus} if gpus else None)
    seq = _bump(
        session,
        job_id,
        [_jobs.c.state == row.state, _jobs.c.epoch == expected_epoch],
        {**values, "epoch": _jobs.c.epoch + 1, "attempt": _jobs.c.attempt + 1, "reason": reason[:1024]},
    )
    if seq is None:
        _finish(session, commit)
        return None
    number, epoch = session.execute(sa.select(_jobs.c.attempt, _jobs.c.epoch).where(_jobs.c.id == job_id)).one()
    session.execute(
        sa.insert(Attempt).values(
            job_id=job_id, number=number, epoch=epoch, state=AttemptState.STARTING, plan=plan, gpus=gpus,
            placement=dict(placement) if placement else None, reason=reason[:1024], supervisor=supervisor,
            started_at=utcnow(),
        )
    )
    body = {"from": row.state, "to": new, "reason": reason, "attempt": number, "epoch": epoch, "gpus": gpus,
            **dict(payload or {})}
    _event(session, job_id, seq, epoch, "attempt_started", body)
    _finish(session, commit)
    return int(epoch)


def set_attempt_state(
    session: Session,
    job_id: int,
    *,
    epoch: int,
    state: str,
    plan: dict[str, Any] | None = None,
    reason: str = "",
    commit: bool = True,
) -> bool:
    """Update the live attempt (state, and the plan when given); fenced on the job's epoch."""
    row = _lock_job(session, job_id, share=True)
    if row is None or row.epoch != epoch:
        _finish(session, commit)
        return False
    values: dict[str, Any] = {"state": state}
    if plan is not None:
        values["plan"] = plan
    if reason:
        values["reason"] = reason[:1024]
    res = session.execute(
        sa.update(Attempt)
        .where(Attempt.job_id == job_id, Attempt.epoch == epoch, Attempt.ended_at.is_(None))
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    _finish(session, commit)
    return res.rowcount == 1


def set_allocation(
    session: Session,
    job_id: int,
    *,
    epoch: int,
    gpus: int,
    placement: dict[str, int] | None = None,
    placement_group: str | None = None,
    commit: bool = True,
) -> bool:
    """Record the GPUs the live attempt holds now (its gang was placed: at start, after a re-plan or a
    resize) and, when given, on which nodes (``placement``) in which placement group; fenced on the
    epoch and only while the job holds GPUs (a state change is not implied)."""
    res = session.execute(
        sa.update(Job)
        .where(Job.id == job_id, Job.epoch == epoch, Job.state.in_(sorted(ACTIVE)))
        .values(gpus_allocated=int(gpus))
        .execution_options(synchronize_session=False)
    )
    if res.rowcount == 1:
        values: dict[str, Any] = {"gpus": int(gpus)}
        if placement is not None:
            values["placement"] = {str(n): int(g) for n, g in placement.items()}
        if placement_group is not None:
            values["placement_group"] = placement_group[:255]
        session.execute(
            sa.update(Attempt)
            .where(Attempt.job_id == job_id, Attempt.epoch == epoch, Attempt.ended_at.is_(None))
            .values(**values)
            .execution_options(synchronize_session=False)
        )
        _expire_job(session, job_id)
    _finish(session, commit)
    return res.rowcount == 1


def end_attempt(
    session: Session, job_id: int, *, epoch: int, state: str, reason: str = "", commit: bool = True
) -> bool:
    """Close the attempt ``epoch`` of the job once (later calls change nothing and return False)."""
    res = session.execute(
        sa.update(Attempt)
        .where(Attempt.job_id == job_id, Attempt.epoch == epoch, Attempt.ended_at.is_(None))
        .values(state=state, reason=reason[:1024], ended_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    _finish(session, commit)
    return res.rowcount == 1


def request_cancel(
    session: Session, job_id: int, *, tenant_id: int | None = None, reason: str = "cancelled by user",
    commit: bool = True,
) -> CancelOutcome:
    """Cancel a job (see the module docstring); ``tenant_id`` scopes it to one tenant."""
    row = _lock_job(session, job_id, tenant_id=tenant_id)
    if row is None:
        _finish(session, commit)
        return CancelOutcome.MISSING
    if row.state in TERMINAL:
        _finish(session, commit)
        return CancelOutcome.TERMINAL
    if row.state in (JobState.PENDING, JobState.PREEMPTED):
        ok = transition(session, job_id, expected={row.state}, new=JobState.CANCELLED, epoch=None, reason=reason,
                        commit=commit)
        return CancelOutcome.CANCELLED if ok else CancelOutcome.MISSING
    if row.cancel_requested:
        _finish(session, commit)
        return CancelOutcome.ALREADY_REQUESTED
    seq = _bump(session, job_id, [_jobs.c.state == row.state], {"cancel_requested": True})
    if seq is None:  # pragma: no cover - the row is locked
        _finish(session, commit)
        return CancelOutcome.MISSING
    _event(session, job_id, seq, row.epoch, "cancel_requested", {"state": row.state, "reason": reason})
    _finish(session, commit)
    return CancelOutcome.REQUESTED


def _insert_ignore(session: Session, model: type[Any], values: dict[str, Any], keys: list[str]) -> bool:
    dialect = session.get_bind().dialect.name
    table = model.__table__
    if dialect == "postgresql":
        stmt: Any = postgresql.insert(table).values(**values).on_conflict_do_nothing(index_elements=keys)
    elif dialect == "sqlite":
        stmt = sqlite.insert(table).values(**values).on_conflict_do_nothing(index_elements=keys)
    else:  # pragma: no cover - only the two supported dialects
        raise RuntimeError(f"unsupported database dialect {dialect!r}: Orthoplex runs on PostgreSQL and SQLite")
    # rowcount is -1 with RETURNING on psycopg; a returned id means the row is new
    return session.execute(stmt.returning(table.c.id)).scalar_one_or_none() is not None


def _fenced_insert(
    session: Session, job_id: int, epoch: int, model: type[Any], values: dict[str, Any], keys: list[str],
    commit: bool,
) -> Recorded:
    row = _lock_job(session, job_id, share=True)
    if row is None:
        result = Recorded.MISSING
    elif row.epoch != epoch:
        result = Recorded.STALE
    else:
        wrote = _insert_ignore(session, model, {"job_id": job_id, **values}, keys)
        result = Recorded.WRITTEN if wrote else Recorded.DUPLICATE
    _finish(session, commit)
    return result


def record_event(
    session: Session,
    job_id: int,
    *,
    epoch: int,
    source: str,
    seq: int,
    type: str,
    payload: Mapping[str, Any] | None = None,
    ts: dt.datetime | None = None,
    commit: bool = True,
) -> Recorded:
    """Record a runtime event once (unique ``(job_id, source, seq)``); fenced on ``epoch``."""
    values = {"epoch": epoch, "source": source[:32], "seq": seq, "type": type[:32],
              "payload": dict(payload or {}), "ts": ts or utcnow()}
    return _fenced_insert(session, job_id, epoch, Event, values, ["job_id", "source", "seq"], commit)


def record_checkpoint(
    session: Session,
    job_id: int,
    *,
    epoch: int,
    step: int,
    location: str,
    layout: dict[str, Any] | None = None,
    verified: bool = False,
    manifest_sha256: str | None = None,
    nbytes: int | None = None,
    commit: bool = True,
) -> Recorded:
    """Record a committed checkpoint once per step (unique ``(job_id, step)``); fenced on ``epoch``."""
    values = {"epoch": epoch, "step": step, "location": location, "layout": layout, "verified": verified,
              "manifest_sha256": manifest_sha256, "bytes": nbytes, "created_at": utcnow()}
    return _fenced_insert(session, job_id, epoch, Checkpoint, values, ["job_id", "step"], commit)


def record_metric(
    session: Session,
    job_id: int,
    *,
    epoch: int,
    step: int,
    loss: float | None,
    tokens_per_s: float | None = None,
    ts: dt.datetime | None = None,
    commit: bool = True,
    val_loss: float | None = None,
) -> Recorded:
    """Record a step's loss, throughput (and validation loss, on an eval step) once per attempt
    (unique ``(job_id, step, epoch)``)."""
    values = {"epoch": epoch, "step": step, "loss": loss, "tokens_per_s": tokens_per_s, "val_loss": val_loss,
              "ts": ts or utcnow()}
    return _fenced_insert(session, job_id, epoch, Metric, values, ["job_id", "step", "epoch"], commit)


def set_wait_reason(session: Session, job_id: int, *, epoch: int, reason: str, commit: bool = True) -> bool:
    """Record why a PENDING job still waits (the scheduler's latest ``Wait`` reason) in its ``reason``,
    so ``status``, the API and the dashboard say it without reading events. Fenced like a
    transition (the caller's epoch must still own the job); leaves other states alone. True when
    the row changed."""
    stmt = (
        _jobs.update()
        .where(_jobs.c.id == job_id, _jobs.c.state == JobState.PENDING, _jobs.c.epoch == epoch,
               _jobs.c.reason != reason[:1024])
        .values(reason=reason[:1024], updated_at=utcnow())
    )
    changed = session.execute(stmt).rowcount > 0
    _expire_job(session, job_id)
    _finish(session, commit)
    return changed
