"""Shared helpers for the scheduler tests: building snapshots, applying decisions, checking rounds."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from service.scheduler.policy import decide
from service.scheduler.types import (
    Admit,
    ClusterSnapshot,
    Decision,
    Grow,
    JobState,
    JobView,
    NodeView,
    Preempt,
    Shrink,
    TenantView,
    Wait,
)
from workers.states import ACTIVE, RELEASING


def nodes(*sizes: int, unhealthy: Iterable[int] = ()) -> list[NodeView]:
    bad = set(unhealthy)
    return [NodeView(id=f"n{i}", gpus=g, healthy=i not in bad) for i, g in enumerate(sizes)]


def running(job_id, tenant, alloc: dict[str, int], **kw) -> JobView:
    kw.setdefault("min_gpus", sum(alloc.values()))
    kw.setdefault("started_at", 0.0)
    return JobView(id=job_id, tenant_id=tenant, state=JobState.RUNNING, allocated=alloc, **kw)


def pending(job_id, tenant, gpus: int, **kw) -> JobView:
    return JobView(id=job_id, tenant_id=tenant, state=JobState.PENDING, min_gpus=gpus, **kw)


def snap(tenants, jobs, node_list, now: float = 0.0) -> ClusterSnapshot:
    return ClusterSnapshot(tenants=list(tenants), jobs=list(jobs), nodes=list(node_list), now=now)


def by_kind(decisions: list[Decision]) -> dict[str, dict]:
    out: dict[str, dict] = {"admit": {}, "grow": {}, "shrink": {}, "preempt": {}, "wait": {}}
    for d in decisions:
        out[d.kind][d.job_id] = d
    return out


def held_by_tenant(s: ClusterSnapshot) -> dict:
    """GPUs on healthy nodes held by each tenant's active jobs."""
    healthy = {n.id for n in s.nodes if n.healthy}
    out = {t.id: 0 for t in s.tenants}
    for j in s.jobs:
        if j.state in ACTIVE:
            out[j.tenant_id] = out.get(j.tenant_id, 0) + sum(
                k for n, k in j.allocated.items() if n in healthy
            )
    return out


def check_round(s: ClusterSnapshot, decisions: list[Decision]) -> None:
    """Every invariant one round must keep, whatever the snapshot."""
    jobs = {j.id: j for j in s.jobs}
    cap = {n.id: n.gpus for n in s.nodes if n.healthy}
    seen: set = set()
    for d in decisions:
        assert d.reason and isinstance(d.reason, str), d
        assert d.job_id not in seen, f"two decisions for job {d.job_id}"
        seen.add(d.job_id)
        job = jobs[d.job_id]
        if isinstance(d, (Admit, Wait)):
            assert job.state == JobState.PENDING, d
        else:
            assert job.state in ACTIVE, d
    for j in s.jobs:  # every pending job gets an Admit or a Wait
        if j.state == JobState.PENDING:
            assert j.id in seen, f"no decision for pending job {j.id}"
    # no GPU given twice: what is held now plus everything handed out must fit every healthy node
    used = {n: 0 for n in cap}
    for j in s.jobs:
        if j.state in ACTIVE or j.state in RELEASING:
            for n, k in j.allocated.items():
                if n in used:
                    used[n] += k
    for d in decisions:
        job = jobs[d.job_id]
        if isinstance(d, Admit):
            assert sum(d.placement.values()) == d.gpus
            assert job.min_gpus <= d.gpus <= job.max_gpus, d
            for n, k in d.placement.items():
                assert n in cap, f"placed on unhealthy/unknown node {n}"
                assert k > 0
                used[n] += k
        elif isinstance(d, Grow):
            assert job.elastic and job.state == JobState.RUNNING
            assert sum(d.placement.values()) == d.gpus <= job.max_gpus
            for n, k in d.added.items():
                assert n in cap and k > 0
                used[n] += k
            assert d.gpus == sum(job.allocated.get(n, 0) for n in cap) + sum(d.added.values())
        elif isinstance(d, Shrink):
            assert job.min_gpus <= d.gpus <= job.max_gpus, d
            assert sum(d.placement.values()) == d.gpus
            for n, k in d.placement.items():
                assert k <= job.allocated.get(n, 0)
            assert d.gpus + sum(d.released.values()) == sum(job.allocated.get(n, 0) for n in cap)
    for n, k in used.items():
        assert k <= cap[n], f"node {n}: {k} GPUs handed out of {cap[n]}"


def apply(s: ClusterSnapshot, decisions: list[Decision], dt: float = 1.0) -> ClusterSnapshot:
    """The snapshot after the controller carried out ``decisions`` (checkpoints done at once)."""
    jobs = {j.id: j for j in s.jobs}
    for d in decisions:
        j = jobs[d.job_id]
        if isinstance(d, Admit):
            jobs[j.id] = dataclasses.replace(
                j, state=JobState.RUNNING, allocated=d.placement, started_at=s.now
            )
        elif isinstance(d, (Grow, Shrink)):
            jobs[j.id] = dataclasses.replace(j, allocated=d.placement)
        elif isinstance(d, Preempt):
            jobs[j.id] = dataclasses.replace(j, state=JobState.PENDING, allocated={}, started_at=None)
    return dataclasses.replace(s, jobs=[jobs[j.id] for j in s.jobs], now=s.now + dt)


def settle(s: ClusterSnapshot, rounds: int = 8) -> tuple[ClusterSnapshot, list[Decision], int]:
    """Decide and apply until a round changes nothing; returns the state, its decisions and the
    number of rounds taken (``rounds + 1`` if it never settled)."""
    for i in range(rounds):
        d = decide(s)
        check_round(s, d)
        if all(isinstance(x, Wait) for x in d):
            return s, d, i
        s = apply(s, d)
    return s, decide(s), rounds + 1


def tenant(tid, quota: int = 0, weight: float = 1.0, max_jobs: int | None = None) -> TenantView:
    return TenantView(id=tid, name=str(tid), gpu_quota=quota, weight=weight, max_jobs=max_jobs)
