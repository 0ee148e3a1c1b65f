"""The working state of one decision round, built from a snapshot.

Everything is keyed and ordered by ids, never by the order of the snapshot's lists or dicts, so a
permuted snapshot gives the same round. Counts live here; nodes are only looked at when the round's
admissions and grows are placed (``placement.NodePool``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from service.scheduler.goodput import Curve
from service.scheduler.types import (
    ClusterSnapshot,
    Id,
    JobState,
    JobView,
    NodeId,
    TenantView,
)
from workers.states import ACTIVE, QUEUED, RELEASING


def queue_key(job: JobView) -> tuple:
    """Order within a tenant: higher priority first, then FIFO by submission, then id."""
    return (-job.priority, job.submitted_at, job.id)


def victim_order(jobs: list[JobView]) -> list[JobView]:
    """Preemption/shrink order: lowest priority first, then the most recently started, then the
    larger id (the later job)."""
    by_id = sorted(jobs, key=lambda j: j.id, reverse=True)
    return sorted(
        by_id, key=lambda j: (j.priority, -(j.started_at if j.started_at is not None else j.submitted_at))
    )


@dataclass
class Round:
    """Counts and bookkeeping for one call of ``decide``."""

    now: float
    tenants: dict[Id, TenantView]
    jobs: dict[Id, JobView]
    node_free: dict[NodeId, int]  # free GPUs per healthy node
    capacity: int  # GPUs on healthy nodes
    placement: dict[Id, dict[NodeId, int]]  # healthy part of each active job's allocation
    active: list[JobView]  # ADMITTED / RUNNING / RECOVERING, by id
    pending: list[JobView]  # PENDING, in queue order
    releasing: int  # GPUs on healthy nodes held by PREEMPTED jobs (free soon)
    avail: int  # free GPUs nobody has been promised this round
    size: dict[Id, int] = field(default_factory=dict)  # GPUs of each active/admitted job after this round
    committed: dict[Id, int] = field(default_factory=dict)  # per tenant: GPUs held or promised
    njobs: dict[Id, int] = field(default_factory=dict)  # per tenant: active + admitted jobs
    admitted: dict[Id, str] = field(default_factory=dict)  # job -> reason
    preempted: dict[Id, str] = field(default_factory=dict)
    shrunk: dict[Id, str] = field(default_factory=dict)  # job -> reason (new size in ``size``)
    grown: dict[Id, str] = field(default_factory=dict)
    waiting: dict[Id, str] = field(default_factory=dict)
    pinned: set[Id] = field(default_factory=set)  # jobs whose size this round must not change again
    curves: dict[Id, Curve] = field(default_factory=dict)
    reclaiming: bool = False  # GPUs are being freed this round for a queued job

    # ------------------------------------------------------------------ helpers
    def curve(self, job: JobView) -> Curve:
        c = self.curves.get(job.id)
        if c is None:
            c = self.curves[job.id] = Curve(job)
        return c

    def quota(self, tenant: Id) -> int:
        return self.tenants[tenant].gpu_quota

    def weight(self, tenant: Id) -> float:
        return self.tenants[tenant].weight

    def job_limit_reached(self, tenant: Id) -> bool:
        limit = self.tenants[tenant].max_jobs
        return limit is not None and self.njobs[tenant] >= limit

    def resize(self, job: JobView, new_size: int) -> None:
        """Change an active job's size (a shrink or a grow); keeps tenant usage in step."""
        self.committed[job.tenant_id] += new_size - self.size[job.id]
        self.size[job.id] = new_size

    def admit(self, job: JobView, reason: str) -> None:
        self.size[job.id] = job.min_gpus
        self.committed[job.tenant_id] += job.min_gpus
        self.njobs[job.tenant_id] += 1
        self.avail -= job.min_gpus
        self.admitted[job.id] = reason

    def preempt(self, job: JobView, reason: str) -> None:
        self.committed[job.tenant_id] -= self.size[job.id]
        self.njobs[job.tenant_id] -= 1
        self.size[job.id] = 0
        self.preempted[job.id] = reason
        self.shrunk.pop(job.id, None)
        self.pinned.add(job.id)


def build_round(snapshot: ClusterSnapshot) -> Round:
    """Index a snapshot: healthy capacity, free GPUs, what each tenant holds, the queue."""
    tenants = {t.id: t for t in snapshot.tenants}
    jobs = {j.id: j for j in snapshot.jobs}
    if len(tenants) != len(snapshot.tenants) or len(jobs) != len(snapshot.jobs):
        raise ValueError("snapshot has duplicate tenant or job ids")
    for job in jobs.values():  # a job of an unknown tenant is scheduled as a tenant without quota
        if job.tenant_id not in tenants:
            tenants[job.tenant_id] = TenantView(id=job.tenant_id, name=f"unknown-{job.tenant_id}")
    healthy = {n.id: n for n in snapshot.nodes if n.healthy}
    used: dict[NodeId, int] = {}
    placement: dict[Id, dict[NodeId, int]] = {}
    active: list[JobView] = []
    pending: list[JobView] = []
    releasing = 0
    for job in sorted(jobs.values(), key=lambda j: j.id):
        state = JobState(job.state) if not isinstance(job.state, JobState) else job.state
        if state in ACTIVE or state in RELEASING:
            mine = {n: k for n, k in sorted(job.allocated.items()) if n in healthy}
            for n, k in mine.items():
                used[n] = used.get(n, 0) + k
            if state in ACTIVE:
                placement[job.id] = mine
                active.append(job)
            else:
                releasing += sum(mine.values())
        elif state in QUEUED:
            pending.append(job)
    node_free: dict[NodeId, int] = {}
    for node_id in sorted(healthy):
        node = healthy[node_id]
        free = node.gpus - used.get(node_id, 0)
        if node.free_gpus is not None:
            free = min(free, node.free_gpus)
        node_free[node_id] = 0 if node.draining else max(0, free)  # a draining node takes no new work
    pending.sort(key=queue_key)
    rnd = Round(
        now=snapshot.now,
        tenants=tenants,
        jobs=jobs,
        node_free=node_free,
        capacity=sum(n.gpus for n in healthy.values()),
        placement=placement,
        active=active,
        pending=pending,
        releasing=releasing,
        avail=sum(node_free.values()),
    )
    rnd.committed = {t: 0 for t in tenants}
    rnd.njobs = {t: 0 for t in tenants}
    for job in active:
        held = sum(placement[job.id].values())
        rnd.size[job.id] = held
        rnd.committed[job.tenant_id] += held
        rnd.njobs[job.tenant_id] += 1
    return rnd
