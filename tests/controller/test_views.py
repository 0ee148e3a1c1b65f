"""The cluster view and the scheduler snapshot, from raw Ray answers and job rows (pure)."""

from __future__ import annotations

import pytest

from service.controller.cluster import build_view, cluster_view, unavailable
from service.controller.cluster_snapshot import DbState, JobRow, build_snapshot
from service.scheduler.policy import decide
from service.scheduler.types import Admit, TenantView

pytestmark = pytest.mark.unit

HEAD = {
    "NodeID": "h",
    "Alive": True,
    "NodeManagerAddress": "10.0.0.1",
    "Resources": {"CPU": 1.0, "node:__internal_head__": 1.0},
}


def node(node_id: str, gpus: int, alive: bool = True) -> dict:
    return {
        "NodeID": node_id,
        "Alive": alive,
        "NodeManagerAddress": "10.0.0.1",
        "Resources": {"CPU": 2.0, "GPU": float(gpus)},
    }


def pg(name: str, where: list[str], state: str = "CREATED") -> dict:
    return {
        "name": name,
        "state": state,
        "bundles": {i: {"GPU": 1.0, "CPU": 0.05} for i in range(len(where))},
        "bundles_to_node_id": dict(enumerate(where)),
    }


def test_view_counts_gpus_per_node_and_their_placement_groups() -> None:
    view = build_view(
        [HEAD, node("n1", 4), node("n2", 4), node("n3", 4, alive=False)],
        {
            "p1": pg("orthoplex-7-a2", ["n1", "n1", "n2"]),
            "p2": pg("orthoplex-9-a1", ["n2"], state="REMOVED"),
            "p3": pg("someone-else", ["n2"]),
        },
        available={"n1": {"GPU": 2.0}, "n2": {"GPU": 1.0}},
    )
    assert view.available and [n.node_id for n in view.nodes] == ["h", "n1", "n2", "n3"]
    by_id = {n.node_id: n for n in view.nodes}
    assert by_id["h"].is_head and by_id["h"].gpus_total == 0
    assert by_id["n1"].gpus_used == 2 and by_id["n1"].gpus_free == 2
    # n2: one GPU of job 7 and one of an unknown group; Ray says 1 free, another is held elsewhere
    assert by_id["n2"].gpus_used == 3 and by_id["n2"].gpus_free == 1
    assert by_id["n3"].gpus_free == 0  # dead nodes offer nothing
    assert view.total_gpus == 8 and view.free_gpus == 3
    alloc = by_id["n1"].allocations[0]
    assert (alloc.placement_group_id, alloc.name, alloc.gpus) == ("p1", "orthoplex-7-a2", 2)
    d = view.to_dict()
    assert d["free_gpus"] == 3 and d["nodes"][1]["gpus_free"] == 2 and d["alive_nodes"] == 3


def test_view_is_unavailable_without_ray() -> None:
    import ray

    if ray.is_initialized():  # the session cluster may be connected in this process
        assert cluster_view().available
    else:
        v = cluster_view()
        assert not v.available and "not connected" in (v.reason or "") and v.free_gpus == 0
    assert unavailable("gcs down").to_dict()["reason"] == "gcs down"


def _job(job_id: int, tenant: int, state: str, gpus: int = 0, attempt: int = 0,
         placement: dict[str, int] | None = None) -> JobRow:
    return JobRow(
        id=job_id,
        tenant_id=tenant,
        name=f"j{job_id}",
        state=state,
        priority=0,
        min_gpus=2,
        max_gpus=4,
        attempt=attempt,
        epoch=attempt,
        cancel_requested=False,
        gpus_allocated=gpus,
        spec={},
        created_at=float(job_id),
        admitted_at=None,
        placement=dict(placement or {}),
    )


def test_snapshot_allocations_come_from_the_attempt_rows_alone() -> None:
    view = build_view(
        [node("n1", 4), node("n2", 4), node("n3", 4, alive=False)],
        {"p": pg("some-name-no-one-parses", ["n1", "n1"])},
        available={"n1": {"GPU": 2.0}, "n2": {"GPU": 4.0}},
    )
    db = DbState(
        tenants=[TenantView(id=1, gpu_quota=4), TenantView(id=2, gpu_quota=4)],
        jobs=[
            _job(1, 1, "RUNNING", 2, 1, {"n1": 2}),  # its gang's placed event
            _job(2, 1, "ADMITTED", 2, 1, {"n2": 2}),  # the scheduler's placement, before its gang exists
            _job(3, 2, "RECOVERING", 2, 1, {"n2": 1, "n3": 1}),  # n3 died: that GPU is gone with it
            _job(4, 2, "PENDING", 0, 0, {"n1": 4}),  # an old attempt's placement: holds nothing now
        ],
    )
    snap = build_snapshot(db, view)
    jobs = {j.id: j for j in snap.jobs}
    assert dict(jobs[1].allocated) == {"n1": 2}
    assert dict(jobs[2].allocated) == {"n2": 2}
    assert dict(jobs[3].allocated) == {"n2": 1}
    assert jobs[4].held == 0 and not jobs[4].elastic  # no resize in the runtime: fixed once admitted
    decisions = decide(snap)
    admits = [d for d in decisions if isinstance(d, Admit)]
    # 8 alive GPUs, 5 held: job 4 (tenant 2, within quota) can only get what is left, never a GPU twice
    assert sum(d.gpus for d in admits) <= 3
