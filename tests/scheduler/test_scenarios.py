"""Scenario tests of the scheduling policy: each sets up a small cluster and checks one rule."""

from __future__ import annotations

import pytest

from service.scheduler.policy import decide
from service.scheduler.types import Admit, JobState, JobView, NodeView, Preempt, Shrink, Wait
from tests.scheduler.helpers import apply, by_kind, check_round, nodes, pending, running, settle, snap, tenant

pytestmark = pytest.mark.unit


def run(s):
    d = decide(s)
    check_round(s, d)
    return d, by_kind(d)


# ------------------------------------------------------------------------ gang admission, placement


def test_gang_waits_until_its_minimum_fits_then_starts():
    s = snap([tenant("a")], [running(1, "a", {"n0": 4}), pending(2, "a", 6)], nodes(8))
    _, k = run(s)
    assert list(k["wait"]) == [2] and not k["admit"]
    assert "needs 6 GPUs, 4 free" in k["wait"][2].reason
    s = snap([tenant("a")], [pending(2, "a", 6)], nodes(8))
    _d, k = run(s)
    assert k["admit"][2].gpus == 6 and k["admit"][2].placement == {"n0": 6}


def test_placement_best_fit_then_whole_nodes_first():
    ns = [
        NodeView("n0", 8),
        NodeView("n1", 8, free_gpus=3),
        NodeView("n2", 8, free_gpus=4),
        NodeView("n3", 8),
    ]
    s = snap([tenant("a")], [pending(1, "a", 4), pending(2, "a", 16, submitted_at=1)], ns)
    _, k = run(s)
    assert k["admit"][1].placement == {"n2": 4}  # the tightest node that holds it
    assert k["admit"][2].placement == {"n0": 8, "n3": 8}  # two whole nodes, not scraps
    s = snap([tenant("a")], [pending(3, "a", 11)], ns)
    _, k = run(s)
    assert k["admit"][3].placement == {"n0": 8, "n1": 3}  # one whole node, remainder best fit


def test_unhealthy_nodes_are_ignored():
    s = snap(
        [tenant("a")], [pending(1, "a", 8), pending(2, "a", 4, submitted_at=1)], nodes(8, 4, unhealthy=[0])
    )
    _, k = run(s)
    assert "healthy nodes have 4" in k["wait"][1].reason
    assert k["admit"][2].placement == {"n1": 4}
    # a running job's GPUs on a failed node are not counted as free or as held
    s = snap(
        [tenant("a", quota=4)], [running(3, "a", {"n0": 8}), pending(4, "a", 4)], nodes(8, 4, unhealthy=[0])
    )
    _, k = run(s)
    assert k["admit"][4].placement == {"n1": 4}


def test_a_draining_node_takes_no_new_work_until_undrained():
    drain = [NodeView("n0", 8, draining=True), NodeView("n1", 4)]
    # the job on the draining node keeps what it holds there (it moves off itself); nothing new goes there
    s = snap([tenant("a")], [running(1, "a", {"n0": 2}), pending(2, "a", 4), pending(3, "a", 2, submitted_at=1)], drain)
    _, k = run(s)
    assert k["admit"][2].placement == {"n1": 4} and 3 in k["wait"] and not k["preempt"] and not k["shrink"]
    # an elastic job is not grown onto it either
    s = snap([tenant("a")], [running(4, "a", {"n1": 2}, max_gpus=12)], drain)
    _, k = run(s)
    assert all("n0" not in g.added for g in k["grow"].values())
    # undrained: the same pending job fits on it
    s = snap([tenant("a")], [running(1, "a", {"n0": 2}), pending(2, "a", 6)], [NodeView("n0", 8), NodeView("n1", 4)])
    _, k = run(s)
    assert k["admit"][2].placement == {"n0": 6}


def test_given_free_gpus_can_only_lower_capacity():
    ns = [NodeView("n0", 8, free_gpus=2)]
    _, k = run(snap([tenant("a")], [pending(1, "a", 4), pending(2, "a", 2, submitted_at=1)], ns))
    assert 1 in k["wait"]


# ------------------------------------------------------------------------ order: priority, FIFO, fair


def test_priority_within_a_tenant():
    jobs = [pending(1, "a", 8, priority=0, submitted_at=0), pending(2, "a", 8, priority=5, submitted_at=9)]
    _, k = run(snap([tenant("a")], jobs, nodes(8)))
    assert list(k["admit"]) == [2] and list(k["wait"]) == [1]


def test_fifo_among_equals_then_id():
    jobs = [
        pending(3, "a", 8, submitted_at=5),
        pending(1, "a", 8, submitted_at=7),
        pending(2, "a", 8, submitted_at=5),
    ]
    _, k = run(snap([tenant("a")], jobs, nodes(8, 8)))
    assert sorted(k["admit"]) == [2, 3] and list(k["wait"]) == [1]


def test_weighted_fair_share_among_borrowers():
    jobs = [pending(f"x{i:02d}", "x", 1, submitted_at=i) for i in range(20)]
    jobs += [pending(f"y{i:02d}", "y", 1, submitted_at=i) for i in range(20)]
    _, k = run(snap([tenant("x", weight=2.0), tenant("y", weight=1.0)], jobs, nodes(4, 4, 4)))
    got = {"x": 0, "y": 0}
    for job_id in k["admit"]:
        got[job_id[0]] += 1
    assert got == {"x": 8, "y": 4}
    # FIFO inside each tenant
    assert sorted(j for j in k["admit"] if j[0] == "x") == [f"x{i:02d}" for i in range(8)]


def test_fair_share_counts_what_tenants_already_hold():
    jobs = [running("x-run", "x", {"n0": 4})] + [
        pending(f"p{t}{i}", t, 1, submitted_at=i) for t in "xy" for i in range(8)
    ]
    _, k = run(snap([tenant("x"), tenant("y")], jobs, nodes(4, 4)))
    assert sorted(k["admit"]) == [f"py{i}" for i in range(4)]


def test_max_jobs_per_tenant():
    jobs = [running(1, "a", {"n0": 1}), pending(2, "a", 1)]
    _, k = run(snap([tenant("a", max_jobs=1)], jobs, nodes(8)))
    assert "maximum of 1 job" in k["wait"][2].reason


# ------------------------------------------------------------------------ quotas, borrowing, reclaim


def test_idle_capacity_is_borrowed_beyond_quota():
    _, k = run(snap([tenant("a", quota=2), tenant("b", quota=6)], [pending(1, "a", 8)], nodes(8)))
    assert k["admit"][1].gpus == 8 and "borrowing 6" in k["admit"][1].reason


def test_quota_reclaim_preempts_most_recent_lowest_priority_borrower_only():
    jobs = [
        running("b-old", "b", {"n0": 4}, started_at=1.0),
        running("b-new", "b", {"n0": 4}, started_at=2.0),
        running("b-low", "b", {"n1": 4}, started_at=0.5, priority=-1),
        running("b-hi", "b", {"n1": 4}, started_at=3.0, priority=3),
        pending("a1", "a", 4, submitted_at=5.0),
    ]
    s = snap([tenant("a", quota=8), tenant("b", quota=8)], jobs, nodes(8, 8))
    d, k = run(s)
    assert list(k["preempt"]) == ["b-low"]  # lowest priority first, one victim is enough
    assert "quota reclaim" in k["wait"]["a1"].reason and not k["admit"]
    assert d[0].kind == "preempt"
    s = apply(s, d)
    _, k = run(s)
    assert k["admit"]["a1"].gpus == 4  # the freed GPUs go to the tenant within its quota
    # among equal priorities the most recently started borrower goes first
    jobs = [
        running("b-old", "b", {"n0": 4}, started_at=1.0),
        running("b-new", "b", {"n0": 4}, started_at=2.0),
        pending("a1", "a", 4),
    ]
    _, k = run(snap([tenant("a", quota=4), tenant("b", quota=4)], jobs, nodes(8)))
    assert list(k["preempt"]) == ["b-new"]


def test_reclaim_uses_minimal_set_of_victims():
    jobs = [
        running("b1", "b", {"n0": 2}, started_at=3.0),
        running("b2", "b", {"n0": 6}, started_at=2.0),
        running("b3", "b", {"n1": 8}, started_at=1.0),
        pending("a1", "a", 6),
    ]
    _, k = run(snap([tenant("a", quota=8), tenant("b", quota=8)], jobs, nodes(8, 8)))
    # b1 (most recent) alone is not enough; b1+b2 would be, and then b1 is redundant
    assert list(k["preempt"]) == ["b2"]


def test_reclaim_never_takes_from_tenants_within_quota():
    jobs = [running("b1", "b", {"n0": 8}), pending("a1", "a", 4)]
    _d, k = run(snap([tenant("a", quota=4), tenant("b", quota=8)], jobs, nodes(8)))
    assert not k["preempt"] and not k["shrink"] and list(k["wait"]) == ["a1"]


def test_reclaim_shrinks_elastic_borrower_before_preempting():
    jobs = [
        running("b1", "b", {"n0": 8}, started_at=2.0),
        running("b2", "b", {"n1": 8}, min_gpus=4, max_gpus=8, started_at=1.0),
        pending("a1", "a", 4),
    ]
    s = snap([tenant("a", quota=8), tenant("b", quota=8)], jobs, nodes(8, 8))
    d, k = run(s)
    assert not k["preempt"] and k["shrink"]["b2"].gpus == 4
    assert sum(k["shrink"]["b2"].released.values()) == 4
    s = apply(s, d)
    _, k = run(s)
    assert k["admit"]["a1"].placement == {"n1": 4}


def test_preempted_gpus_being_released_are_not_reclaimed_twice():
    jobs = [
        JobView("b1", "b", JobState.PREEMPTED, min_gpus=4, allocated={"n0": 4}),
        running("b2", "b", {"n0": 4}, started_at=5.0),
        pending("a1", "a", 4),
    ]
    _, k = run(snap([tenant("a", quota=4), tenant("b", quota=4)], jobs, nodes(8)))
    assert not k["preempt"] and "being released" in k["wait"]["a1"].reason


def test_non_preemptible_jobs_never_borrow():
    jobs = [pending(1, "a", 4, preemptible=False), pending(2, "a", 2, preemptible=False, submitted_at=1)]
    _, k = run(snap([tenant("a", quota=2)], jobs, nodes(8)))
    assert "only within quota" in k["wait"][1].reason
    assert k["admit"][2].gpus == 2


def test_quota_guarantee_settles_after_reclaim():
    jobs = [running(f"b{i}", "b", {f"n{i // 2}": 4}, started_at=float(i)) for i in range(4)]
    jobs += [pending(f"a{i}", "a", 4, submitted_at=float(i)) for i in range(3)]
    s = snap([tenant("a", quota=8), tenant("b", quota=8)], jobs, nodes(8, 8))
    s, _d, n_rounds = settle(s)
    assert n_rounds <= 3
    held = {"a": 0, "b": 0}
    for j in s.jobs:
        if j.state == JobState.RUNNING:
            held[j.tenant_id] += j.held
    assert held == {"a": 8, "b": 8}
    assert {j.id for j in s.jobs if j.state == JobState.RUNNING and j.tenant_id == "a"} == {"a0", "a1"}


# ------------------------------------------------------------------------ backfill


def _backfill_case(with_estimates: bool):
    est = {"est_end": 100.0} if with_estimates else {}
    dur = (lambda x: {"est_duration": x}) if with_estimates else (lambda x: {})
    jobs = [
        running("r1", "a", {"n0": 8, "n1": 4}, **est),
        pending("head", "a", 16, submitted_at=0),
        pending("short", "a", 2, submitted_at=1, **dur(50.0)),  # ends at 50, before the head starts
        pending("long", "a", 2, submitted_at=2, **dur(500.0)),  # would still run at 100
        pending("unknown", "a", 1, submitted_at=3),
    ]
    return snap([tenant("a")], jobs, nodes(8, 8), now=0.0)


def test_backfill_only_when_it_cannot_delay_the_head_job():
    _, k = run(_backfill_case(True))
    assert "head of the queue" in k["wait"]["head"].reason and "100" in k["wait"]["head"].reason
    assert list(k["admit"]) == ["short"] and "backfill" in k["admit"]["short"].reason
    assert "delay head job" in k["wait"]["long"].reason
    assert "delay head job" in k["wait"]["unknown"].reason


def test_backfill_into_gpus_the_head_will_not_need():
    jobs = [
        running("r1", "a", {"n0": 8}, est_end=100.0),
        running("r2", "a", {"n1": 4}, est_end=200.0),
        pending("head", "a", 10, submitted_at=0),  # at t=100: 4 free + 8 = 12 -> 2 to spare
        pending("long", "a", 2, submitted_at=1, est_duration=1000.0),
        pending("long2", "a", 1, submitted_at=2, est_duration=1000.0),
    ]
    _, k = run(snap([tenant("a")], jobs, nodes(8, 8)))
    assert list(k["admit"]) == ["long"] and "will not need" in k["admit"]["long"].reason
    assert 1 not in k["admit"] and "long2" in k["wait"]


def test_without_estimates_nothing_backfills_past_a_blocked_head():
    _, k = run(_backfill_case(False))
    assert not k["admit"]


def test_backfill_does_not_delay_head_start():
    """Play the estimates forward: the head job can still start at its reserved time."""
    s = _backfill_case(True)
    _d, k = run(s)
    free_at_100 = 4 + 12  # free now + r1 ends at 100
    for adm in k["admit"].values():
        job = next(j for j in s.jobs if j.id == adm.job_id)
        if s.now + job.est_duration > 100.0:
            free_at_100 -= adm.gpus
    assert free_at_100 >= 16


# ------------------------------------------------------------------------ elastic


def _saturating(top: int) -> dict[int, float]:
    return {n: float(min(n, 4)) * 1000.0 for n in range(1, top + 1)}  # no gain past 4 GPUs


def test_elastic_grow_goes_to_the_job_that_gains_most():
    jobs = [
        running("flat", "a", {"n0": 4}, min_gpus=4, max_gpus=8, throughput=_saturating(8)),
        running("linear", "a", {"n0": 2}, min_gpus=2, max_gpus=6),
    ]
    _, k = run(snap([tenant("a")], jobs, nodes(10)))
    assert list(k["grow"]) == ["linear"] and k["grow"]["linear"].gpus == 6
    assert k["grow"]["linear"].added == {"n0": 4}


def test_elastic_shrink_moves_gpus_to_higher_goodput_then_grows():
    jobs = [
        running("flat", "a", {"n0": 8}, min_gpus=4, max_gpus=8, throughput=_saturating(8)),
        running("linear", "a", {"n1": 4}, min_gpus=4, max_gpus=8),
    ]
    s = snap([tenant("a")], jobs, nodes(8, 4))
    d, k = run(s)
    assert k["shrink"]["flat"].gpus == 4 and "linear" in k["shrink"]["flat"].reason
    assert not k["grow"]
    s = apply(s, d)
    d, k = run(s)
    assert k["grow"]["linear"].gpus == 8
    s, d, n = settle(apply(s, d))
    assert n == 0  # settled: no more moves


def test_no_churn_when_gains_are_equal():
    jobs = [
        running("j1", "a", {"n0": 6}, min_gpus=2, max_gpus=8),
        running("j2", "a", {"n1": 2}, min_gpus=2, max_gpus=8),
    ]
    d, _ = run(snap([tenant("a")], jobs, nodes(6, 2)))
    assert d == []


def test_elastic_admission_sized_by_curve_points():
    curve = {8: 8.0, 16: 15.0, 32: 28.0}
    _, k = run(snap([tenant("a")], [pending(1, "a", 8, max_gpus=32, throughput=curve)], nodes(8, 8, 8)))
    assert k["admit"][1].gpus == 16  # 24 is not a size the planner offered


def test_queued_job_shrinks_elastic_jobs_of_over_share_tenants():
    jobs = [running("x1", "x", {"n0": 8, "n1": 8}, min_gpus=4, max_gpus=16), pending("y1", "y", 4)]
    s = snap([tenant("x"), tenant("y")], jobs, nodes(8, 8))
    _, k = run(s)
    assert k["shrink"]["x1"].gpus == 12 and "fair share" in k["wait"]["y1"].reason
    s, _d, n = settle(s)
    assert n <= 3
    sizes = {j.id: j.held for j in s.jobs if j.state == JobState.RUNNING}
    assert sizes == {"x1": 12, "y1": 4}


def test_nothing_grows_into_gpus_a_queued_job_waits_for():
    jobs = [
        running("e", "a", {"n0": 2}, min_gpus=2, max_gpus=8, est_end=1000.0),
        pending("big", "a", 8, submitted_at=1),
    ]
    _d, k = run(snap([tenant("a")], jobs, nodes(8)))
    assert not k["grow"] and list(k["wait"]) == ["big"]


def test_decisions_are_ordered_preempt_shrink_admit_grow_wait():
    jobs = [
        running("b1", "b", {"n0": 4}, started_at=1.0),
        pending("a1", "a", 4),
        pending("c1", "c", 4),
    ]
    d, _ = run(snap([tenant("a", quota=4), tenant("b"), tenant("c", quota=4)], jobs, nodes(8)))
    kinds = [x.kind for x in d]
    assert kinds == sorted(kinds, key=["preempt", "shrink", "admit", "grow", "wait"].index)
    assert isinstance(d[0], Preempt) and any(isinstance(x, Admit) for x in d)
    assert not any(isinstance(x, Shrink) for x in d) and isinstance(d[-1], Wait)


def test_invalid_views_are_rejected():
    with pytest.raises(ValueError, match="max_gpus"):
        JobView(1, "a", min_gpus=4, max_gpus=2)
    with pytest.raises(ValueError, match="min_gpus"):
        JobView(1, "a", min_gpus=0)
    with pytest.raises(ValueError, match="weight"):
        tenant("a", weight=0.0)
    with pytest.raises(ValueError, match="duplicate"):
        decide(snap([tenant("a")], [pending(1, "a", 1), pending(1, "a", 1)], nodes(1)))


# ------------------------------------------------------------------ waiting reasons a user can act on


def test_wait_reasons_name_the_cause_and_the_jobs_behind_it():
    # no GPUs at all (a Ray cluster whose nodes declare none)
    _, k = run(snap([tenant("a")], [pending(1, "a", 1)], nodes(0)))
    assert k["wait"][1].reason == "needs at least 1 GPU(s); the cluster has 0 (no healthy node declares GPUs)"
    # quota: a non-preemptible job names the jobs that use its tenant's quota
    jobs = [running(3, "a", {"n0": 2}), running(7, "a", {"n0": 2}), pending(9, "a", 2, preemptible=False)]
    _, k = run(snap([tenant("a", quota=4)], jobs, nodes(8)))
    assert "tenant quota of 4 GPUs, 4 in use by jobs 3, 7; job needs 2" in k["wait"][9].reason
    # job limit: names the running job
    _, k = run(snap([tenant("a", max_jobs=1)], [running(5, "a", {"n0": 1}), pending(6, "a", 1)], nodes(8)))
    assert k["wait"][6].reason.endswith("maximum of 1 job(s): job 5")
    # capacity: the head of the queue names the job whose end frees its GPUs
    _, k = run(_backfill_case(True))
    assert "needs 16 GPUs, 4 free; next release expected when job r1 ends" in k["wait"]["head"].reason
    _, k = run(_backfill_case(False))
    assert "no running job has an end estimate" in k["wait"]["head"].reason
