"""The multi-tenant gang scheduler: ``decide(snapshot) -> list[Decision]``, a pure function.

Interface (stable; the controller and the simulator depend on it)::

    from service.scheduler.policy import decide
    from service.scheduler.types import (ClusterSnapshot, TenantView, JobView, NodeView,
                                         Admit, Grow, Shrink, Preempt, Wait, JobState)

    decisions = decide(ClusterSnapshot(tenants=[...], jobs=[...], nodes=[...], now=time.time()))

- ``Admit(job_id, gpus, placement, reason)``: start a PENDING job on ``placement`` (node -> GPUs,
  summing to ``gpus``, all free now).
- ``Grow(job_id, gpus, placement, added, reason)``: re-plan a RUNNING job onto ``placement`` (its
  current GPUs plus ``added``, all free now).
- ``Shrink(job_id, gpus, placement, released, reason)``: checkpoint and re-plan a RUNNING job onto
  ``placement`` (a subset of what it holds); ``released`` becomes free once it has re-planned.
- ``Preempt(job_id, reason)``: checkpoint and stop; the controller moves it RUNNING -> PREEMPTED ->
  PENDING. While PREEMPTED its GPUs still count as held (as *being released*).
- ``Wait(job_id, reason)``: a PENDING job stays queued.

Every PENDING job gets exactly one Admit or Wait; running jobs get a decision only when they change.
Decisions come in the order Preempt, Shrink, Admit, Grow, Wait. GPUs freed by a Preempt or Shrink
are not handed out in the same round (the job must checkpoint first); the job they are for waits
with a reason that says so and is admitted in a later round, because queued jobs within quota go
first. Calling ``decide`` again on the same snapshot gives the same decisions (so repeating a
decision the controller is already carrying out is harmless); the result does not depend on the
order of the snapshot's lists or dicts; ties are broken by ids.

Policy, in the order one round applies it (details in docs/scheduling.md):

1. Guaranteed admissions. Tenants take turns, lowest weighted share (GPUs held / weight) first;
   within a tenant, higher priority first, then FIFO, then id. A job whose minimum fits in its
   tenant's unused quota is admitted if its whole gang fits in the free GPUs; otherwise GPUs are
   reclaimed from tenants that borrow beyond their quota (GPUs already being released, then elastic
   shrinks, then preemptions: lowest priority, most recently started first, a minimal set), and the
   job waits for them holding the free GPUs it needs.
2. Borrowing, in the same fair order: a job that does not fit in its quota runs on idle GPUs if its
   gang fits (non-preemptible jobs never borrow). The first job that does not fit is the head of
   the queue: it may shrink elastic jobs of its own tenant (no higher priority) or of tenants that
   borrow more than their fair share, else it waits with a reservation and later jobs are
   backfilled only when they cannot delay it (EASY backfill: they end before its estimated start,
   or use GPUs it will not need then; without run-time estimates nothing backfills).
3. Elastic sizing: spare GPUs go step by step to the job whose next step adds the most predicted
   goodput (quota first, then fair entitlement, then gain per GPU); running jobs are shrunk for
   another job only for a clearly larger gain or to restore fair share. Nothing grows into GPUs a
   queued job is waiting for.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from service.scheduler import elastic, gpu_packing
from service.scheduler.fairness import FairQueue, entitlements
from service.scheduler.reclaim import commit, plan_fair_shrink, plan_quota_reclaim
from service.scheduler.state import Round, build_round
from service.scheduler.types import (
    Admit,
    ClusterSnapshot,
    Decision,
    Grow,
    Id,
    JobView,
    Preempt,
    Shrink,
    Wait,
)

__all__ = ["Admit", "Decision", "Grow", "Preempt", "Shrink", "Wait", "decide"]


@dataclass
class _Head:
    """The first queued job that does not fit: its estimated start ``start`` (``None`` when unknown)
    and ``extra``, the GPUs free at that time beyond what it needs."""

    job: JobView
    start: float | None
    extra: int
    release: Id | None = None  # the running job whose estimated end frees the last GPUs it needs


def decide(snapshot: ClusterSnapshot) -> list[Decision]:
    """One scheduling round: the decisions for ``snapshot`` (see the module docstring)."""
    rnd = build_round(snapshot)
    _cap_at_max(rnd)
    leftover = _guaranteed(rnd)
    head = _borrow_and_backfill(rnd, leftover)
    _elastic(rnd, head)
    return _emit(rnd)


def _by_tenant(jobs: list[JobView]) -> dict:
    queues: dict = defaultdict(list)
    for job in jobs:
        queues[job.tenant_id].append(job)
    return queues


def _cap_at_max(rnd: Round) -> None:
    """A running job above its (possibly lowered) maximum shrinks to it."""
    for job in rnd.active:
        top = job.max_gpus or job.min_gpus
        if rnd.size[job.id] > top:
            new = rnd.curve(job).fit(top)
            rnd.shrunk[job.id] = f"holds {rnd.size[job.id]} GPUs, above its maximum of {top}"
            rnd.resize(job, new)
            rnd.pinned.add(job.id)


def _guaranteed(rnd: Round) -> list[JobView]:
    """Phase 1: admit (or reclaim for) queued jobs that fit in their tenant's unused quota."""
    leftover: list[JobView] = []
    weights = {t: rnd.weight(t) for t in rnd.tenants}
    # A job that does not fit in its tenant's unused quota now will not this round either (the
    # tenant's own admissions only use more of it): send it straight to the borrowing phase.
    candidates: list[JobView] = []
    for job in rnd.pending:
        t = job.tenant_id
        if rnd.committed[t] + job.min_gpus <= rnd.quota(t) and not rnd.job_limit_reached(t):
            candidates.append(job)
        else:
            leftover.append(job)
    for job in FairQueue(_by_tenant(candidates), rnd.committed, weights):
        t, m = job.tenant_id, job.min_gpus
        used, quota = rnd.committed[t], rnd.quota(t)
        if used + m > quota or rnd.job_limit_reached(t) or m > rnd.capacity:
            leftover.append(job)
            continue
        if rnd.avail >= m:
            rnd.admit(
                job, f"gang of {m} GPU(s) within tenant {t}'s quota ({used + m}/{quota} after admission)"
            )
            continue
        plan = plan_quota_reclaim(rnd, job, m - rnd.avail)
        if plan is None:  # quotas exceed what the healthy nodes hold: queue as a borrower would
            leftover.append(job)
            continue
        rnd.waiting[job.id] = commit(rnd, plan, job, f"quota reclaim for tenant {t} ({used}/{quota} GPUs)")
    return leftover


def _borrow_and_backfill(rnd: Round, leftover: list[JobView]) -> _Head | None:
    """Phase 2: admit on idle GPUs in fair order; the first job that does not fit is the head."""
    head: _Head | None = None
    weights = {t: rnd.weight(t) for t in rnd.tenants}
    queue = FairQueue(_by_tenant(leftover), rnd.committed, weights)
    for job in queue:
        if _cannot_start(rnd, job):
            continue
        t, m = job.tenant_id, job.min_gpus
        used, quota = rnd.committed[t], rnd.quota(t)
        borrow = max(0, used + m - max(quota, used))
        what = f"gang of {m} GPU(s), borrowing {borrow} idle GPU(s) beyond tenant {t}'s quota of {quota}"
        if used + m <= quota:
            what = f"gang of {m} GPU(s) within tenant {t}'s quota"
        if head is None:
            if rnd.avail >= m:
                rnd.admit(job, what)
                continue
            plan = plan_fair_shrink(rnd, job, m - rnd.avail)
            if plan is not None:
                rnd.waiting[job.id] = commit(rnd, plan, job, f"fair share for tenant {t}")
                head = _Head(job, None, 0)
                continue
            head = _make_head(rnd, job)
            when = f"estimated start at {head.start:g}" if head.start is not None else "start time unknown"
            release = (f"next release expected when job {head.release} ends" if head.release is not None
                       else "no running job has an end estimate")
            rnd.waiting[job.id] = (
                f"head of the queue: needs {m} GPUs, {rnd.avail} free; {release}; "
                f"holds a reservation ({when})"
            )
            continue
        hid = head.job.id
        if rnd.avail < m:
            rnd.waiting[job.id] = (
                f"needs {m} GPUs, {rnd.avail} free and not promised; queued behind head job {hid}"
            )
            if rnd.avail == 0:  # nothing can start any more this round
                for rest in queue.remaining():
                    if not _cannot_start(rnd, rest):
                        rnd.waiting[rest.id] = (
                            f"needs {rest.min_gpus} GPUs, 0 free and not promised; queued behind head job {hid}"
                        )
            continue
        ends = (
            job.est_duration is not None
            and head.start is not None
            and rnd.now + job.est_duration <= head.start
        )
        if ends:
            rnd.admit(
                job, f"backfill: {what}; ends by {rnd.now + job.est_duration:g}, before head job {hid} starts"
            )
        elif m <= head.extra:
            head.extra -= m
            rnd.admit(job, f"backfill: {what}; uses GPUs head job {hid} will not need")
        else:
            rnd.waiting[job.id] = f"fits now but could delay head job {hid}'s reservation"
    return head


def _holders(rnd: Round, tenant: Id) -> str:
    """``jobs 3, 7`` (the tenant's jobs holding or promised GPUs this round), or ``no job``."""
    ids = sorted((j.id for j in rnd.active if j.tenant_id == tenant and rnd.size.get(j.id, 0) > 0), key=str)
    ids += sorted((i for i in rnd.admitted if rnd.jobs[i].tenant_id == tenant), key=str)
    if not ids:
        return "no job"
    return ("job " if len(ids) == 1 else "jobs ") + ", ".join(str(i) for i in ids)


def _cannot_start(rnd: Round, job: JobView) -> bool:
    """Record why ``job`` cannot start whatever the free GPUs (job limit, size, no borrowing), in
    words a user can act on: which jobs hold the quota, what the cluster has."""
    t, m = job.tenant_id, job.min_gpus
    used, quota = rnd.committed[t], rnd.quota(t)
    if rnd.job_limit_reached(t):
        rnd.waiting[job.id] = (
            f"tenant {t} already runs its maximum of {rnd.tenants[t].max_jobs} job(s): {_holders(rnd, t)}"
        )
    elif m > rnd.capacity:
        rnd.waiting[job.id] = (
            f"needs at least {m} GPU(s); the cluster has 0 (no healthy node declares GPUs)" if rnd.capacity == 0
            else f"needs at least {m} GPU(s); the healthy nodes have {rnd.capacity} in all"
        )
    elif used + m > quota and not job.preemptible:
        rnd.waiting[job.id] = (
            f"non-preemptible jobs run only within quota: tenant quota of {quota} GPUs, {used} in use by "
            f"{_holders(rnd, t)}; job needs {m}"
        )
    else:
        return False
    return True


def _make_head(rnd: Round, job: JobView) -> _Head:
    """Estimate when ``job`` could start from the running jobs' estimated ends (EASY backfill)."""
    free = rnd.avail + rnd.releasing
    if free >= job.min_gpus:
        return _Head(job, rnd.now, free - job.min_gpus)
    ends = sorted(
        (j.est_end, j.id, rnd.size[j.id])
        for j in rnd.active
        if j.est_end is not None and rnd.size[j.id] > 0 and j.id not in rnd.pinned
    )
    for end, jid, size in ends:
        free += size
        if free >= job.min_gpus:
            return _Head(job, max(end, rnd.now), free - job.min_gpus, jid)
    return _Head(job, None, 0)


def _elastic(rnd: Round, head: _Head | None) -> None:
    """Phase 3: spare GPUs to the best goodput steps; rebalance running jobs when clearly better."""
    jobs = elastic.participants(rnd)
    if not jobs:
        return
    weights = {t: rnd.weight(t) for t in rnd.tenants}
    ent = entitlements(rnd.capacity, elastic.demands(rnd, jobs), weights)
    before = {j.id: rnd.size[j.id] for j in jobs}
    budget = rnd.avail if head is None else min(rnd.avail, head.extra)
    used = elastic.grow(rnd, ent, jobs, budget)
    rnd.avail -= used
    if head is not None:
        head.extra -= used
    for job in jobs:
        old, new = before[job.id], rnd.size[job.id]
        if new == old:
            continue
        gain = rnd.curve(job).value(new) - rnd.curve(job).value(old)
        note = f"sized {old}->{new} GPUs on idle capacity (predicted goodput +{gain:.2f} GPU-equivalents)"
        if job.id in rnd.admitted:
            rnd.admitted[job.id] += f"; {note}"
        else:
            rnd.grown[job.id] = note
            rnd.pinned.add(job.id)
    if head is None and not rnd.reclaiming:
        donors = {j.id for j in jobs if j.id not in rnd.admitted and rnd.size[j.id] == before[j.id]}
        for donor, receivers in elastic.rebalance(rnd, ent, jobs, donors).items():
            names = ", ".join(str(r) for r in receivers)
            rnd.shrunk[donor] = (
                f"goodput/fair share: {before[donor]}->{rnd.size[donor]} GPUs; "
                f"the GPUs go to job(s) {names}, predicted to use them better"
            )
            rnd.pinned.add(donor)


def _emit(rnd: Round) -> list[Decision]:
    """Turn the round's counts into decisions with node placements."""
    out: list[Decision] = [Preempt(job_id, rnd.preempted[job_id]) for job_id in sorted(rnd.preempted)]
    for job_id in sorted(rnd.shrunk):
        current = rnd.placement[job_id]
        held = sum(current.values())
        if rnd.size[job_id] >= held:
            continue
        released = gpu_packing.release_plan(current, held - rnd.size[job_id])
        out.append(
            Shrink(
                job_id, rnd.size[job_id], gpu_packing.subtract(current, released), released, rnd.shrunk[job_id]
            )
        )
    pool = gpu_packing.NodePool(rnd.node_free)
    grows: list[Decision] = []
    for job_id in sorted(rnd.grown):
        current = rnd.placement[job_id]
        added = pool.extend(current, rnd.size[job_id] - sum(current.values()))
        grows.append(Grow(job_id, rnd.size[job_id], gpu_packing.add(current, added), added, rnd.grown[job_id]))
    order = {job_id: i for i, job_id in enumerate(rnd.admitted)}
    placed = {}
    for job_id in sorted(rnd.admitted, key=lambda j: (-rnd.size[j], order[j])):
        placed[job_id] = dict(sorted(pool.take(rnd.size[job_id]).items()))
    out.extend(Admit(j, rnd.size[j], placed[j], rnd.admitted[j]) for j in rnd.admitted)
    out.extend(grows)
    for job in rnd.pending:
        if job.id not in rnd.admitted:
            out.append(Wait(job.id, rnd.waiting.get(job.id, "queued")))
    return out
