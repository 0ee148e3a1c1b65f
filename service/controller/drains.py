"""Drained nodes, as the controller carries them out (``POST /v1/cluster/nodes/{node}/drain``).

The ``node_drains`` table holds the nodes an operator drains (until undrained). Every round, the
controller:

1. gives the scheduler the draining nodes (``NodeView.draining``: no new work goes there; see
   ``cluster_snapshot.build_snapshot``);
2. tells every active attempt's supervisor the whole set of draining nodes with the seconds left to
   each deadline (``JobSupervisor.drain``), once per change of the set: a job with ranks there moves
   off at its next step boundary with nothing redone, and every job keeps out of them when it
   re-plans or places a replica group;
3. past a node's deadline, preempts a job whose recorded placement still holds GPUs there
   (checkpoint, requeue: it resumes elsewhere): the fallback for a job that could not move itself.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.orm import Session

from service.controller.cluster_snapshot import JobRow
from service.controller.context import Ctx
from service.controller.supervisors import AttemptKey, SupervisorGone, SupervisorUnreachable
from service.db.models import NodeDrain
from service.log import get_logger
from service.scheduler.types import Preempt
from workers.states import JobState

log = get_logger("service.controller.drains")

#: the states whose supervisor is told (it may be starting a gang: it must not pick a draining node)
TOLD = (JobState.ADMITTED, JobState.RUNNING, JobState.RECOVERING)


@dataclass(frozen=True)
class Drain:
    """A draining node: ``deadline_at`` (seconds since the epoch) for ``deadline_s`` from the notice."""

    node_id: str
    deadline_s: float
    deadline_at: float

    def left_s(self, now: float) -> float:
        """Seconds to the deadline (at least 1: a supervisor told after it still moves at once)."""
        return max(1.0, self.deadline_at - now)


def load_drains(session: Session) -> dict[str, Drain]:
    """Every draining node, by node id."""
    rows = session.execute(sa.select(NodeDrain)).scalars()
    return {r.node_id: Drain(r.node_id, float(r.deadline_s), r.deadline_at.timestamp()) for r in rows}


def tell_supervisors(ctx: Ctx, jobs: list[JobRow], drains: dict[str, Drain], now: float | None = None) -> list[int]:
    """Tell each active attempt's supervisor the draining nodes when the set changed since it was
    last told; the ids of the jobs told this round."""
    now = time.time() if now is None else now
    nodes = frozenset(drains)
    told = []
    live: set[AttemptKey] = set()
    for job in jobs:
        if job.state not in TOLD or job.attempt < 1 or job.cancel_requested:
            continue
        key = AttemptKey(job.id, job.attempt)
        live.add(key)
        if ctx.drains_told.get(key, frozenset()) == nodes:
            continue
        try:
            ctx.sups.call(key, "drain", {n: d.left_s(now) for n, d in drains.items()})
        except (SupervisorGone, SupervisorUnreachable) as exc:  # told next round (or never: it is gone)
            log.debug("drain not told", extra={"job_id": job.id, "error": str(exc)})
            continue
        ctx.drains_told[key] = nodes
        told.append(job.id)
        log.info("supervisor told the draining nodes", extra={"job_id": job.id, "nodes": sorted(nodes)})
    for key in [k for k in ctx.drains_told if k not in live]:
        del ctx.drains_told[key]
    return told


def overdue(jobs: list[JobRow], drains: dict[str, Drain], now: float | None = None) -> list[tuple[JobRow, Preempt]]:
    """The running jobs whose placement still holds GPUs on a node past its drain deadline, each
    with the preemption that moves it off (pure)."""
    now = time.time() if now is None else now
    out = []
    for job in jobs:
        if job.state != JobState.RUNNING:
            continue
        late = sorted(n for n, g in job.placement.items() if g > 0 and n in drains and drains[n].deadline_at <= now)
        if late:
            out.append((job, Preempt(job.id, f"still on draining node(s) {', '.join(n[:8] for n in late)} "
                                             "past the deadline: checkpoint and requeue")))
    return out

