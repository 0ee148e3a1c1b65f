"""Scheduler benchmark: one decision round with 10,000 queued jobs on 2,000 nodes, against a naive
first-fit scan measured in the same run, plus a simulator summary.

``run(quick=False) -> {"name": "scheduler", "rows": [...], "markdown": "..."}`` (``orthoplex bench
scheduler``). The round's snapshot: 2,000 nodes of 8 GPUs (1% unhealthy), about half the GPUs held by
running jobs, 20 tenants with quotas over 60% of the cluster, and 10,000 queued jobs of 1-64 GPUs
(a quarter elastic, with planner-like goodput curves; run-time estimates on all, so backfill is on).
The baseline is what a first version would do: walk the queue in priority order and, for each job,
scan every node for free GPUs (O(jobs x nodes)), with no quotas, fairness, reservation or elasticity.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from typing import Any

from service.scheduler.policy import decide
from service.scheduler.types import ClusterSnapshot, JobState, JobView, NodeView, TenantView
from service.scheduler.workload_sim import simulate, synthetic_workload

SIZES = (1, 1, 2, 2, 4, 4, 8, 8, 8, 16, 32, 64)


def _curve(rng: random.Random, lo: int, hi: int) -> dict[int, float]:
    half = rng.uniform(1.0, 4.0) * lo
    sizes = sorted({lo, hi} | {s for s in (2, 4, 8, 16, 32, 64, 128) if lo < s < hi})
    return {n: 1000.0 * n / (1.0 + n / half) for n in sizes}


def make_snapshot(
    n_jobs: int = 10_000,
    n_nodes: int = 2_000,
    gpus_per_node: int = 8,
    seed: int = 0,
    elastic_share: float = 0.25,
) -> ClusterSnapshot:
    """The benchmark's cluster and queue (deterministic for a seed); ``elastic_share`` of the jobs
    have a min..max range and a goodput curve."""
    rng = random.Random(seed)
    nodes = [NodeView(f"node-{i:05d}", gpus_per_node, healthy=rng.random() > 0.01) for i in range(n_nodes)]
    capacity = sum(n.gpus for n in nodes if n.healthy)
    weights = [rng.choice([1.0, 1.0, 2.0, 4.0]) for _ in range(20)]
    tenants = [
        TenantView(
            f"tenant-{t:02d}", f"tenant-{t:02d}", gpu_quota=int(0.6 * capacity * w / sum(weights)), weight=w
        )
        for t, w in enumerate(weights)
    ]
    jobs: list[JobView] = []
    free = {n.id: n.gpus for n in nodes if n.healthy}
    order = sorted(free)
    cursor = 0
    used = 0
    jid = 0
    while used < capacity // 2:  # running jobs fill about half the cluster, packed
        size = rng.choice(SIZES)
        alloc: dict[str, int] = {}
        need = size
        while need and cursor < len(order):
            node = order[cursor]
            k = min(free[node], need)
            if k:
                alloc[node] = k
                free[node] -= k
                need -= k
            if free[node] == 0:
                cursor += 1
        if need:
            break
        elastic = rng.random() < elastic_share and size >= 2
        jobs.append(
            JobView(
                id=jid,
                tenant_id=rng.choice(tenants).id,
                state=JobState.RUNNING,
                priority=rng.choice([0, 0, 1, 2]),
                min_gpus=size if not elastic else max(1, size // 2),
                max_gpus=size if not elastic else size * 2,
                submitted_at=float(jid),
                allocated=alloc,
                elastic=elastic,
                throughput=_curve(rng, max(1, size // 2), size * 2) if elastic else None,
                started_at=float(jid),
                est_end=1e5 + rng.uniform(0, 1e5),
            )
        )
        used += size
        jid += 1
    for _ in range(n_jobs):
        size = rng.choice(SIZES)
        elastic = rng.random() < elastic_share and size >= 2
        top = size * 4 if elastic else size
        jobs.append(
            JobView(
                id=jid,
                tenant_id=rng.choice(tenants).id,
                priority=rng.choice([0, 0, 0, 1, 2]),
                min_gpus=size,
                max_gpus=top,
                submitted_at=1e4 + jid,
                elastic=elastic,
                preemptible=rng.random() < 0.95,
                throughput=_curve(rng, size, top) if elastic else None,
                est_duration=rng.uniform(600, 86_400),
            )
        )
        jid += 1
    rng.shuffle(jobs)
    return ClusterSnapshot(tenants=tenants, jobs=jobs, nodes=nodes, now=1e5)


def naive_first_fit(snapshot: ClusterSnapshot) -> dict[Any, dict[str, int]]:
    """The baseline: for each queued job (priority, then FIFO), scan all nodes, take free GPUs."""
    free = {n.id: n.gpus for n in snapshot.nodes if n.healthy}
    for j in snapshot.jobs:
        for node, k in j.allocated.items():
            if node in free:
                free[node] -= k
    nodes = sorted(free)
    queue = sorted(
        (j for j in snapshot.jobs if j.state == JobState.PENDING), key=lambda j: (-j.priority, j.submitted_at)
    )
    admitted: dict[Any, dict[str, int]] = {}
    for job in queue:
        need, got = job.min_gpus, {}
        for node in nodes:  # O(nodes) per job
            k = min(free[node], need)
            if k:
                got[node] = k
                need -= k
                if not need:
                    break
        if need == 0:
            for node, k in got.items():
                free[node] -= k
            admitted[job.id] = got
    return admitted


def _time(fn, arg, repeats: int) -> tuple[float, float, Any]:
    """Median wall and CPU seconds of ``fn(arg)`` over ``repeats`` calls, and the last result. CPU
    time is reported too because the benchmark machine may be shared (wall time then overstates)."""
    walls, cpus, out = [], [], None
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        out = fn(arg)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls), statistics.median(cpus), out


def _load() -> str:
    try:
        return " / ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover - not on every platform
        return "n/a"


def run(quick: bool = False) -> dict:
    """One decision round at 10k jobs x 2k nodes (and a smaller one), baseline, simulator summary."""
    repeats = 1 if quick else 5
    rows: list[dict[str, Any]] = []
    cases = [(1_000, 200, 0.25, ""), (10_000, 2_000, 0.25, ""), (10_000, 2_000, 0.0, ", fixed-size jobs")]
    if quick:  # a smoke run: the naive baseline alone takes seconds at full size
        cases = [(1_000, 200, 0.25, ""), (2_000, 400, 0.0, ", fixed-size jobs")]
    for n_jobs, n_nodes, elastic_share, note in cases:
        snap = make_snapshot(n_jobs, n_nodes, elastic_share=elastic_share)
        t_decide, c_decide, decisions = _time(decide, snap, repeats)
        t_naive, c_naive, naive = _time(naive_first_fit, snap, 1)
        kinds: dict[str, int] = {}
        for d in decisions:
            kinds[d.kind] = kinds.get(d.kind, 0) + 1
        rows.append(
            {
                "case": f"{n_jobs} queued x {n_nodes} nodes{note}",
                "jobs": len(snap.jobs),
                "gpus": sum(n.gpus for n in snap.nodes),
                "decide_wall_s": round(t_decide, 4),
                "decide_cpu_s": round(c_decide, 4),
                "naive_first_fit_wall_s": round(t_naive, 4),
                "naive_first_fit_cpu_s": round(c_naive, 4),
                "speedup_cpu": round(c_naive / c_decide, 1) if c_decide else None,
                "admitted": kinds.get("admit", 0),
                "backfilled": sum(
                    1 for d in decisions if d.kind == "admit" and d.reason.startswith("backfill")
                ),
                "naive_admitted": len(naive),
                "decisions": dict(sorted(kinds.items())),
                "repeats": repeats,
            }
        )
    wl = synthetic_workload(
        seed=0, n_jobs=100 if quick else 300, n_nodes=16, mean_interarrival=45.0, failures=3
    )
    sim = simulate(wl).to_dict()
    rows.append({"case": "simulator", **sim})
    md = [
        "| case | decide wall (s) | decide CPU (s) | naive first-fit wall (s) | naive CPU (s) | speedup (CPU) "
        "| admitted (policy / naive) | backfilled | decisions |",
        "|---|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    for r in rows[:-1]:
        md.append(
            f"| {r['case']} | {r['decide_wall_s']:.3f} | {r['decide_cpu_s']:.3f} | {r['naive_first_fit_wall_s']:.3f} "
            f"| {r['naive_first_fit_cpu_s']:.3f} | {r['speedup_cpu']}x | {r['admitted']} / {r['naive_admitted']} "
            f"| {r['backfilled']} | {r['decisions']} |"
        )
    md += [
        "",
        f"Simulator ({len(wl.jobs)} jobs, {len(wl.nodes)} nodes x 8 GPUs, 3 tenants, {len(wl.failures)} node "
        f"failures): utilisation {sim['utilisation']:.1%}, queue wait mean {sim['mean_wait']:.0f} s / "
        f"p50 {sim['p50_wait']:.0f} s / p95 {sim['p95_wait']:.0f} s, GPU share {sim['tenant_share']}, "
        f"mean wait by tenant {sim['tenant_wait']}, {sim['completed']} completed, decisions {sim['counts']}, "
        f"{sim['rounds']} rounds in {sim['decide_seconds']:.2f} s.",
        "",
        "The naive baseline admits by priority/FIFO only (no quotas, fair share, reservation, backfill "
        "rules or elastic sizing), so its admitted count is not a target; the time is the comparison. "
        f"decide: median of {repeats} run(s); naive: one run. Load average when it finished: "
        f"{_load()}.",
    ]
    return {"name": "scheduler", "rows": rows, "markdown": "\n".join(md)}


if __name__ == "__main__":  # pragma: no cover
    import json

    result = run(quick=True)
    print(json.dumps(result["rows"], indent=2))
    print(result["markdown"])
