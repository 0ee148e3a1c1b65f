"""Freeing GPUs for a queued job: quota reclaim (shrink, then preempt borrowers) and fair-share
shrinks of elastic jobs. Plans are computed on copies and committed only when they free enough.

Order of sources: GPUs already being released by PREEMPTED jobs; then the elastic extras (GPUs above
``min_gpus``) of borrowing jobs, since a shrink is a checkpoint and a re-plan, not a kill; then whole
jobs of borrowing tenants, lowest priority first, most recently started first. A tenant stops being a
source as soon as it no longer borrows. The chosen set is then pruned (last chosen first) of every
victim the others already cover, so no preemption is wasted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from service.scheduler.state import Round, victim_order
from service.scheduler.types import JobState, JobView
from workers.states import ACTIVE


@dataclass
class ReclaimPlan:
    """What would free ``need`` GPUs: releasing GPUs used, shrinks (job, new size), preemptions."""

    releasing: int = 0
    shrinks: list[tuple[JobView, int]] = field(default_factory=list)
    preempts: list[JobView] = field(default_factory=list)

    def freed(self, rnd: Round) -> int:
        return (
            self.releasing
            + sum(rnd.size[j.id] - n for j, n in self.shrinks)
            + sum(rnd.size[j.id] for j in self.preempts)
        )

    def describe(self, rnd: Round) -> str:
        parts = []
        if self.releasing:
            parts.append(f"{self.releasing} GPU(s) being released by preempted jobs")
        if self.shrinks:
            parts.append(
                "shrinking " + ", ".join(f"job {j.id} {rnd.size[j.id]}->{n}" for j, n in self.shrinks)
            )
        if self.preempts:
            parts.append(
                "preempting " + ", ".join(f"job {j.id} ({rnd.size[j.id]} GPUs)" for j in self.preempts)
            )
        return "; ".join(parts)


def shrinkable(rnd: Round, job: JobView) -> bool:
    """A running elastic job above its minimum that this round has not touched yet."""
    return (
        job.state == JobState.RUNNING
        and job.elastic
        and job.id not in rnd.pinned
        and rnd.size[job.id] > job.min_gpus
    )


def _shrink_steps(rnd: Round, job: JobView, want: int, limit: int) -> int:
    """New size of ``job`` after shrinking step by step until ``want`` GPUs are freed, never freeing
    more than ``limit``."""
    curve = rnd.curve(job)
    size = rnd.size[job.id]
    new = size
    while size - new < want:
        prev = curve.prev_size(new)
        if prev is None or size - prev > limit:
            break
        new = prev
    return new


def plan_quota_reclaim(rnd: Round, job: JobView, need: int) -> ReclaimPlan | None:
    """Free ``need`` GPUs for ``job`` (which fits in its tenant's quota) from borrowing tenants."""
    plan = ReclaimPlan(releasing=min(rnd.releasing, need))
    left = need - plan.releasing
    committed = dict(rnd.committed)

    def borrowing(tenant) -> int:
        return committed[tenant] - rnd.quota(tenant)

    candidates = [j for j in rnd.active if j.tenant_id != job.tenant_id and j.id not in rnd.pinned]
    order = victim_order(candidates)
    for v in order:
        if left <= 0:
            break
        if not shrinkable(rnd, v) or borrowing(v.tenant_id) <= 0:
            continue
        new = _shrink_steps(rnd, v, left, borrowing(v.tenant_id))
        if new < rnd.size[v.id]:
            plan.shrinks.append((v, new))
            committed[v.tenant_id] -= rnd.size[v.id] - new
            left -= rnd.size[v.id] - new
    for v in order:
        if left <= 0:
            break
        if not (v.preemptible and v.state in ACTIVE and rnd.size[v.id] > 0):
            continue
        shrink = next((item for item in plan.shrinks if item[0].id == v.id), None)
        partial = rnd.size[v.id] - shrink[1] if shrink else 0
        if borrowing(v.tenant_id) + partial <= 0:
            continue
        if shrink:  # preempt it whole instead of shrinking it
            plan.shrinks.remove(shrink)
            committed[v.tenant_id] += partial
            left += partial
        plan.preempts.append(v)
        committed[v.tenant_id] -= rnd.size[v.id]
        left -= rnd.size[v.id]
    if left > 0:
        return None
    _prune(rnd, plan, need)
    return plan


def plan_fair_shrink(rnd: Round, job: JobView, need: int) -> ReclaimPlan | None:
    """Free ``need`` GPUs for a queued borrowing ``job`` by shrinking elastic extras only: extras of
    its own tenant's jobs of no higher priority, and extras of tenants that borrow and whose weighted
    share stays at least the share ``job``'s tenant will have once ``job`` runs."""
    plan = ReclaimPlan(releasing=min(rnd.releasing, need))
    left = need - plan.releasing
    committed = dict(rnd.committed)
    mine = job.tenant_id
    target_share = (committed[mine] + job.min_gpus) / rnd.weight(mine)
    candidates = [j for j in rnd.active if shrinkable(rnd, j)]
    for v in victim_order(candidates):
        if left <= 0:
            break
        t = v.tenant_id
        if t == mine:
            if v.priority > job.priority:
                continue
            limit = rnd.size[v.id]
        else:
            over_share = committed[t] - target_share * rnd.weight(t)
            limit = int(min(committed[t] - rnd.quota(t), over_share))
            if limit <= 0:
                continue
        new = _shrink_steps(rnd, v, left, limit)
        if new < rnd.size[v.id]:
            plan.shrinks.append((v, new))
            committed[t] -= rnd.size[v.id] - new
            left -= rnd.size[v.id] - new
    if left > 0:
        return None
    _prune(rnd, plan, need)
    return plan


def _prune(rnd: Round, plan: ReclaimPlan, need: int) -> None:
    """Drop victims (preemptions first, last chosen first) that the rest already cover."""
    for v in list(reversed(plan.preempts)):
        if plan.freed(rnd) - rnd.size[v.id] >= need:
            plan.preempts.remove(v)
    for item in list(reversed(plan.shrinks)):
        j, n = item
        if plan.freed(rnd) - (rnd.size[j.id] - n) >= need:
            plan.shrinks.remove(item)
    plan.releasing -= min(plan.releasing, max(0, plan.freed(rnd) - need))


def commit(rnd: Round, plan: ReclaimPlan, job: JobView, why: str) -> str:
    """Apply ``plan`` to the round for queued ``job`` and promise it its minimum; returns a reason."""
    detail = plan.describe(rnd)
    rnd.releasing -= plan.releasing
    for v, new in plan.shrinks:
        rnd.shrunk[v.id] = f"{why}: {rnd.size[v.id]} -> {new} GPUs, giving GPUs to queued job {job.id}"
        rnd.resize(v, new)
        rnd.pinned.add(v.id)
    for v in plan.preempts:
        rnd.preempt(
            v, f"{why}: tenant {v.tenant_id} borrows beyond its quota; GPUs go to queued job {job.id}"
        )
    reserved = min(rnd.avail, job.min_gpus)
    rnd.avail -= reserved
    rnd.committed[job.tenant_id] += job.min_gpus
    rnd.njobs[job.tenant_id] += 1
    rnd.reclaiming = True
    return f"{why}: holding {reserved} free GPU(s) and freeing {job.min_gpus - reserved} more ({detail}); starts next round"
