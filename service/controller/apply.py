"""Apply the scheduler's decisions (and start / restart attempts) — crash-safe by ordering.

Admission of a job, in this order, each step a compare-and-set that a restarted controller can
redo or see done:

1. **persist the attempt first**: ``PENDING → ADMITTED`` with a new attempt row and epoch + 1 (one
   transaction, ``start_attempt``). A crash after this leaves an ADMITTED job whose supervisor may
   or may not exist; reconciliation finds out by name.
2. **start the supervisor** named after the attempt (``orthoplex-job-{id}-a{n}``); the name makes it
   idempotent: a second start of the same attempt finds the first actor instead of creating one.
3. ``ADMITTED → RUNNING`` (fenced on the epoch) and the attempt row to RUNNING.

A *new* attempt (the supervisor vanished) is the same, moving ``RUNNING → RECOVERING`` (or staying
ADMITTED/RECOVERING) instead of ``PENDING → ADMITTED``; the old attempt is closed as LOST in the same
transaction and its actor, should it still exist anywhere, is killed: its epoch is fenced already,
so even a zombie could write nothing.

Preempt asks the supervisor to checkpoint and stop (``preempt()``); the ``preempted`` event it then
reports moves the job ``RUNNING → PREEMPTED → PENDING`` (see ``events_pull``). Shrink/Grow ask the
supervisor to re-plan onto the new GPU count at its next step boundary (``resize(gpus)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from service.controller.cluster import cluster_view
from service.controller.cluster_snapshot import JobRow
from service.controller.context import Ctx
from service.controller.crashpoints import crash_point
from service.controller.events_pull import JobRef
from service.controller.supervisors import AttemptKey, SupervisorGone, SupervisorUnreachable
from service.db import transitions as tx
from service.db.models import Event
from service.log import get_logger
from service.scheduler.types import Admit, Decision, Grow, Preempt, Shrink, Wait
from workers.data_area import DataArea, tenant_area
from workers.runtime.contract.attempt_spec import Grant, attempt_spec
from workers.states import AttemptState, JobState

log = get_logger("service.controller.apply")


@dataclass(frozen=True)
class Applied:
    """What became of one decision this round (for logs, tests and the e2e report)."""

    kind: str
    job_id: int
    gpus: int | None
    outcome: str
    reason: str


def attempt_recovery(ctx: Ctx, job: JobRow, gpus: int) -> dict[str, Any]:
    """The job's recovery on an attempt of ``gpus`` GPUs: its choice at max_gpus (``Ctx.recoveries``,
    planned now when the job is new to this controller) fitted to the grant (whole replica groups;
    room for fewer than two re-plans from memory: ``planner.recovery_choice.for_grant``)."""
    from planner.recovery_choice import RecoveryChoice, for_grant
    from service.recovery import job_recovery

    base = ctx.recoveries.get(job.id)
    if base is None:
        base = ctx.recoveries[job.id] = job_recovery(job.spec, job.max_gpus, gpu_type=ctx.gpu_type,
                                                     gpus_per_node=ctx.gpus_per_node).to_dict()
    return for_grant(RecoveryChoice.from_dict(base), gpus).to_dict()


def supervisor_spec(ctx: Ctx, job: JobRow, gpus: int, placement: dict[str, int] | None = None,
                    recovery: dict[str, Any] | None = None) -> dict[str, Any]:
    """The runtime spec of an attempt (``workers.runtime.contract.attempt_spec``, the one translation):
    the job's stored spec, the GPUs the scheduler granted (the runtime plans within ``min_gpus..gpus``,
    on ``placement``'s nodes when given) and the job's directory, whose checkpoints every attempt
    shares so that a new attempt resumes from the newest verified checkpoint. ``recovery``: the
    attempt's recovery choice (default: :func:`attempt_recovery`). The tenant's inputs are resolved
    again in its area; an input gone since submission is a ``ValueError`` (the attempt fails)."""
    cfg = ctx.config
    area = DataArea(root=tenant_area(cfg.storage_path, job.tenant_id), shared=dict(cfg.shared_data_roots),
                    max_files=cfg.data_max_files, max_bytes=cfg.data_max_bytes)
    grant = Grant(job_id=job.id, job_dir=ctx.job_storage(job.id), gpus=gpus, min_gpus=job.min_gpus,
                  gpu_type=ctx.gpu_type, placement=placement, mlflow_uri=cfg.mlflow_tracking_uri,
                  recovery=recovery if recovery is not None else attempt_recovery(ctx, job, gpus),
                  overrides=cfg.spec_overrides)
    return attempt_spec(job.spec, area, grant)


def launch_attempt(ctx: Ctx, job: JobRow, epoch: int, gpus: int, placement: dict[str, int] | None = None,
                   recovery: dict[str, Any] | None = None) -> str:
    """Steps 2 and 3 above for the job's attempt ``job.attempt`` (already persisted)."""
    key = AttemptKey(job.id, job.attempt)
    crash_point("admit:persisted")
    try:
        spec = supervisor_spec(ctx, job, gpus, placement, recovery)  # ValueError: an input is gone (job_inputs)
        ctx.sups.start(key, spec)
    except ValueError as exc:  # the runtime refused the spec: no attempt will ever do better
        log.warning("supervisor refused the spec", extra={"job_id": job.id, "error": repr(exc)})
        with ctx.txn() as s:
            tx.transition(
                s,
                job.id,
                expected={job.state},
                new=JobState.FAILED,
                epoch=epoch,
                reason=f"supervisor could not start: {exc}"[:1000],
                commit=False,
            )
            tx.end_attempt(s, job.id, epoch=epoch, state=AttemptState.FAILED, reason=str(exc)[:1000], commit=False)
        return "failed"
    except Exception as exc:  # Ray could not create the actor now (e.g. the GCS is recovering)
        # the attempt stays persisted without a supervisor: the next round finds it gone and starts
        # another attempt (counted against max_attempts), exactly as after a crash at this point
        log.warning(
            "supervisor could not start; retried next round", extra={"job_id": job.id, "error": repr(exc)}
        )
        return "retry"
    crash_point("admit:started")
    with ctx.txn() as s:
        if job.state == JobState.ADMITTED:
            tx.transition(
                s,
                job.id,
                expected={JobState.ADMITTED},
                new=JobState.RUNNING,
                epoch=epoch,
                reason=f"supervisor {key.actor_name} started",
                commit=False,
            )
            tx.set_attempt_state(s, job.id, epoch=epoch, state=AttemptState.RUNNING, commit=False)
    return "started"


def admit(ctx: Ctx, job: JobRow, decision: Admit) -> str:
    """PENDING → ADMITTED (attempt persisted) → supervisor → RUNNING."""
    number = job.attempt + 1
    key = AttemptKey(job.id, number)
    recovery = attempt_recovery(ctx, job, decision.gpus)
    with ctx.txn() as s:
        epoch = tx.start_attempt(
            s,
            job.id,
            expected={JobState.PENDING},
            new=JobState.ADMITTED,
            expected_epoch=job.epoch,
            reason=f"admitted with {decision.gpus} GPUs: {decision.reason}"[:1000],
            gpus=decision.gpus,
            placement=dict(decision.placement),
            supervisor=key.actor_name,
            payload={"recovery": recovery},
            commit=False,
        )
    if epoch is None:
        return "lost_race"
    job.attempt, job.epoch, job.state, job.gpus_allocated = number, epoch, JobState.ADMITTED, decision.gpus
    job.placement = dict(decision.placement)
    return launch_attempt(ctx, job, epoch, decision.gpus, job.placement, recovery)


def retry_attempt(ctx: Ctx, job: JobRow, reason: str) -> str:
    """The current attempt's supervisor is gone: a new attempt, or FAILED after ``max_attempts``."""
    old = AttemptKey(job.id, job.attempt)
    if job.cancel_requested:
        _end_lost_attempt(ctx, job, old, JobState.CANCELLED, f"cancelled ({reason})", reason)
        return "cancelled"
    if job.attempt >= ctx.config.max_attempts:
        _end_lost_attempt(ctx, job, old, JobState.FAILED, f"{reason}; gave up after {job.attempt} attempts", reason)
        return "failed"
    new_state = JobState.RECOVERING if job.state in (JobState.RUNNING, JobState.RECOVERING) else job.state
    gpus = job.gpus_allocated or job.min_gpus
    recovery = attempt_recovery(ctx, job, gpus)
    with ctx.txn() as s:
        epoch = tx.start_attempt(
            s,
            job.id,
            expected={job.state},
            new=new_state,
            expected_epoch=job.epoch,
            reason=f"new attempt {job.attempt + 1}: {reason}"[:1000],
            gpus=gpus,
            placement=job.placement,  # where the GPUs are until the new gang reports its own placement
            supervisor=AttemptKey(job.id, job.attempt + 1).actor_name,
            payload={"recovery": recovery},
            commit=False,
        )
        if epoch is not None:
            tx.end_attempt(s, job.id, epoch=job.epoch, state=AttemptState.LOST, reason=reason, commit=False)
    if epoch is None:
        return "lost_race"
    ctx.sups.kill(old)  # a zombie of the old attempt is fenced already; stop it burning GPUs too
    job.attempt, job.epoch, job.state, job.gpus_allocated = job.attempt + 1, epoch, new_state, gpus
    return launch_attempt(ctx, job, epoch, gpus, _placement_to_keep(job.placement, gpus), recovery)


def _placement_to_keep(placement: dict[str, int] | None, gpus: int) -> dict[str, int] | None:
    """The recorded placement, to pin the new attempt to, when it still holds: the same number of GPUs
    and every node of it alive. Otherwise None: the runtime places the granted count itself and its
    ``placed`` event records where (a node of the old placement may be the reason for the retry)."""
    if not placement or sum(int(g) for g in placement.values()) != gpus:
        return None
    alive = {n.node_id for n in cluster_view().alive_nodes}  # none when not connected: no pin
    return dict(placement) if set(placement) <= alive else None


def preempt(ctx: Ctx, job: JobRow, decision: Preempt) -> str:
    """Ask the supervisor to checkpoint and stop; the ``preempted`` event requeues the job."""
    key = AttemptKey(job.id, job.attempt)
    if job.state != JobState.RUNNING:
        return "not_running"
    if key in ctx.preempting:
        return "already_asked"
    if not ctx.sups.tell(key, "preempt"):
        return "supervisor_gone"
    ctx.preempting.add(key)
    log.info("preempt requested", extra={"job_id": job.id, "attempt": job.attempt, "reason": decision.reason})
    return "requested"


def resize(ctx: Ctx, job: JobRow, decision: Shrink | Grow) -> str:
    """Ask the supervisor to re-plan onto ``decision.gpus`` at its next step boundary."""
    key = AttemptKey(job.id, job.attempt)
    if ctx.sups.find(key) is None:
        return "supervisor_gone"
    try:
        ctx.sups.call(key, "resize", decision.gpus, dict(decision.placement))
    except (SupervisorGone, SupervisorUnreachable) as exc:
        return f"error: {exc}"
    return "requested"


DECISION_SOURCE = "scheduler"


def record_decision(ctx: Ctx, job: JobRow, d: Decision, outcome: str) -> bool:
    """Store the scheduler's decision about ``job`` as a ``decision`` event (source ``scheduler``)
    when it differs from the last one stored, so ``GET /v1/jobs/{id}/events`` shows why a job waits,
    got N GPUs or was preempted, without a row per job per round."""
    gpus = getattr(d, "gpus", None)
    sig = (d.kind, gpus, d.reason)
    if ctx.decided.get(job.id) == sig:
        return False
    payload: dict[str, Any] = {"kind": d.kind, "reason": d.reason, "outcome": outcome}
    if gpus is not None:
        payload["gpus"] = gpus
        payload["placement"] = dict(getattr(d, "placement", {}) or {})
    with ctx.txn() as s:
        last = s.execute(
            sa.select(sa.func.max(Event.seq)).where(Event.job_id == job.id, Event.source == DECISION_SOURCE)
        ).scalar()
        res = tx.record_event(
            s,
            job.id,
            epoch=job.epoch,
            source=DECISION_SOURCE,
            seq=int(last or 0) + 1,
            type="decision",
            payload=payload,
            commit=False,
        )
        if isinstance(d, Wait):  # the job's own reason says why it waits (status, API, dashboard)
            tx.set_wait_reason(s, job.id, epoch=job.epoch, reason=d.reason, commit=False)
    if res in (tx.Recorded.WRITTEN, tx.Recorded.DUPLICATE):
        ctx.decided[job.id] = sig
    return res is tx.Recorded.WRITTEN


def apply_decisions(ctx: Ctx, jobs: dict[int, JobRow], decisions: list[Decision]) -> list[Applied]:
    """Apply each decision to the job it names (and record it); returns what happened to each."""
    out: list[Applied] = []
    for d in decisions:
        job = jobs.get(int(d.job_id))
        if job is None:
            continue
        gpus = getattr(d, "gpus", None)
        if isinstance(d, Wait):
            outcome = "waiting"
        elif isinstance(d, Admit):
            if job.state != JobState.PENDING or job.cancel_requested:
                continue
            outcome = admit(ctx, job, d)
            if outcome == "lost_race":
                continue
        elif isinstance(d, Preempt):
            outcome = preempt(ctx, job, d)
        elif isinstance(d, Shrink | Grow):
            outcome = resize(ctx, job, d)
        else:  # pragma: no cover - the Decision union is closed
            continue
        changed = record_decision(ctx, job, d, outcome)
        if isinstance(d, Wait):
            continue
        out.append(Applied(d.kind, job.id, gpus, outcome, d.reason))
        (log.info if changed else log.debug)(
            "decision applied",
            extra={"job_id": job.id, "kind": d.kind, "gpus": gpus, "outcome": outcome, "reason": d.reason},
        )
    for job_id in [j for j in ctx.decided if j not in jobs]:
        del ctx.decided[job_id]
    return out


def as_ref(job: JobRow) -> JobRef:
    """The fields ``events_pull`` needs."""
    return JobRef(job.id, job.state, job.attempt, job.epoch, job.cancel_requested, job.gpus_allocated)


def _end_lost_attempt(ctx: Ctx, job: JobRow, old: AttemptKey, new: str, job_reason: str, reason: str) -> None:
    """End a job whose supervisor vanished in terminal state ``new``: one fenced transaction for the
    job's transition and the attempt's LOST record, then kill whatever is left of the old attempt."""
    with ctx.txn() as s:
        tx.transition(s, job.id, expected={job.state}, new=new, epoch=job.epoch, reason=job_reason, commit=False)
        tx.end_attempt(s, job.id, epoch=job.epoch, state=AttemptState.LOST, reason=reason, commit=False)
    ctx.sups.kill(old)
