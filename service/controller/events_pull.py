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
      placed (any state holding GPUs)      gpus_allocated = the new gang's size (re-plan, resize)

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
from workers.states import TERMINAL

log = get_logger("service.controller.events")

FAILURE_EVENTS = frozenset({"node_lost", "rank_failed", "hang"})
#: events that show an admitted attempt is under way (ADMITTED → RUNNING)
PROGRESS_EVENTS = frozenset({"step", "resumed", "started", "placed", "ranks_mapped"})
#: events that end a recovery: training resumed (a new attempt has no ``resumed``: its first step)
RESUMED_EVENTS = frozenset({"step", "resumed"})
FINAL_EVENTS = {
    "finished": "SUCCEEDED",
    "failed": "FAILED",
    "cancelled": "CANCELLED",
    "preempted": "PREEMPTED",
}


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


def _ts(event: dict[str, Any]) -> dt.datetime | None:
    ts = event.get("ts")
    if isinstance(ts, int | float):
        return dt.datetime.fromtimestamp(float(ts), dt.UTC)
    return None


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


def apply_event(s: Session, job: JobRef, event: dict[str, Any]) -> str | None:
    """The state change one event implies (already written in ``s``); returns a final outcome."""
    kind = event.get("type", "")
    why = str(event.get("reason") or kind)
    if kind in FAILURE_EVENTS and job.state == "RUNNING":
        _move(s, job, "RECOVERING", f"{kind}: {why}")
        tx.set_attempt_state(s, job.id, epoch=job.epoch, state="RECOVERING", reason=why, commit=False)
    elif (kind in PROGRESS_EVENTS and job.state == "ADMITTED") or (
        kind in RESUMED_EVENTS and job.state == "RECOVERING"
    ):
        if _move(s, job, "RUNNING", f"{kind}: training goes on (attempt {job.attempt})"):
            tx.set_attempt_state(s, job.id, epoch=job.epoch, state="RUNNING", commit=False)
    elif kind in ("plan", "replan") and _plan_of(event) is not None:
        tx.set_attempt_state(
            s, job.id, epoch=job.epoch, state=_attempt_state(job.state), plan=_plan_of(event), commit=False
        )
    elif kind in FINAL_EVENTS:
        return _finalize(s, job, kind, event)
    gpus = event.get("gpus")
    # "placed": the gang's size after a start, a re-plan or a resize is what the job holds from now on
    placed = kind == "placed" and isinstance(gpus, int) and gpus > 0
    if placed and tx.set_allocation(s, job.id, epoch=job.epoch, gpus=int(gpus), commit=False):
        job.gpus_allocated = int(gpus)
    return None


def _plan_of(event: dict[str, Any]) -> dict[str, Any] | None:
    """The plan an attempt now runs, from a ``plan`` event or a ``replan`` that switched layout."""
    if event.get("type") == "plan" and isinstance(event.get("layout"), dict):
        keys = ("layout", "short", "num_gpus", "nodes", "predicted_tokens_per_s", "predicted_step_time_s")
        return {k: event[k] for k in keys if k in event}
    if (
        event.get("type") == "replan"
        and event.get("decision") != "keep"
        and isinstance(event.get("new"), dict)
    ):
        return {
            "layout": event["new"],
            "short": event.get("new_short"),
            "nodes": event.get("nodes"),
            "predicted_tokens_per_s": event.get("new_tokens_per_s"),
        }
    return None


def _attempt_state(job_state: str) -> str:
    return "RECOVERING" if job_state == "RECOVERING" else "RUNNING"


def _finalize(s: Session, job: JobRef, kind: str, event: dict[str, Any]) -> str | None:
    target = FINAL_EVENTS[kind]
    why = str(event.get("reason") or kind)
    if job.state == "ADMITTED" and target != "CANCELLED":
        _move(s, job, "RUNNING", f"{kind} reported before the admission was confirmed")
    if target == "PREEMPTED":
        if job.state == "RECOVERING":
            _move(s, job, "RUNNING", "preempted while recovering")
        if not _move(s, job, "PREEMPTED", f"preempted: {why}"):
            return None
        _move(s, job, "PENDING", "requeued after preemption")
        tx.end_attempt(s, job.id, epoch=job.epoch, state="PREEMPTED", reason=why, commit=False)
        return "PREEMPTED"
    fields: dict[str, Any] = {}
    if target == "SUCCEEDED":
        if event.get("final_loss", event.get("loss")) is not None:
            fields["final_loss"] = float(event.get("final_loss", event.get("loss")))
        step = event.get("final_step", event.get("step", event.get("steps")))
        if step is not None:
            fields["final_step"] = int(step)
    if not _move(s, job, target, f"{kind}: {why}", **fields):
        return None
    tx.end_attempt(s, job.id, epoch=job.epoch, state=target, reason=why, commit=False)
    return target


def _record(s: Session, job: JobRef, event: dict[str, Any]) -> tx.Recorded:
    seq = int(event["seq"])
    res = tx.record_event(
        s,
        job.id,
        epoch=job.epoch,
        source=source_of(job.attempt),
        seq=seq,
        type=str(event.get("type", "?")),
        payload=_payload(event),
        ts=_ts(event),
        commit=False,
    )
    if res is not tx.Recorded.WRITTEN:
        return res
    kind = event.get("type")
    if kind == "step" and event.get("step") is not None:
        loss = event.get("loss")
        tps = event.get("tokens_per_s")
        tx.record_metric(
            s,
            job.id,
            epoch=job.epoch,
            step=int(event["step"]),
            loss=None if loss is None else float(loss),
            tokens_per_s=None if tps is None else float(tps),
            ts=_ts(event),
            commit=False,
        )
    elif kind == "checkpoint" and event.get("step") is not None:
        tx.record_checkpoint(
            s,
            job.id,
            epoch=job.epoch,
            step=int(event["step"]),
            location=str(event.get("path") or event.get("location") or ""),
            layout=event.get("layout") if isinstance(event.get("layout"), dict) else None,
            verified=bool(event.get("verified", True)),
            manifest_sha256=event.get("manifest_sha256"),
            nbytes=int(event["bytes"]) if event.get("bytes") is not None else None,
            commit=False,
        )
    return res


def store_events(ctx: Ctx, job: JobRef, events: list[dict[str, Any]]) -> PullResult:
    """Store a batch for ``job``'s current attempt and apply its transitions, in one transaction."""
    out = PullResult()
    if not events:
        return out
    with ctx.txn() as s:
        last = ctx.cursors.get(job.key, 0)
        for event in events:
            res = _record(s, job, event)
            if res is tx.Recorded.STALE or res is tx.Recorded.MISSING:
                out.stale = True
                break
            last = max(last, int(event["seq"]))
            if res is tx.Recorded.WRITTEN:
                out.stored += 1
                final = apply_event(s, job, event)
                if final is not None:
                    out.final = final
            if job.state in TERMINAL or job.state == "PENDING":
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
    result = store_events(ctx, job, events)
    if result.stored:
        log.debug("events stored", extra={"job_id": job.id, "attempt": job.attempt, "n": result.stored})
    return result
