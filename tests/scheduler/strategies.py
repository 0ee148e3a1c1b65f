"""Hypothesis strategies: random but consistent cluster snapshots (no node over-allocated).

Hypothesis draws the shape (node count, job count, tenant count) and a seed; the details come from
``random.Random(seed)``. Far fewer draws per example keeps the whole directory fast on two shared
cores; shrinking still minimises the counts and the seed.
"""

from __future__ import annotations

import random

from hypothesis import strategies as st

from service.scheduler.types import ClusterSnapshot, JobState, JobView, NodeView, TenantView


def _curve(rng: random.Random) -> dict[int, float] | None:
    if rng.random() < 0.5:
        return None
    return {rng.randint(1, 16): rng.uniform(0.1, 100.0) for _ in range(rng.randint(1, 6))}


def build_snapshot(
    seed: int,
    n_nodes: int,
    n_tenants: int,
    n_jobs: int,
    quotas_fit: bool = True,
    states: tuple[str, ...] = (JobState.PENDING, JobState.RUNNING),
    estimates: bool = False,
) -> ClusterSnapshot:
    """A snapshot whose allocations fit the nodes. With ``quotas_fit`` the quotas add up to at most
    the healthy capacity and every running non-preemptible job fits in its tenant's quota (the
    premises of the quota guarantee)."""
    rng = random.Random(seed)
    sizes = [rng.choice([1, 2, 4, 8]) for _ in range(n_nodes)]
    bad = set(rng.sample(range(n_nodes), rng.randint(0, n_nodes // 2)))
    nodes = [NodeView(id=f"n{i}", gpus=g, healthy=i not in bad) for i, g in enumerate(sizes)]
    room = sum(g for i, g in enumerate(sizes) if i not in bad)
    tenants = []
    for t in range(n_tenants):
        quota = rng.randint(0, room) if quotas_fit else rng.randint(0, 16)
        if quotas_fit:
            room -= quota
        tenants.append(
            TenantView(
                id=f"t{t}",
                name=f"t{t}",
                gpu_quota=quota,
                weight=rng.choice([0.5, 1.0, 2.0, 3.0]),
                max_jobs=rng.choice([None, None, 1, 2, 3]),
            )
        )
    free = {n.id: n.gpus for n in nodes}
    held = {t.id: 0 for t in tenants}
    quota = {t.id: t.gpu_quota for t in tenants}
    jobs = []
    now = 10.0
    for i in range(n_jobs):
        tid = rng.choice(tenants).id
        mn = rng.randint(1, 8)
        mx = mn + rng.choice([0, 0, 1, 2, 4, 8])
        state = rng.choice(states)
        preemptible = rng.random() < 0.5
        alloc: dict[str, int] = {}
        if state != JobState.PENDING:
            want = rng.randint(mn, mx)
            order = [n.id for n in nodes]
            rng.shuffle(order)
            for nid in order:
                k = min(free[nid], want - sum(alloc.values()))
                if k > 0:
                    alloc[nid] = k
            if sum(alloc.values()) < want:
                state, alloc = JobState.PENDING, {}
            else:
                for nid, k in alloc.items():
                    free[nid] -= k
                if quotas_fit and held[tid] + want > quota[tid]:
                    preemptible = True  # only preemptible jobs borrow
                held[tid] += want
        jobs.append(
            JobView(
                id=f"j{i:02d}",
                tenant_id=tid,
                state=state,
                priority=rng.randint(-1, 2),
                min_gpus=mn,
                max_gpus=mx,
                submitted_at=float(rng.randint(0, 5)),
                allocated=alloc,
                preemptible=preemptible,
                elastic=rng.random() < 0.5,
                throughput=_curve(rng),
                started_at=float(rng.randint(0, 9)) if alloc else None,
                est_end=now + rng.randint(1, 100) if estimates and alloc else None,
                est_duration=float(rng.randint(1, 100)) if estimates and not alloc else None,
            )
        )
    return ClusterSnapshot(tenants=tenants, jobs=jobs, nodes=nodes, now=now)


def snapshots(
    max_nodes: int = 5,
    max_jobs: int = 12,
    quotas_fit: bool = True,
    states: tuple[str, ...] = (JobState.PENDING, JobState.RUNNING),
    estimates: bool = False,
) -> st.SearchStrategy[ClusterSnapshot]:
    return st.builds(
        build_snapshot,
        seed=st.integers(0, 2**32 - 1),
        n_nodes=st.integers(1, max_nodes),
        n_tenants=st.integers(1, 4),
        n_jobs=st.integers(0, max_jobs),
        quotas_fit=st.just(quotas_fit),
        states=st.just(states),
        estimates=st.just(estimates),
    )


def build_backfill_snapshot(seed: int, n_nodes: int, n_small: int) -> ClusterSnapshot:
    """A busy cluster (running jobs with estimated ends), one big high-priority job at the head of
    the queue and ``n_small`` small queued jobs with run-time estimates: backfill territory."""
    rng = random.Random(seed)
    base = build_snapshot(
        seed, n_nodes, rng.randint(1, 3), rng.randint(2, 10), quotas_fit=False, estimates=True
    )
    capacity = sum(n.gpus for n in base.nodes if n.healthy)
    jobs = list(base.jobs)
    tenant_ids = [t.id for t in base.tenants]
    jobs.append(
        JobView(
            id="head",
            tenant_id=rng.choice(tenant_ids),
            priority=9,
            min_gpus=max(1, capacity - rng.randint(0, 2)),
            submitted_at=-1.0,
            est_duration=50.0,
        )
    )
    for i in range(n_small):
        jobs.append(
            JobView(
                id=f"s{i:02d}",
                tenant_id=rng.choice(tenant_ids),
                min_gpus=rng.randint(1, 3),
                submitted_at=float(rng.randint(0, 5)),
                est_duration=float(rng.randint(1, 150)),
                max_gpus=rng.randint(3, 6),
                elastic=rng.random() < 0.5,
            )
        )
    return ClusterSnapshot(tenants=base.tenants, jobs=jobs, nodes=base.nodes, now=base.now)


def backfill_snapshots() -> st.SearchStrategy[ClusterSnapshot]:
    return st.builds(
        build_backfill_snapshot,
        seed=st.integers(0, 2**32 - 1),
        n_nodes=st.integers(2, 6),
        n_small=st.integers(1, 10),
    )
