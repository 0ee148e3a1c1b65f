"""The offline simulator: the same ``decide`` over synthetic workloads, with invariants checked
after every round (``simulate.check_invariants``)."""

from __future__ import annotations

import pytest

from service.scheduler.types import NodeView, TenantView
from service.scheduler.workload_sim import NodeFailure, SimJob, Workload, simulate, synthetic_workload

pytestmark = pytest.mark.unit


def test_synthetic_workload_runs_to_completion_with_failures():
    wl = synthetic_workload(seed=3, n_jobs=60, n_nodes=6, failures=3, mean_interarrival=60.0)
    res = simulate(wl)
    assert res.completed == 60 and res.unfinished == 0
    assert 0.3 < res.utilisation <= 1.0
    assert sum(res.tenant_share.values()) == pytest.approx(1.0)
    assert res.counts["admit"] >= 60
    assert res.p50_wait <= res.p95_wait


def test_simulation_is_deterministic():
    wl = synthetic_workload(seed=5, n_jobs=40, n_nodes=4)
    a, b = simulate(wl).to_dict(), simulate(wl).to_dict()
    a.pop("decide_seconds")
    b.pop("decide_seconds")
    assert a == b


def _flood(tenants, n_nodes=1, gpus=6, per_tenant=40):
    jobs = [
        SimJob(id=f"{t.id}{i:03d}", tenant_id=t.id, submit_at=0.0, work=100.0, min_gpus=1, max_gpus=1)
        for t in tenants
        for i in range(per_tenant)
    ]
    return Workload(
        tenants=tuple(tenants), nodes=tuple(NodeView(f"n{i}", gpus) for i in range(n_nodes)), jobs=tuple(jobs)
    )


def test_weighted_fair_share_over_time():
    wl = _flood([TenantView("x", weight=2.0), TenantView("y", weight=1.0)])
    res = simulate(wl, horizon=600.0)
    assert res.tenant_share["x"] == pytest.approx(2 / 3, abs=0.02)
    assert res.utilisation == pytest.approx(1.0)


def test_quota_tenant_is_served_first_when_the_cluster_is_full():
    wl = _flood([TenantView("q", gpu_quota=4), TenantView("z")])
    res = simulate(wl, horizon=600.0)
    assert res.tenant_share["q"] == pytest.approx(4 / 6, abs=0.02)


def test_node_failure_requeues_and_recovers():
    tenants = (TenantView("a"),)
    nodes = (NodeView("n0", 4), NodeView("n1", 4))
    jobs = (
        SimJob("big", "a", 0.0, work=8 * 1000.0, min_gpus=8, max_gpus=8),
        SimJob("el", "a", 0.0, work=4 * 100.0, min_gpus=2, max_gpus=4),
    )
    wl = Workload(tenants, nodes, jobs, failures=(NodeFailure("n1", at=10.0, repair_after=100.0),))
    res = simulate(wl)
    assert res.completed == 2
    assert res.counts["requeued_by_failure"] == 1  # "big" could not go on with 4 GPUs
