"""Elastic sizing: give spare GPUs to the jobs where they add the most predicted goodput, and move
GPUs between running jobs when that is clearly better.

Every step of GPUs a job could take gets a key ``(tier, -gain per GPU, -priority, submitted_at,
id)`` and the smallest key goes first:

- tier 0: the step stays within the tenant's quota (guaranteed capacity),
- tier 1: it stays within the tenant's weighted fair entitlement (``fairness.entitlements``),
- tier 2: it borrows beyond that (only idle capacity nobody else wants ends up here).

``grow`` is a greedy marginal-gain allocation of the free GPUs (optimal for concave curves).
``rebalance`` moves a step from the job with the largest key to the job with the smallest when the
receiver's tier is lower, or the tiers are equal and the receiver gains more than ``HYSTERESIS``
times what the donor loses: a re-plan costs a checkpoint, so small gains are not worth it. Donor
steps are emitted as ``Shrink``; the receivers get the freed GPUs from ``grow`` in the next round,
which uses the same keys, so the two phases agree and the sizes settle.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping

from service.scheduler.state import Round
from service.scheduler.types import Id, JobState, JobView

#: A move between running jobs on goodput alone needs gain > loss * (1 + HYSTERESIS).
HYSTERESIS = 0.10
#: A step of GPUs that adds less than this (per GPU, normalised) is not worth taking.
MIN_GAIN = 0.05


def participants(rnd: Round) -> list[JobView]:
    """Jobs whose size may change: running elastic jobs not touched this round, and jobs admitted
    this round that have a range (a non-elastic job gets its size once, at admission)."""
    out = []
    for job in rnd.active:
        if (
            job.state == JobState.RUNNING
            and job.elastic
            and job.id not in rnd.pinned
            and job.min_gpus <= rnd.size[job.id] <= (job.max_gpus or job.min_gpus)
            and (job.max_gpus or 0) > job.min_gpus
        ):
            out.append(job)
    out.extend(
        rnd.jobs[j] for j in sorted(rnd.admitted) if (rnd.jobs[j].max_gpus or 0) > rnd.jobs[j].min_gpus
    )
    return out


def demands(rnd: Round, jobs: list[JobView]) -> dict[Id, int]:
    """Per tenant: what it holds or was promised, plus what its elastic jobs could still take."""
    out = dict(rnd.committed)
    for job in jobs:
        out[job.tenant_id] += (job.max_gpus or job.min_gpus) - rnd.size[job.id]
    return out


def _tier(rnd: Round, ent: Mapping[Id, float], tenant: Id, after: int) -> int:
    if after <= rnd.quota(tenant):
        return 0
    if after <= ent.get(tenant, 0.0) + 1e-9:
        return 1
    return 2


def grow_key(rnd: Round, ent: Mapping[Id, float], job: JobView) -> tuple[tuple, int] | None:
    """(key, GPUs) of ``job``'s next step up, or ``None`` if it is at its max or the step is useless."""
    step = rnd.curve(job).gain(rnd.size[job.id])
    if step is None or step[1] < MIN_GAIN:
        return None
    gpus, gain = step
    tier = _tier(rnd, ent, job.tenant_id, rnd.committed[job.tenant_id] + gpus)
    return (tier, -gain, -job.priority, job.submitted_at, job.id), gpus


def shrink_key(rnd: Round, ent: Mapping[Id, float], job: JobView) -> tuple[tuple, int] | None:
    """(key, GPUs) of ``job``'s last step, as if it were being handed out again, or ``None`` at min."""
    step = rnd.curve(job).loss(rnd.size[job.id])
    if step is None:
        return None
    gpus, loss = step
    tier = _tier(rnd, ent, job.tenant_id, rnd.committed[job.tenant_id])
    return (tier, -loss, -job.priority, job.submitted_at, job.id), gpus


def grow(rnd: Round, ent: Mapping[Id, float], jobs: list[JobView], budget: int) -> int:
    """Hand out up to ``budget`` free GPUs, one step at a time, best key first; returns GPUs used."""
    heap = []
    for job in jobs:
        k = grow_key(rnd, ent, job)
        if k is not None:
            heap.append((k[0], k[1], job.id))
    heapq.heapify(heap)
    used = 0
    while heap and used < budget:
        key, gpus, job_id = heapq.heappop(heap)
        job = rnd.jobs[job_id]
        fresh = grow_key(rnd, ent, job)
        if fresh is None:
            continue
        if fresh[0] != key:
            heapq.heappush(heap, (fresh[0], fresh[1], job_id))
            continue
        if gpus > budget - used:
            continue  # this step no longer fits; smaller steps of other jobs still may
        rnd.resize(job, rnd.size[job_id] + gpus)
        used += gpus
        nxt = grow_key(rnd, ent, job)
        if nxt is not None:
            heapq.heappush(heap, (nxt[0], nxt[1], job_id))
    return used


class _Max:
    """Wraps a key so that ``heapq`` (a min-heap) pops the largest key first."""

    __slots__ = ("key",)

    def __init__(self, key: tuple) -> None:
        self.key = key

    def __lt__(self, other: _Max) -> bool:
        return other.key < self.key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Max) and other.key == self.key


def _better(receiver: tuple, donor: tuple, same_tenant: bool) -> bool:
    """Is the receiver's step clearly better than the donor's? Within one tenant the tiers do not
    change by moving GPUs, so only the gains count."""
    if receiver[0] != donor[0] and not same_tenant:
        return receiver[0] < donor[0]
    return -receiver[1] > -donor[1] * (1.0 + HYSTERESIS) + 1e-12


def rebalance(
    rnd: Round, ent: Mapping[Id, float], jobs: list[JobView], donors: set[Id]
) -> dict[Id, list[Id]]:
    """Shrink donor jobs whose GPUs another job would use much better; returns donor -> receivers.

    Only jobs in ``donors`` (running before this round, not grown in it) give GPUs. Receivers are
    only *intended* to grow: the GPUs are free next round, when ``grow`` hands them out.
    """
    rheap = []
    dheap = []
    for job in jobs:
        k = grow_key(rnd, ent, job)
        if k is not None:
            rheap.append((k[0], job.id))
        if job.id in donors:
            d = shrink_key(rnd, ent, job)
            if d is not None:
                dheap.append((_Max(d[0]), job.id))
    heapq.heapify(rheap)
    heapq.heapify(dheap)
    original = {job.id: rnd.size[job.id] for job in jobs}
    pool = 0
    donations: list[tuple[Id, int, tuple]] = []
    gave_to: dict[Id, list[Id]] = {}
    last_donor: tuple[tuple, Id] | None = None  # key and tenant of the latest donation

    def top(heap, keyfn, wrap):
        while heap:
            key, job_id = heap[0]
            fresh = keyfn(rnd, ent, rnd.jobs[job_id])
            if fresh is None:
                heapq.heappop(heap)
                continue
            if (key.key if wrap else key) != fresh[0]:
                heapq.heapreplace(heap, (_Max(fresh[0]) if wrap else fresh[0], job_id))
                continue
            return job_id, fresh
        return None

    while True:
        r = top(rheap, grow_key, False)
        if r is None:
            break
        r_id, (r_key, r_gpus) = r
        if pool >= r_gpus:
            r_tenant = rnd.jobs[r_id].tenant_id
            if last_donor is not None and not _better(r_key, last_donor[0], last_donor[1] == r_tenant):
                break
            rnd.resize(rnd.jobs[r_id], rnd.size[r_id] + r_gpus)
            pool -= r_gpus
            for donor_id, _, _ in donations:
                if r_id not in gave_to.setdefault(donor_id, []):
                    gave_to[donor_id].append(r_id)
            continue
        d = top(dheap, shrink_key, True)
        if d is None:
            break
        d_id, (d_key, d_gpus) = d
        if d_id == r_id:
            # the best receiver is also the worst donor: nothing to gain by moving its own GPUs
            heapq.heappop(dheap)
            continue
        d_tenant = rnd.jobs[d_id].tenant_id
        if not _better(r_key, d_key, d_tenant == rnd.jobs[r_id].tenant_id):
            break
        rnd.resize(rnd.jobs[d_id], rnd.size[d_id] - d_gpus)
        pool += d_gpus
        donations.append((d_id, d_gpus, d_key))
        last_donor = (d_key, d_tenant)
    # give back the trailing donations that no receiver used
    while donations and donations[-1][1] <= pool:
        d_id, d_gpus, _ = donations.pop()
        rnd.resize(rnd.jobs[d_id], rnd.size[d_id] + d_gpus)
        pool -= d_gpus
    # receivers only intended to grow: put their sizes back, their GPUs come next round
    for job in jobs:
        if job.id not in donors or rnd.size[job.id] > original[job.id]:
            rnd.resize(job, min(rnd.size[job.id], original[job.id]))
    return {d: r for d, r in gave_to.items() if rnd.size[d] < original[d]}
