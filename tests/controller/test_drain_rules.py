"""The drain rules of the control plane, pure: which jobs are past a drain deadline, and a node's
drain state from the GPUs still held there."""

from __future__ import annotations

from service.controller.cluster import drain_state, gpus_held
from service.controller.cluster_snapshot import JobRow
from service.controller.drains import Drain, overdue


def _job(job_id: int, state: str, placement: dict[str, int]) -> JobRow:
    return JobRow(id=job_id, tenant_id=1, name="j", state=state, priority=0, min_gpus=1, max_gpus=4, attempt=1,
                  epoch=1, cancel_requested=False, gpus_allocated=sum(placement.values()), spec={}, created_at=0.0,
                  admitted_at=0.0, placement=placement)


def test_only_running_jobs_still_on_a_node_past_its_deadline_are_preempted() -> None:
    drains = {"n1": Drain("n1", 60.0, deadline_at=100.0), "n2": Drain("n2", 60.0, deadline_at=500.0)}
    jobs = [_job(1, "RUNNING", {"n1": 2}), _job(2, "RUNNING", {"n2": 4}), _job(3, "RUNNING", {"n3": 4}),
            _job(4, "RECOVERING", {"n1": 2}), _job(5, "RUNNING", {"n1": 0, "n3": 2})]
    late = overdue(jobs, drains, now=200.0)
    assert [(j.id, p.job_id) for j, p in late] == [(1, 1)] and "past the deadline" in late[0][1].reason
    assert overdue(jobs, drains, now=99.0) == []
    assert drains["n1"].left_s(99.5) == 1.0 and drains["n2"].left_s(200.0) == 300.0


def test_a_drained_node_is_draining_while_placement_groups_hold_its_gpus() -> None:
    node = {"node_id": "n1", "allocations": [{"gpus": 2}, {"gpus": 1}]}
    assert gpus_held(node) == 3 and gpus_held(None) == 0 and gpus_held({"allocations": []}) == 0
    assert drain_state(True, 3) == "draining" and drain_state(True, 0) == "drained"
    assert drain_state(False, 3) == "active"
