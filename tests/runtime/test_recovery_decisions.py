"""Every recovery decision of a job attempt, without Ray: the state machine and its replanner over an
in-memory cluster (``memory_cluster``), faults through the same ``FaultInjector`` the supervisor
uses, every emitted event read back through its typed class."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, TypeVar

import pytest

from workers.runtime.contract import events as ev
from workers.runtime.contract.events import EventLog
from workers.runtime.contract.job_spec import parse_job
from workers.runtime.policy.planning import nodes_used
from workers.runtime.supervision.attempt_machine import AttemptMachine, Phase
from workers.states import AttemptState
from workers.testbed.fault_injector import FaultInjector, FaultPlan, parse_faults

from .memory_cluster import MemoryCluster

pytestmark = pytest.mark.unit

E = TypeVar("E", bound=ev.Event)


def machine(cluster: MemoryCluster, *, steps: int = 8, faults: list[dict[str, Any]] | None = None,
            min_gpus: int = 1, max_gpus: int | None = None, hint: str | None = None,
            placement: dict[str, int] | None = None, **runtime: Any) -> AttemptMachine:
    spec: dict[str, Any] = {
        "model": "tiny", "steps": steps, "global_batch": 12, "checkpoint_dir": "/nowhere", "min_gpus": min_gpus,
        "checkpoint": {"min_every_steps": 1, "max_every_steps": 2},
        "runtime": {"placement_retry_s": 0.01, "placement_give_up_s": 60.0, "straggler_window": 3, "grow": False,
                    "snapshots": True, **runtime},
        "faults": faults or [],
    }
    if max_gpus:
        spec["max_gpus"] = max_gpus
    if hint:
        spec["layout_hint"] = hint
    if placement:
        spec["placement"] = placement
    job = parse_job(spec)
    log = EventLog()
    port = FaultInjector(cluster, FaultPlan(parse_faults(job.faults), enabled=True), log, settle_s=0.0)
    return AttemptMachine(job, port, log, name="orthoplex-t-a1")


def typed(m: AttemptMachine) -> list[ev.Event]:
    """Every event the attempt emitted, read back through its type (fails on any mismatch)."""
    return [ev.event_from_dict(e) for e in m.log.since(0)]


def of(events: list[ev.Event], cls: type[E]) -> list[E]:
    return [e for e in events if isinstance(e, cls)]


def step_until(m: AttemptMachine, done: Any, limit: int = 500) -> None:
    for _ in range(limit):
        if done():
            return
        m.step()
    raise AssertionError(f"not reached in {limit} transitions; phase {m.phase}")


def finished_cleanly(m: AttemptMachine, cluster: MemoryCluster) -> list[ev.Event]:
    assert m.run() is Phase.FINISHED, m.error
    events = typed(m)
    assert isinstance(events[-1], ev.Finished) and events[-1].final_step == m.job.steps
    assert cluster.held == {}, "a reservation leaked"
    assert sorted(m.losses) == list(range(1, m.job.steps + 1))
    return events


def test_node_lost_replans_onto_the_survivors_and_resumes_from_the_checkpoint() -> None:
    c = MemoryCluster.of(4, 4, 4)
    c.snapshots_on = False
    m = machine(c, faults=[{"kind": "kill_node", "at_step": 3, "rank": -1}], snapshots=False)
    events = finished_cleanly(m, c)
    fault = of(events, ev.FaultInjected)[0]
    lost = of(events, ev.NodeLost)[0]
    assert lost.nodes == [fault.node] and lost.step == 3
    replan = next(e for e in of(events, ev.Replanned) if e.seq > lost.seq)
    assert replan.decision != "keep" and fault.node not in replan.nodes and replan.change["lost_nodes"] == [fault.node]
    resumed = of(events, ev.Resumed)[0]
    assert resumed.cause == "node_lost" and resumed.from_step == 2 and resumed.world_size <= 8
    assert resumed.source == "storage"
    rec = of(events, ev.Recovered)[0]
    assert rec.cause == "node_lost" and set(rec.phases) == set(ev.RECOVERY_PHASES)
    assert fault.node in m.replanner.excluded and len(m.failures) == 1


def test_node_lost_resumes_from_the_snapshot_in_a_survivors_memory() -> None:
    c = MemoryCluster.of(4, 4, 4)
    m = machine(c, faults=[{"kind": "kill_node", "at_step": 3, "rank": -1}])
    events = finished_cleanly(m, c)
    lost = of(events, ev.NodeLost)[0]
    resumed = of(events, ev.Resumed)[0]
    # the checkpoint is of step 2, the snapshot of step 3 (every step done before the kill): nothing redone
    assert resumed.source == "memory" and resumed.from_step == 3 and resumed.steps_redone == 0, resumed
    assert lost.nodes[0] not in c.holders  # the lost node's own copy went with it; its buddy's copy was used
    assert c.restored_from == ["storage", "memory"]  # the first gang: nothing in memory yet
    assert c.closed and c.holders == {}  # holders freed at the end


def test_node_lost_with_every_memory_copy_gone_resumes_from_storage() -> None:
    c = MemoryCluster.of(4, 4, 4)
    m = machine(c, faults=[{"kind": "drop_snapshots", "at_step": 3}, {"kind": "kill_node", "at_step": 3, "rank": -1}])
    events = finished_cleanly(m, c)
    resumed = of(events, ev.Resumed)[0]
    assert resumed.source == "storage" and resumed.from_step == 2 and resumed.steps_redone == 1
    assert c.restored_from == ["storage", "storage"]


def test_a_snapshot_newer_than_the_last_step_seen_done_or_older_than_the_checkpoint_is_not_used() -> None:
    c = MemoryCluster.of(4, 4, 4)
    m = machine(c, faults=[{"kind": "kill_node", "at_step": 3, "rank": -1}])
    step_until(m, lambda: m.phase is Phase.TRAIN and m.next_step == 3)
    c.snapshots_on = False  # later steps leave no snapshot: the newest is step 3
    m.last_ckpt_step = 4  # as if a checkpoint newer than every snapshot had been committed
    c.checkpoint_step = 4
    step_until(m, lambda: bool(of(typed(m), ev.Resumed)))
    assert of(typed(m), ev.Resumed)[0].source == "storage"


def test_rank_crash_on_a_live_node_restarts_on_the_same_nodes() -> None:
    c = MemoryCluster.of(4, 4)
    m = machine(c, faults=[{"kind": "kill_rank", "at_step": 2, "rank": 0}])
    events = finished_cleanly(m, c)
    failed = of(events, ev.RankFailed)[0]
    assert failed.ranks == [0] and not of(events, ev.NodeLost) and not of(events, ev.NodeExcluded)
    assert m.replanner.excluded == set()
    assert of(events, ev.Resumed)[0].cause == "rank_failed" and of(events, ev.Resumed)[0].world_size == 8


def test_a_node_where_ranks_keep_dying_is_excluded_from_later_plans() -> None:
    c = MemoryCluster.of(4, 4, 4)
    m = machine(c, steps=10, faults=[{"kind": "kill_rank", "at_step": 2, "rank": 0},
                                     {"kind": "kill_rank", "at_step": 5, "rank": 0}], node_death_limit=2)
    events = finished_cleanly(m, c)
    crashes = of(events, ev.RankFailed)
    assert len(crashes) == 2 and crashes[0].nodes == crashes[1].nodes
    suspect = crashes[0].nodes[0]
    excluded = of(events, ev.NodeExcluded)
    assert [e.node for e in excluded] == [suspect] and excluded[0].deaths == 2
    last_replan = of(events, ev.Replanned)[-1]
    assert suspect not in last_replan.nodes and last_replan.change["lost_nodes"] == [suspect]
    assert all(suspect not in n for n in [nodes_used(p) for p, _ in m.replanner.plans[-1:]])


def test_a_straggler_is_replanned_around_and_dated_from_its_window() -> None:
    c = MemoryCluster.of(4, 4, 4)
    m = machine(c, steps=12, faults=[{"kind": "slow_node", "at_step": 2, "rank": -1, "factor": 4.0}])
    events = finished_cleanly(m, c)
    slow = of(events, ev.FaultInjected)[0].node
    found = of(events, ev.StragglerFound)
    assert [f.node for f in found] == [slow] and found[0].step - 2 <= 2 * 3
    switch = next(e for e in of(events, ev.Replanned) if e.seq > found[0].seq)
    assert switch.decision != "keep" and slow not in switch.nodes
    assert of(events, ev.Resumed)[0].cause == "straggler"
    rec = of(events, ev.Recovered)[0]
    assert rec.cause == "straggler" and rec.phases["detect"] > 0
    assert slow in m.replanner.excluded


def test_a_hung_rank_is_caught_and_the_job_recovers() -> None:
    c = MemoryCluster.of(4, 4)
    m = machine(c, faults=[{"kind": "hang_rank", "at_step": 3, "rank": 1}])
    events = finished_cleanly(m, c)
    hang = of(events, ev.Hang)[0]
    assert hang.ranks == [1] and hang.step == 3
    assert of(events, ev.Resumed)[0].cause == "hang" and not m.replanner.excluded


def test_grow_onto_a_node_that_joined_at_a_checkpoint_boundary() -> None:
    c = MemoryCluster.of(4, 4)
    m = machine(c, steps=12, grow=True)
    step_until(m, lambda: m.next_step >= 2)
    assert m.gang is not None and m.gang.world_size == 8
    c.add_node("node9", 4)
    events = finished_cleanly(m, c)
    grow = next(e for e in of(events, ev.Replanned) if e.change.get("added_nodes"))
    assert "node9" in grow.nodes and grow.new_tokens_per_s > grow.old_tokens_per_s
    resumed = of(events, ev.Resumed)[0]
    assert resumed.cause == "grow" and resumed.world_size == 12
    assert resumed.from_step in {e.step for e in of(events, ev.CheckpointSaved)}


def test_shrink_to_a_smaller_grant_at_the_next_step_and_a_repeat_arms_nothing() -> None:
    c = MemoryCluster.of(4, 4, 4)
    m = machine(c, steps=10)
    step_until(m, lambda: m.next_step >= 3)
    assert m.gang is not None and m.gang.world_size == 12
    assert m.request_resize(4) == {"gpus": 4, "armed": True, "world_size": 12}
    assert m.request_resize(4)["armed"] is False and m.resize_to == 4  # a repeat: the first one stays armed
    events = finished_cleanly(m, c)
    assert len(of(events, ev.ResizeRequested)) == 1
    resumed = of(events, ev.Resumed)[0]
    assert resumed.cause == "resize" and resumed.world_size <= 4
    assert of(events, ev.Placed)[-1].gpus <= 4


def test_waits_for_gpus_held_by_another_job_then_starts() -> None:
    c = MemoryCluster.of(4, 4)
    other = c.hold(8)
    assert other is not None
    m = machine(c, min_gpus=4)
    assert m.step().target is Phase.WAIT
    assert m.step().target is Phase.PLAN and m.step().target is Phase.WAIT  # still nothing free: keeps waiting
    c.release(other)
    events = finished_cleanly(m, c)
    waits = of(events, ev.WaitingForGpus)
    assert len(waits) == 1 and waits[0].min_gpus == 4
    assert isinstance(events[1], ev.PlanChosen)


def test_every_node_lost_waits_for_a_node_to_join() -> None:
    c = MemoryCluster.of(4, 4)
    m = machine(c)
    step_until(m, lambda: m.next_step >= 3)
    c.kill_node("node0")
    c.kill_node("node1")
    step_until(m, lambda: m.phase is Phase.WAIT)
    assert m.state is AttemptState.RECOVERING
    c.add_node("node2", 4)
    events = finished_cleanly(m, c)
    assert of(events, ev.NodeLost) and of(events, ev.WaitingForGpus)
    assert of(events, ev.Resumed)[0].world_size == 4 and m.state is AttemptState.SUCCEEDED


@pytest.mark.parametrize("request_", ["cancel", "preempt"])
def test_cancel_and_preempt_end_a_wait(request_: str) -> None:
    c = MemoryCluster.of(4, 4)
    m = machine(c)
    step_until(m, lambda: m.last_ckpt_step >= 2)
    c.kill_node("node1")
    c.kill_node("node0")  # nothing left: the re-plan must wait
    step_until(m, lambda: m.phase is Phase.WAIT)
    if request_ == "cancel":
        m.cancel_requested = True
    else:
        m.preempt_requested = True
    assert m.run() is (Phase.CANCELLED if request_ == "cancel" else Phase.PREEMPTED)
    events = typed(m)
    assert of(events, ev.WaitingForGpus)
    if request_ == "cancel":
        assert isinstance(events[-1], ev.Cancelled)
    else:
        end = events[-1]
        assert isinstance(end, ev.Preempted) and end.checkpoint_step == c.checkpoint_step >= 2
    assert c.held == {} and m.gang is None


def test_the_first_plan_and_a_resize_stay_within_the_scheduler_placement() -> None:
    c = MemoryCluster.of(4, 4, 4)
    m = machine(c, steps=10, placement={"node1": 2, "node2": 2})
    step_until(m, lambda: m.next_step >= 2)
    placed = of(typed(m), ev.Placed)[0]
    assert placed.gpus_per_node == {"node1": 2, "node2": 2} and placed.placement_group == "orthoplex-t-a1"
    m.request_resize(8, {"node0": 4, "node2": 4})
    events = finished_cleanly(m, c)
    resized = of(events, ev.Placed)[-1]
    assert of(events, ev.Resumed)[0].cause == "resize"
    assert set(resized.gpus_per_node) <= {"node0", "node2"} and resized.gpus == 8


def test_a_spec_no_cluster_can_run_fails_at_the_first_plan() -> None:
    c = MemoryCluster.of(4, 4)
    m = machine(c, min_gpus=16, max_gpus=16)
    assert m.step().target is Phase.WAIT  # too few GPUs now: may change, so it waits
    m = machine(c, hint="tp=3")
    assert m.run() is Phase.FAILED and "no plan fits" in m.error and c.held == {}
    assert isinstance(typed(m)[-1], ev.Failed)


def test_the_attempt_loop_has_no_fault_code() -> None:
    import workers.runtime as runtime

    root = Path(runtime.__file__).parent
    for name in ("supervision/attempt_machine.py", "supervision/attempt_state.py", "supervision/replica_attempt.py",
                 "policy/replanner.py", "policy/recovery.py"):
        assert not re.search(r"\bfault|inject", (root / name).read_text(), re.IGNORECASE), name
