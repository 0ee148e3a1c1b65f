"""Build the scheduler's :class:`ClusterSnapshot` from the job store and the Ray cluster view.

Jobs: every non-terminal job, from the database alone. A job that holds GPUs (ADMITTED, RUNNING,
RECOVERING, PREEMPTED while it checkpoints) is given the per-node allocation recorded on its current
attempt row (``attempts.placement``): the scheduler's placement when the attempt started, replaced
by where the gang landed when its ``placed`` event is stored. Nodes: alive nodes with GPUs, their
free GPUs as Ray reports them (the scheduler takes the lower of that and what the allocations
leave); an allocation on a node that is gone is gone with it.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from planner.recovery_choice import RecoveryChoice
from service.controller.cluster import ClusterView
from service.db.models import Attempt, Job, Tenant
from service.recovery import whole_groups
from service.scheduler.types import ClusterSnapshot, JobView, NodeView, TenantView
from workers.states import HOLDING, TERMINAL


@dataclass
class JobRow:
    """What the controller needs of a non-terminal job (copied out of the session)."""

    id: int
    tenant_id: int
    name: str
    state: str
    priority: int
    min_gpus: int
    max_gpus: int
    attempt: int
    epoch: int
    cancel_requested: bool
    gpus_allocated: int
    spec: dict[str, Any]
    created_at: float
    admitted_at: float | None
    placement: dict[str, int] = field(default_factory=dict)  # the live attempt's GPUs per node


@dataclass
class DbState:
    tenants: list[TenantView] = field(default_factory=list)
    jobs: list[JobRow] = field(default_factory=list)


def _epoch_s(value: Any) -> float | None:
    return None if value is None else value.timestamp()


def load_db_state(session: Session) -> DbState:
    """Tenants and every non-terminal job (one consistent read)."""
    tenants = [
        TenantView(id=t.id, name=t.name, gpu_quota=t.gpu_quota, weight=t.weight, max_jobs=t.max_jobs)
        for t in session.execute(sa.select(Tenant).order_by(Tenant.id)).scalars()
    ]
    rows = session.execute(
        sa.select(Job, Attempt.placement)
        .outerjoin(Attempt, sa.and_(Attempt.job_id == Job.id, Attempt.epoch == Job.epoch))
        .where(Job.state.not_in(sorted(TERMINAL)))
        .order_by(Job.id)
    ).all()
    jobs = [
        JobRow(
            id=j.id,
            tenant_id=j.tenant_id,
            name=j.name,
            state=j.state,
            priority=j.priority,
            min_gpus=j.min_gpus,
            max_gpus=j.max_gpus,
            attempt=j.attempt,
            epoch=j.epoch,
            cancel_requested=j.cancel_requested,
            gpus_allocated=j.gpus_allocated,
            spec=dict(j.spec or {}),
            created_at=_epoch_s(j.created_at) or 0.0,
            admitted_at=_epoch_s(j.admitted_at),
            placement={str(n): int(g) for n, g in (placement or {}).items()},
        )
        for j, placement in rows
    ]
    return DbState(tenants=tenants, jobs=jobs)


def build_snapshot(
    db: DbState,
    view: ClusterView,
    *,
    resizable: bool = False,
    curves: Mapping[int, Mapping[int, float] | None] | None = None,
    recoveries: Mapping[int, Mapping[str, Any]] | None = None,
    draining: Collection[str] = (),
) -> ClusterSnapshot:
    """The snapshot for :func:`service.scheduler.policy.decide` (pure).

    ``resizable``: whether running jobs can be grown or shrunk in place (supervisors ``resize``; the
    controller's ``runtime_resizes``). Without it jobs are presented as fixed-size once admitted (the
    scheduler sizes a ``min..max`` job once, at admission, and reclaims GPUs by preemption only).
    ``curves``: the planner's predicted tokens/s per GPU count of elastic jobs (``curves.py``).
    ``recoveries``: each job's recovery choice (``service.recovery.job_recovery``): a replica job is
    sized in whole groups, every group's GPUs counted (``service.recovery.whole_groups``: its range in
    group multiples, and a curve with only those sizes).
    ``draining``: nodes an operator drains (``drains``): no new work is placed there.
    """
    nodes = [n for n in view.alive_nodes if n.gpus_total > 0]
    alive = {n.node_id for n in nodes}
    jobs = []
    for j in db.jobs:
        allocated: dict[str, int] = {}
        if j.state in HOLDING:
            allocated = {n: g for n, g in j.placement.items() if n in alive and g > 0}
        choice = (recoveries or {}).get(j.id)
        low, top, unit = whole_groups(RecoveryChoice.from_dict(choice) if choice else None, j.min_gpus, j.max_gpus)
        curve = (curves or {}).get(j.id)
        if unit > 1:  # whole groups only: the sizes a curve names are the sizes the scheduler offers
            curve = {n: float(n) for n in range(unit, top + 1, unit)}  # each group a full replica: linear
        jobs.append(
            JobView(
                id=j.id,
                tenant_id=j.tenant_id,
                state=j.state,
                priority=j.priority,
                min_gpus=low,
                max_gpus=top,
                submitted_at=j.created_at,
                allocated=allocated,
                preemptible=bool(j.spec.get("preemptible", True)),
                elastic=resizable and bool(j.spec.get("elastic", top > low)),
                started_at=j.admitted_at,
                throughput=curve,
            )
        )
    node_views = [
        NodeView(id=n.node_id, gpus=n.gpus_total, free_gpus=n.gpus_free, healthy=n.alive,
                 draining=n.node_id in draining) for n in nodes
    ]
    return ClusterSnapshot(
        tenants=tuple(db.tenants), jobs=tuple(jobs), nodes=tuple(node_views), now=time.time()
    )
