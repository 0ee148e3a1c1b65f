"""Pull a supervisor's events and store them, exactly once, with the job states they imply.

For one attempt: ask ``events(since)`` where ``since`` is the last runtime ``seq`` already stored
for that attempt (read from the ``events`` table after a restart, so a crashed controller resumes
where the database says, not where its memory said). Then, in **one** lease-guarded transaction:

* every event is recorded (unique ``(job_id, source, seq)``: a batch pulled twice is stored once),
* ``step`` events become metrics, ``checkpoint`` events become checkpoint rows (both idempotent),
* the state they imply is applied by compare-and-set with the attempt's epoch::

      node_lost | rank_failed | hang      RUNNING    → RECOVERING
      resumed | step (while recovering)    RECOVERING → RUNNING
      placed | started | step | ...        ADMITTED   → RUNNING (if not recorded yet)
      finished                             → SUCCEEDED (final loss and step kept)
      failed                               → FAILED
      cancelled                            → CANCELLED
      preempted                            RUNNING → PREEMPTED → PENDING
      placed (any state holding GPUs)      gpus_allocated = the new gang's size, and the attempt row's
                                           placement (GPUs per node) and placement group
      placed (a replica job's last group   gpus_allocated and placement = every group's (job_placement)
        at a start)
      replica_dropped | replica_joined     gpus_allocated = job_gpus, placement = job_placement

Events and the transitions they cause commit together, so a crash between them cannot leave an
event stored whose transition is lost. Every write is fenced on the attempt's epoch: once a newer
attempt exists, an old attempt's events are refused (``STALE``) and nothing of it is written.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from service.controller.context import Ctx
from service.controller.crashpoints import crash_point
from service.controller.supervisors import AttemptKey
from service.db import transitions as tx
from service.db.models import Event
from service.log import get_logger
from workers.runtime.contract import events as ev
from workers.states import TERMINAL, AttemptState, JobState

log = get_logger("service.controller.events")

def source_of(attempt: int) -> str:
    """The ``events.source`` of a runtime event of attempt number ``attempt``."""
    return f"runtime:a{attempt}"


@dataclass
class JobRef:
    """The fields of a job row the controller acts on (read in the same round)."""

    id: int
    state: str
    attempt: int
    epoch: int
    cancel_requested: bool = False
    gpus_allocated: int = 0

    @property
    def key(self) -> AttemptKey:
        return AttemptKey(self.id, self.attempt)


@dataclass
class PullResult:
    stored: int = 0
    final: str | None = None  # the terminal/preempted outcome this batch reached, if any
    stale: bool = False


def load_cursor(session: Session, job_id: int, attempt: int) -> int:
    """The last runtime seq stored for this attempt (0 when none)."""
    q = sa.select(sa.func.max(Event.seq)).where(Event.job_id == job_id, Event.source == source_of(attempt))
    return int(session.execute(q).scalar() or 0)


def _payload(event: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in event.items() if k not in ("seq", "ts", "type")}


def _move(s: Session, job: JobRef, new: str, reason: str, **fields: Any) -> bool:
    """CAS the job from its current state to ``new`` with the attempt's epoch (if legal)."""
    if not tx.is_legal(job.state, new):
        return False
    ok = tx.transition(
        s,
        job.id,
        expected={job.state},
        new=new,
        epoch=job.epoch,
        reason=reason,
        fields=fields or None,
        commit=False,
    )
    if ok:
        job.state = new
    return ok


def apply_event(s: Session, job: JobRef, event: ev.Event) -> str | None:
    """The state change one event implies (already written in ``s``); returns a final outcome."""
    why = event.reason or event.type
    if isinstance(event, ev.FAILURES) and job.state == JobState.RUNNING:
        _move(s, job, JobState.RECOVERING, f"{event.type}: {why}")
        tx.set_attempt_state(s, job.id, epoch=job.epoch, state=AttemptState.RECOVERING, reason=why, commit=False)
    elif (isinstance(event, ev.PROGRESS) and job.state == JobState.ADMITTED) or (
        isinstance(event, ev.RESUMING) and job.state == JobState.RECOVERING
    ):
        if _move(s, job, JobState.RUNNING, f"{event.type}: training goes on (attempt {job.attempt})"):
            tx.set_attempt_state(s, job.id, epoch=job.epoch, state=AttemptState.RUNNING, commit=False)
    elif isinstance(event, ev.PlanChosen | ev.Replanned) and (plan := event.in_force()) is not None:
        tx.set_attempt_state(
            s, job.id, epoch=job.epoch, state=_attempt_state(job.state), plan=plan.to_dict(), commit=False
        )
    elif isinstance(event, ev.ENDINGS):
        return _finalize(s, job, event)
    # "placed": the gang's size after a start, a re-plan or a resize is what the job holds from now on;
    # one replica group's placement is not the job's (the grant, every group's GPUs, stays counted)
    if isinstance(event, ev.Placed) and event.gpus > 0 and event.group is None and tx.set_allocation(
        s, job.id, epoch=job.epoch, gpus=event.gpus, placement=event.gpus_per_node,
        placement_group=event.placement_group, commit=False,
    ):
        job.gpus_allocated = event.gpus
    # ... but where its groups landed is (the last group's event at a start carries every group's):
    # the scheduler reads a job's GPUs per node from the placement, not from the grant it proposed
    elif isinstance(event, ev.Placed) and event.job_placement and tx.set_allocation(
        s, job.id, epoch=job.epoch, gpus=sum(event.job_placement.values()), placement=event.job_placement,
        commit=False,
    ):
        job.gpus_allocated = sum(event.job_placement.values())
    # a replica job's groups leaving or joining: every group it wants after the event (a shrink gives
    # the dropped groups' GPUs back to the scheduler, a grow's groups count once they joined), and
    # where the live and starting groups are
    elif isinstance(event, ev.ReplicaDropped | ev.ReplicaJoined) and event.job_gpus and tx.set_allocation(
        s, job.id, epoch=job.epoch, gpus=event.job_gpus, placement=event.job_placement, commit=False,
    ):
        job.gpus_allocated = event.job_gpus
    return None


def _attempt_state(job_state: str) -> str:
    return AttemptState.RECOVERING if job_state == JobState.RECOVERING else AttemptState.RUNNING


def _finalize(s: Session, job: JobRef, event: ev.Event) -> str | None:
    target = str(event.outcome)  # type: ignore[attr-defined]  # every ENDINGS class has one
    kind = event.type
    why = event.reason or kind
    if job.state == JobState.ADMITTED and target != JobState.CANCELLED:
        _move(s, job, JobState.RUNNING, f"{kind} reported before the admission was confirmed")
    if target == JobState.PREEMPTED:
        if job.state == JobState.RECOVERING:
            _move(s, job, JobState.RUNNING, "preempted while recovering")
        if not _move(s, job, JobState.PREEMPTED, f"preempted: {why}"):
            return None
        _move(s, job, JobState.PENDING, "requeued after preemption")
        tx.end_attempt(s, job.id, epoch=job.epoch, state=AttemptState.PREEMPTED, reason=why, commit=False)
        return JobState.PREEMPTED
    fields: dict[str, Any] = {}
    if isinstance(event, ev.Finished):
        fields["final_step"] = event.final_step
        if event.final_loss is not None:
            fields["final_loss"] = event.final_loss
    if not _move(s, job, target, f"{kind}: {why}", **fields):
        return None
    tx.end_attempt(s, job.id, epoch=job.epoch, state=target, reason=why, commit=False)
    return target


def _record(s: Session, job: JobRef, event: ev.Event) -> tx.Recorded:
    res = tx.record_event(
        s,
        job.id,
        epoch=job.epoch,
        source=source_of(job.attempt),
        seq=event.seq,
        type=event.type,
        payload=_payload(event.to_dict()),
        ts=dt.datetime.fromtimestamp(event.ts, dt.UTC),
        commit=False,
    )
    if res is not tx.Recorded.WRITTEN:
        return res
    if isinstance(event, ev.StepDone):
        tx.record_metric(
            s,
            job.id,
            epoch=job.epoch,
            step=event.step,
            loss=event.loss,
            tokens_per_s=event.tokens_per_s,
            val_loss=event.val_loss,
            ts=dt.datetime.fromtimestamp(event.ts, dt.UTC),
            commit=False,
        )
    elif isinstance(event, ev.CheckpointSaved):
        tx.record_checkpoint(
            s,
            job.id,
            epoch=job.epoch,
            step=event.step,
            location=event.path,
            layout=None,
            verified=True,  # the runtime reports a checkpoint only once it is committed and verified
            manifest_sha256=None,
            nbytes=event.bytes,
            commit=False,
        )
    return res


def store_events(ctx: Ctx, job: JobRef, events: list[dict[str, Any]]) -> PullResult:
    """Store a batch for ``job``'s current attempt and apply its transitions, in one transaction.

    ``events`` are in wire form; each is read back into its typed class first, so a malformed
    event (a contract break between runtime and service) raises ``ValueError`` before anything of
    the batch is written."""
    typed = [ev.event_from_dict(e) for e in events]
    out = PullResult()
    if not events:
        return out
    with ctx.txn() as s:
        last = ctx.cursors.get(job.key, 0)
        for event in typed:
            res = _record(s, job, event)
            if res is tx.Recorded.STALE or res is tx.Recorded.MISSING:
                out.stale = True
                break
            last = max(last, event.seq)
            if res is tx.Recorded.WRITTEN:
                out.stored += 1
                final = apply_event(s, job, event)
                if final is not None:
                    out.final = final
            if job.state in TERMINAL or job.state == JobState.PENDING:
                break
    if not out.stale:
        ctx.cursors[job.key] = last
    return out


def pull(ctx: Ctx, job: JobRef) -> PullResult:
    """Pull new events of ``job``'s current attempt and store them (raises SupervisorGone/Unreachable)."""
    key = job.key
    if key not in ctx.cursors:
        with ctx.read() as s:
            ctx.cursors[key] = load_cursor(s, job.id, job.attempt)
    since = ctx.cursors[key]
    events = [e for e in ctx.sups.events(key, since) if int(e["seq"]) > since]
    if events:
        crash_point("events:pulled")
    try:
        result = store_events(ctx, job, events)
    except ValueError as exc:  # the runtime broke the event contract: nothing stored, loudly, every round
        log.error("malformed runtime event; batch not stored", extra={"job_id": job.id, "error": str(exc)})
        return PullResult()
    if result.stored:
        log.debug("events stored", extra={"job_id": job.id, "attempt": job.attempt, "n": result.stored})
    return result
