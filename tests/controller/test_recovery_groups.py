"""The scheduler and quotas count every replica group's GPUs: a replica job is offered whole groups
(its range and goodput curve in group multiples), each attempt's choice is fitted to its grant, and
one group's own ``placed`` event does not replace the job's allocation. Pure: the controller's
snapshot builder and the scheduler's ``decide``, on the choice the one rule makes."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from service.controller.apply import attempt_recovery
from service.controller.cluster import build_view
from service.controller.cluster_snapshot import DbState, JobRow, build_snapshot
from service.recovery import job_recovery, whole_groups
from service.scheduler.policy import decide
from service.scheduler.types import Admit, TenantView, Wait
from tests.controller.test_views import node

pytestmark = pytest.mark.unit

#: tp=2 x dp=3 of the tiny model: three full replicas of two GPUs (snapshots off: today's replica path)
SPEC = {"name": "rg", "model": "tiny", "steps": 4, "global_batch": 12, "min_gpus": 1, "max_gpus": 8,
        "layout_hint": {"tp": 2}, "recovery": {"policy": "replica_groups", "groups": 3,
                                               "snapshots": {"enabled": False}}}


def _job(job_id: int, tenant: int, state: str = "PENDING", spec: dict | None = None,
         placement: dict[str, int] | None = None) -> JobRow:
    s = dict(spec or SPEC)
    return JobRow(id=job_id, tenant_id=tenant, name="j", state=state, priority=0, min_gpus=s.get("min_gpus", 1),
                  max_gpus=s.get("max_gpus", 1), attempt=1 if placement else 0, epoch=1 if placement else 0,
                  cancel_requested=False, gpus_allocated=sum((placement or {}).values()), spec=s,
                  created_at=float(job_id), admitted_at=None, placement=dict(placement or {}))


@pytest.fixture(scope="module")
def choice() -> dict:
    c = job_recovery(SPEC, 8, gpu_type="CPU", gpus_per_node=2)
    assert (c.policy, c.groups, c.group_gpus) == ("replica_groups", 3, 2), c
    return c.to_dict()


def test_a_replica_job_is_offered_whole_groups_and_granted_every_groups_gpus(choice: dict) -> None:
    view = build_view([node(f"n{i}", 2) for i in range(4)], {})
    db = DbState(tenants=[TenantView(id=1, gpu_quota=8)], jobs=[_job(1, 1)])
    snap = build_snapshot(db, view, resizable=True, recoveries={1: choice})
    job = snap.jobs[0]
    assert (job.min_gpus, job.max_gpus) == (2, 6)  # one group .. the plan's three, never 1, 7 or 8
    assert set(job.throughput or {}) == {2, 4, 6}
    admits = [d for d in decide(snap) if isinstance(d, Admit)]
    assert [(d.job_id, d.gpus) for d in admits] == [(1, 6)] and sum(admits[0].placement.values()) == 6
    # without the choice the same job would be sized by its raw range (1..8)
    raw = build_snapshot(db, view, resizable=True).jobs[0]
    assert (raw.min_gpus, raw.max_gpus) == (1, 8)


def test_the_quota_counts_every_group(choice: dict) -> None:
    """A running replica job holds its three groups (6 GPUs); the tenant's 6-GPU quota is used up, so a
    non-preemptible job of the same tenant waits (it may not borrow)."""
    view = build_view([node(f"n{i}", 2) for i in range(4)], {})
    other = {**SPEC, "name": "other", "min_gpus": 2, "max_gpus": 2, "preemptible": False, "recovery": {}}
    held = {"n0": 2, "n1": 2, "n2": 2}
    db = DbState(tenants=[TenantView(id=1, gpu_quota=6)], jobs=[_job(1, 1, "RUNNING", placement=held), _job(2, 1, spec=other)])
    snap = build_snapshot(db, view, resizable=True, recoveries={1: choice})
    assert {j.id: j.held for j in snap.jobs}[1] == 6
    waits = {d.job_id: d.reason for d in decide(snap) if isinstance(d, Wait)}
    assert 2 in waits and "quota" in waits[2], waits


def test_each_attempt_gets_the_groups_its_grant_holds(choice: dict, tmp_path: Path) -> None:
    from service.controller.context import ControllerConfig

    ctx = types.SimpleNamespace(gpu_type="CPU", gpus_per_node=2, recoveries={1: choice},
                                config=ControllerConfig(storage_path=tmp_path))
    job = _job(1, 1)
    assert attempt_recovery(ctx, job, 6)["groups"] == 3
    two = attempt_recovery(ctx, job, 4)
    assert (two["policy"], two["groups"]) == ("replica_groups", 2)
    one = attempt_recovery(ctx, job, 2)  # room for one group: re-plan, never a failed job
    assert (one["policy"], one["groups"]) == ("replan", 0) and "1 replica group" in one["reason"]
    fresh = types.SimpleNamespace(gpu_type="CPU", gpus_per_node=2, recoveries={}, config=ctx.config)
    assert attempt_recovery(fresh, job, 6)["groups"] == 3 and 1 in fresh.recoveries  # planned once, kept


def test_whole_groups_leaves_other_jobs_alone(choice: dict) -> None:
    assert whole_groups(None, 1, 8) == (1, 8, 1)
    from planner.recovery_choice import RecoveryChoice

    c = RecoveryChoice.from_dict(choice)
    assert whole_groups(c, 1, 8) == (2, 6, 2)
    assert whole_groups(c, 3, 4) == (4, 4, 2)  # at least min_gpus, in whole groups, within max_gpus


@pytest.mark.postgres
def test_one_groups_placed_event_does_not_replace_the_jobs_allocation(migrated_db_url: str) -> None:
    """The grant (every group's GPUs) stays the job's allocation when a replica group reports its own
    placement; a whole gang's ``placed`` still replaces it (a re-plan's new size)."""
    from service.controller.events_pull import JobRef, apply_event
    from service.db import transitions as tr
    from service.db.models import Job, Tenant
    from service.db.session import make_engine, make_sessionmaker
    from workers.runtime.contract import events as ev

    engine = make_engine(migrated_db_url)
    sessions = make_sessionmaker(engine)
    try:
        with sessions() as s:
            t = Tenant(name="rg")
            s.add(t)
            s.flush()
            job = Job(tenant_id=t.id, name="rg", state="PENDING", spec=dict(SPEC), min_gpus=2, max_gpus=6)
            s.add(job)
            s.commit()
            job_id = job.id
        grant = {"n0": 2, "n1": 2, "n2": 2}
        with sessions() as s:
            epoch = tr.start_attempt(s, job_id, expected={"PENDING"}, new="ADMITTED", expected_epoch=0, reason="t",
                                     gpus=6, placement=grant)
        ref = JobRef(job_id, "ADMITTED", 1, int(epoch or 0), gpus_allocated=6)

        def placed(gpus: int, nodes: dict[str, int], group: int | None) -> None:
            e = ev.Placed(gpus=gpus, placement_group="pg", gpus_per_node=nodes, bundle_nodes=list(nodes), seconds=0.1,
                          strategy="PACK", group=group)
            with sessions() as s:
                apply_event(s, ref, e)
                s.commit()

        def held() -> int:
            with sessions() as s:
                return s.get(Job, job_id).gpus_allocated

        def apply(e: ev.Event) -> None:
            with sessions() as s:
                apply_event(s, ref, e)
                s.commit()

        placed(2, {"n3": 2}, group=1)  # one replica group's placement
        assert held() == 6
        # a group lost and replaced: still every group's GPUs; a shrink gives one group back, a grow's
        # joined group takes it again (the scheduler's resize of a replica job, in whole groups)
        apply(ev.ReplicaDropped(group=2, nodes=["n2"], step=5, groups_left=2, cause="lost", job_gpus=6))
        assert held() == 6
        apply(ev.ReplicaDropped(group=2, nodes=["n2"], step=7, groups_left=2, cause="shrink", job_gpus=4))
        assert held() == 4
        apply(ev.ReplicaJoined(group=3, seconds=1.0, step=9, from_group=0, nodes=["n2"], groups=3, job_gpus=6))
        assert held() == 6
        apply(ev.ReplicaDropped(group=3, nodes=["n2"], step=11, groups_left=2, cause="shrink"))  # no count: kept
        assert held() == 6
        placed(4, {"n0": 2, "n1": 2}, group=None)  # a whole gang's: the job holds that from now on
        assert held() == 4
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_a_replica_jobs_placement_follows_its_groups_not_the_proposed_grant(migrated_db_url: str) -> None:
    """The scheduler proposes a placement; the runtime puts the groups where it finds room (a node of
    their own first). The placement the control plane keeps, from which the scheduler reads the job's
    GPUs per node (and so what a node loss or a shrink frees), is where the groups are: set by the
    last group's ``placed`` at a start and by every ``replica_dropped`` / ``replica_joined``."""
    from service.controller.cluster import build_view
    from service.controller.cluster_snapshot import DbState, JobRow
    from service.controller.events_pull import JobRef, apply_event
    from service.db import transitions as tr
    from service.db.models import Attempt, Job, Tenant
    from service.db.session import make_engine, make_sessionmaker
    from workers.runtime.contract import events as ev

    engine = make_engine(migrated_db_url)
    sessions = make_sessionmaker(engine)
    try:
        with sessions() as s:
            t = Tenant(name="rgp", gpu_quota=4)
            s.add(t)
            s.flush()
            job = Job(tenant_id=t.id, name="rgp", state="PENDING", spec=dict(SPEC), min_gpus=2, max_gpus=6)
            s.add(job)
            s.commit()
            job_id, tenant_id = job.id, t.id
        with sessions() as s:  # the scheduler's proposal: 4 GPUs on n0, 2 on n1
            epoch = tr.start_attempt(s, job_id, expected={"PENDING"}, new="ADMITTED", expected_epoch=0, reason="t",
                                     gpus=6, placement={"n0": 4, "n1": 2})
        ref = JobRef(job_id, "ADMITTED", 1, int(epoch or 0), gpus_allocated=6)

        def apply(e: ev.Event) -> None:
            with sessions() as s:
                apply_event(s, ref, e)
                s.commit()

        def where() -> tuple[int, dict[str, int]]:
            with sessions() as s:
                a = s.query(Attempt).filter(Attempt.job_id == job_id, Attempt.ended_at.is_(None)).one()
                return s.get(Job, job_id).gpus_allocated, dict(a.placement or {})

        def placed(group: int, node: str, job_placement: dict[str, int] | None) -> None:
            apply(ev.Placed(gpus=2, placement_group=f"pg{group}", gpus_per_node={node: 2}, bundle_nodes=[node, node],
                            seconds=0.1, strategy="STRICT_PACK", group=group, job_placement=job_placement))

        placed(0, "n0", None)
        placed(1, "n1", None)
        assert where() == (6, {"n0": 4, "n1": 2})  # not yet: the proposal until every group is placed
        placed(2, "n2", {"n0": 2, "n1": 2, "n2": 2})  # a node per group, as the runtime places them
        assert where() == (6, {"n0": 2, "n1": 2, "n2": 2})
        # n2 dies: its group is replaced on n3 at once (the replacement's spot counts)
        apply(ev.ReplicaDropped(group=2, nodes=["n2"], step=5, groups_left=2, cause="lost", job_gpus=6,
                                job_placement={"n0": 2, "n1": 2, "n3": 2}))
        assert where() == (6, {"n0": 2, "n1": 2, "n3": 2})
        # what the scheduler sees with n2 gone: 6 GPUs held (the proposal would have said 6 too, but
        # a death of n0 would have counted 4 lost GPUs where the job lost 2)
        view = build_view([node(n, 4) for n in ("n0", "n1", "n3")], {})
        row = JobRow(id=job_id, tenant_id=tenant_id, name="rgp", state="RUNNING", priority=0, min_gpus=2, max_gpus=6,
                     attempt=1, epoch=int(epoch or 0), cancel_requested=False, gpus_allocated=6, spec=dict(SPEC),
                     created_at=1.0, admitted_at=None, placement=where()[1])
        snap = build_snapshot(DbState(tenants=[TenantView(id=tenant_id, gpu_quota=4)], jobs=[row]), view,
                              resizable=True)
        assert sum(snap.jobs[0].allocated.values()) == 6
        apply(ev.ReplicaDropped(group=1, nodes=["n1"], step=9, groups_left=2, cause="shrink", job_gpus=4,
                                job_placement={"n0": 2, "n3": 2}))
        assert where() == (4, {"n0": 2, "n3": 2})
        apply(ev.ReplicaJoined(group=3, seconds=1.0, step=12, from_group=0, nodes=["n1"], groups=3, job_gpus=6,
                               job_placement={"n0": 2, "n1": 2, "n3": 2}))
        assert where() == (6, {"n0": 2, "n1": 2, "n3": 2})
    finally:
        engine.dispose()
