"""Reconciliation: what a controller does when it becomes the leader (first start or takeover).

It trusts nothing it may have remembered and asks the two sources of truth: the job store for the
jobs that should have a supervisor (ADMITTED, RUNNING, RECOVERING) and their current attempt, and
Ray for the supervisor actor named after that attempt (``find_supervisor``):

* **alive** → reattach: keep pulling its events from the last stored ``seq`` (nothing is lost: the
  supervisor kept training and buffering events while no controller was there). An ADMITTED job
  whose supervisor exists was started by the crashed leader just before it could record RUNNING:
  record it now.
* **missing** → a new attempt (epoch + 1, from the job's newest checkpoint, which is in the job's
  checkpoint directory shared by all attempts), or FAILED after ``max_attempts``.
* **older attempts** of each active job are looked up too and killed if some zombie still runs: their
  epochs are fenced, so they could write nothing anyway, but they would hold GPUs.

Nothing runs twice: an attempt's supervisor is only ever created under its own name, so a second
start of the same attempt finds the first, and a new attempt fences every older one in the same
transaction that creates it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from service.controller import apply
from service.controller.cluster_snapshot import JobRow, load_db_state
from service.controller.context import Ctx
from service.controller.supervisors import AttemptKey, SupervisorGone, SupervisorUnreachable
from service.db import transitions as tx
from service.log import get_logger
from workers.states import ACTIVE, AttemptState, JobState

log = get_logger("service.controller.reconcile")


@dataclass
class ReconcileReport:
    reattached: list[int] = field(default_factory=list)
    restarted: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    unreachable: list[int] = field(default_factory=list)
    zombies_killed: list[str] = field(default_factory=list)


def _confirm_running(ctx: Ctx, job: JobRow) -> None:
    with ctx.txn() as s:
        if tx.transition(
            s,
            job.id,
            expected={JobState.ADMITTED},
            new=JobState.RUNNING,
            epoch=job.epoch,
            reason="supervisor found running after a controller restart",
            commit=False,
        ):
            tx.set_attempt_state(s, job.id, epoch=job.epoch, state=AttemptState.RUNNING, commit=False)


def _alive(ctx: Ctx, job: JobRow) -> bool | None:
    """True if the attempt's supervisor answers, False if it is gone, None if unreachable now.

    A supervisor that answers but never started ``run()`` (its creator was killed right after
    creating it, before the ``run`` call reached it) is told to run now; ``run()`` is idempotent."""
    key = AttemptKey(job.id, job.attempt)
    if ctx.sups.find(key) is None:
        return False
    try:
        status = ctx.sups.call(key, "status")
    except SupervisorGone:
        return False
    except SupervisorUnreachable:
        return None
    if isinstance(status, dict) and not status.get("run_called", True):
        ctx.sups.tell(key, "run")
        log.info("supervisor had not started; run() sent", extra={"job_id": job.id, "attempt": job.attempt})
    return True


def reconcile(ctx: Ctx) -> ReconcileReport:
    """Reattach to or replace the supervisor of every active job (see the module docstring)."""
    report = ReconcileReport()
    ctx.cursors.clear()
    ctx.preempting.clear()
    ctx.cancelling.clear()
    with ctx.read() as s:
        db = load_db_state(s)
    for job in db.jobs:
        if job.state not in ACTIVE or job.attempt < 1:
            continue
        for older in range(1, job.attempt):
            if ctx.sups.kill(AttemptKey(job.id, older)):
                report.zombies_killed.append(AttemptKey(job.id, older).actor_name)
        alive = _alive(ctx, job)
        if alive is None:
            report.unreachable.append(job.id)
            continue
        if alive:
            if job.state == JobState.ADMITTED:
                _confirm_running(ctx, job)
            report.reattached.append(job.id)
            continue
        outcome = apply.retry_attempt(ctx, job, "supervisor missing at reconciliation")
        (report.restarted if outcome == "started" else report.failed).append(job.id)
    log.info(
        "reconciled",
        extra={
            "reattached": report.reattached,
            "restarted": report.restarted,
            "failed": report.failed,
            "unreachable": report.unreachable,
            "zombies_killed": report.zombies_killed,
        },
    )
    return report
