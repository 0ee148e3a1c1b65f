"""An offline simulator: the same ``decide`` over a synthetic workload, event by event.

The simulator plays the controller and the runtime: it builds a ``ClusterSnapshot`` at every event
(arrival, completion, node failure or repair), calls the policy, checks the decisions (no GPU given
twice, every running job within its min..max, only free GPUs handed out) and applies them. Work is
measured in GPU-seconds at the job's minimum size; a job on ``n`` GPUs progresses at its normalised
goodput (``goodput.Curve.value(n)``), so elastic jobs finish sooner when grown. Preemption keeps the
progress made (the job checkpointed), a node failure loses the GPUs on that node: the job goes on
with what is left when that is still at least its minimum (the runtime re-plans), else it is
requeued. Run-time estimates given to the policy are exact.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from service.scheduler.goodput import Curve
from service.scheduler.policy import decide
from service.scheduler.types import (
    Admit,
    ClusterSnapshot,
    Decision,
    Grow,
    Id,
    JobState,
    JobView,
    NodeView,
    Preempt,
    Shrink,
    TenantView,
    Wait,
)


@dataclass(frozen=True)
class SimJob:
    """A job of the workload: ``work`` GPU-seconds at its minimum size, arriving at ``submit_at``."""

    id: Id
    tenant_id: Id
    submit_at: float
    work: float
    min_gpus: int
    max_gpus: int
    priority: int = 0
    elastic: bool = True
    preemptible: bool = True
    throughput: dict[int, float] | None = None


@dataclass(frozen=True)
class NodeFailure:
    """``node_id`` fails at ``at`` and is healthy again ``repair_after`` seconds later."""

    node_id: str
    at: float
    repair_after: float


@dataclass(frozen=True)
class Workload:
    tenants: tuple[TenantView, ...]
    nodes: tuple[NodeView, ...]
    jobs: tuple[SimJob, ...]
    failures: tuple[NodeFailure, ...] = ()


@dataclass
class SimResult:
    """What a run measured. ``utilisation`` is GPU-seconds allocated over GPU-seconds of healthy
    capacity until the last job ended; ``tenant_share`` each tenant's fraction of allocated
    GPU-seconds; waits are first admission minus submission."""

    utilisation: float
    tenant_share: dict[Id, float]
    mean_wait: float
    p50_wait: float
    p95_wait: float
    completed: int
    unfinished: int
    makespan: float
    rounds: int
    decide_seconds: float
    counts: dict[str, int] = field(default_factory=dict)
    tenant_wait: dict[Id, float] = field(default_factory=dict)  # mean queue wait per tenant

    def to_dict(self) -> dict:
        return {
            "utilisation": round(self.utilisation, 4),
            "tenant_share": {str(k): round(v, 4) for k, v in sorted(self.tenant_share.items())},
            "mean_wait": round(self.mean_wait, 2),
            "p50_wait": round(self.p50_wait, 2),
            "p95_wait": round(self.p95_wait, 2),
            "completed": self.completed,
            "unfinished": self.unfinished,
            "makespan": round(self.makespan, 2),
            "rounds": self.rounds,
            "decide_seconds": round(self.decide_seconds, 4),
            "counts": dict(sorted(self.counts.items())),
            "tenant_wait": {str(k): round(v, 2) for k, v in sorted(self.tenant_wait.items())},
        }


@dataclass
class _Live:
    spec: SimJob
    curve: Curve
    state: str = JobState.PENDING
    alloc: dict[str, int] = field(default_factory=dict)
    done: float = 0.0
    started_at: float | None = None
    first_admit: float | None = None
    finished_at: float | None = None

    @property
    def size(self) -> int:
        return sum(self.alloc.values())

    def rate(self) -> float:
        return self.curve.value(self.size) if self.size else 0.0

    def view(self, now: float) -> JobView:
        s = self.spec
        left = max(0.0, s.work - self.done)
        rate = self.rate()
        return JobView(
            id=s.id,
            tenant_id=s.tenant_id,
            state=self.state,
            priority=s.priority,
            min_gpus=s.min_gpus,
            max_gpus=s.max_gpus,
            submitted_at=s.submit_at,
            allocated=dict(self.alloc),
            preemptible=s.preemptible,
            elastic=s.elastic,
            throughput=s.throughput,
            started_at=self.started_at,
            est_end=now + left / rate if rate > 0 else None,
            est_duration=left / self.curve.value(s.min_gpus),
        )


Policy = Callable[[ClusterSnapshot], list[Decision]]


def simulate(
    workload: Workload, policy: Policy = decide, horizon: float = math.inf, max_rounds: int = 4
) -> SimResult:
    """Run ``workload`` until every job finished (or ``horizon``); see the module docstring."""
    cap = {n.id: n.gpus for n in workload.nodes}
    healthy = {n.id: n.healthy for n in workload.nodes}
    jobs = {
        j.id: _Live(
            j,
            Curve(
                JobView(
                    id=j.id,
                    tenant_id=j.tenant_id,
                    min_gpus=j.min_gpus,
                    max_gpus=j.max_gpus,
                    throughput=j.throughput,
                )
            ),
        )
        for j in workload.jobs
    }
    arrivals = sorted(workload.jobs, key=lambda j: (j.submit_at, j.id))
    node_events = sorted(
        [(f.at, 0, f.node_id) for f in workload.failures]
        + [(f.at + f.repair_after, 1, f.node_id) for f in workload.failures]
    )
    counts = {"admit": 0, "grow": 0, "shrink": 0, "preempt": 0, "requeued_by_failure": 0}
    gpu_seconds: dict[Id, float] = {t.id: 0.0 for t in workload.tenants}
    busy = capacity_seconds = 0.0
    now = 0.0
    ai = ei = rounds = 0
    decide_s = 0.0
    queued: set[Id] = set()
    running: set[Id] = set()

    def next_completion() -> float:
        best = math.inf
        for jid in running:
            lj = jobs[jid]
            rate = lj.rate()
            if rate > 0:
                best = min(best, now + (lj.spec.work - lj.done) / rate)
        return best

    while ai < len(arrivals) or running or (queued and ei < len(node_events)):
        t_next = min(
            arrivals[ai].submit_at if ai < len(arrivals) else math.inf,
            node_events[ei][0] if ei < len(node_events) else math.inf,
            next_completion(),
        )
        if t_next == math.inf or t_next > horizon:
            break
        dt = t_next - now
        for jid in running:
            lj = jobs[jid]
            lj.done += lj.rate() * dt
            gpu_seconds[lj.spec.tenant_id] += lj.size * dt
            busy += lj.size * dt
        capacity_seconds += sum(cap[n] for n in cap if healthy[n]) * dt
        now = t_next
        for jid in sorted(running):
            lj = jobs[jid]
            if lj.done >= lj.spec.work - 1e-6 * max(1.0, lj.spec.work):
                lj.state, lj.alloc, lj.finished_at = JobState.SUCCEEDED, {}, now
                running.discard(jid)
        while ai < len(arrivals) and arrivals[ai].submit_at <= now:
            queued.add(arrivals[ai].id)
            ai += 1
        while ei < len(node_events) and node_events[ei][0] <= now:
            _, kind, node = node_events[ei]
            ei += 1
            healthy[node] = kind == 1
            if kind == 0:
                for jid in sorted(running):
                    lj = jobs[jid]
                    if node in lj.alloc:
                        del lj.alloc[node]
                        if lj.size < lj.spec.min_gpus:
                            lj.state, lj.alloc = JobState.PENDING, {}
                            running.discard(jid)
                            queued.add(jid)
                            counts["requeued_by_failure"] += 1
        for _ in range(max_rounds):
            snap = ClusterSnapshot(
                tenants=workload.tenants,
                jobs=[jobs[j].view(now) for j in sorted(running | queued)],
                nodes=[NodeView(n.id, n.gpus, healthy=healthy[n.id]) for n in workload.nodes],
                now=now,
            )
            t0 = time.perf_counter()
            decisions = policy(snap)
            decide_s += time.perf_counter() - t0
            rounds += 1
            changed = _apply(decisions, jobs, running, queued, cap, healthy, now, counts)
            check_invariants(jobs, cap)
            if not changed:
                break
    waits = [lj.first_admit - lj.spec.submit_at for lj in jobs.values() if lj.first_admit is not None]
    per_tenant: dict[Id, list[float]] = {t.id: [] for t in workload.tenants}
    for lj in jobs.values():
        if lj.first_admit is not None:
            per_tenant[lj.spec.tenant_id].append(lj.first_admit - lj.spec.submit_at)
    total = sum(gpu_seconds.values())
    return SimResult(
        utilisation=busy / capacity_seconds if capacity_seconds else 0.0,
        tenant_share={t: (v / total if total else 0.0) for t, v in gpu_seconds.items()},
        mean_wait=statistics.fmean(waits) if waits else 0.0,
        p50_wait=_pct(waits, 50),
        p95_wait=_pct(waits, 95),
        completed=sum(1 for lj in jobs.values() if lj.state == JobState.SUCCEEDED),
        unfinished=sum(1 for lj in jobs.values() if lj.state != JobState.SUCCEEDED),
        makespan=now,
        rounds=rounds,
        decide_seconds=decide_s,
        counts=counts,
        tenant_wait={t: (statistics.fmean(w) if w else 0.0) for t, w in per_tenant.items()},
    )


def _pct(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    xs = sorted(values)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def _apply(decisions, jobs, running, queued, cap, healthy, now, counts) -> bool:
    changed = False
    for d in decisions:
        lj = jobs[d.job_id]
        if isinstance(d, Wait):
            assert lj.state == JobState.PENDING, f"Wait for a job in {lj.state}"
            continue
        changed = True
        counts[d.kind] += 1
        if isinstance(d, Admit):
            assert lj.state == JobState.PENDING, f"Admit for a job in {lj.state}"
            lj.state, lj.alloc = JobState.RUNNING, dict(d.placement)
            lj.started_at = now
            lj.first_admit = now if lj.first_admit is None else lj.first_admit
            queued.discard(d.job_id)
            running.add(d.job_id)
        elif isinstance(d, (Grow, Shrink)):
            assert lj.state == JobState.RUNNING, f"{d.kind} for a job in {lj.state}"
            lj.alloc = dict(d.placement)
        elif isinstance(d, Preempt):
            assert lj.state == JobState.RUNNING, f"Preempt for a job in {lj.state}"
            lj.state, lj.alloc = JobState.PENDING, {}
            running.discard(d.job_id)
            queued.add(d.job_id)
    for jid in running:
        for node in jobs[jid].alloc:
            assert healthy[node], f"job {jid} placed on unhealthy node {node}"
    return changed


def check_invariants(jobs: dict[Id, _Live], cap: dict[str, int]) -> None:
    """No node over capacity; every running job within its min..max."""
    used: dict[str, int] = {}
    for lj in jobs.values():
        if lj.state == JobState.RUNNING:
            assert lj.spec.min_gpus <= lj.size <= lj.spec.max_gpus, f"job {lj.spec.id} has {lj.size} GPUs"
            for node, k in lj.alloc.items():
                used[node] = used.get(node, 0) + k
    for node, k in used.items():
        assert k <= cap[node], f"node {node}: {k} GPUs given out of {cap[node]}"


def synthetic_workload(
    seed: int = 0,
    n_jobs: int = 200,
    n_nodes: int = 16,
    gpus_per_node: int = 8,
    tenants: tuple[tuple[str, int, float], ...] = (("a", 48, 2.0), ("b", 32, 1.0), ("c", 0, 1.0)),
    mean_interarrival: float = 30.0,
    failures: int = 2,
) -> Workload:
    """Poisson arrivals from the ``(name, quota, weight)`` tenants; sizes 1..32 GPUs (powers of two
    mostly), a third elastic with a concave (saturating) goodput curve; ``failures`` node failures
    spread over the arrival period, each repaired after 10 minutes."""
    rng = random.Random(seed)
    tviews = tuple(TenantView(id=name, name=name, gpu_quota=q, weight=w) for name, q, w in tenants)
    nodes = tuple(NodeView(id=f"node-{i:04d}", gpus=gpus_per_node) for i in range(n_nodes))
    jobs = []
    t = 0.0
    for i in range(n_jobs):
        t += rng.expovariate(1.0 / mean_interarrival)
        tview = rng.choice(tviews)
        tenant = tview.id
        size = rng.choice([1, 1, 2, 2, 4, 4, 8, 8, 16, 32])
        elastic = rng.random() < 0.33 and size >= 2
        top = min(size * 4, n_nodes * gpus_per_node) if elastic else size
        curve = None
        if elastic:
            half = rng.uniform(1.0, 3.0) * size  # the GPU count at which scaling efficiency halves
            curve = {n: n / (1.0 + n / half) for n in range(size, top + 1)}
        jobs.append(
            SimJob(
                id=i,
                tenant_id=tenant,
                submit_at=round(t, 3),
                work=rng.uniform(300.0, 3600.0) * size,
                min_gpus=size,
                max_gpus=top,
                priority=rng.choice([0, 0, 0, 1, 2]),
                elastic=elastic,
                preemptible=tview.gpu_quota == 0 or rng.random() < 0.9,  # a quota-less tenant only borrows
                throughput=curve,
            )
        )
    fails = tuple(
        NodeFailure(node_id=rng.choice(nodes).id, at=round(rng.uniform(0.0, t), 3), repair_after=600.0)
        for _ in range(failures)
    )
    return Workload(tenants=tviews, nodes=nodes, jobs=tuple(jobs), failures=fails)
