"""Re-plan after a slow link, without Ray: the communication-heavy dimensions (TP, CP) leave the slow
link first; only a slow link that TP/CP do not cross makes the node count as slow.

The state machine and its replanner run over the in-memory cluster of the runtime tests, whose
heartbeat round trips per node are the model's link (``Node.link_rtt_s``); the ``LinkScorer`` of the
state machine finds the slow link from them, as on namespaces."""

from __future__ import annotations

from typing import Any

import pytest

from tests.runtime.memory_cluster import MemoryCluster
from tests.runtime.test_recovery_decisions import finished_cleanly, machine, of, step_until
from workers.runtime.contract import events as ev
from workers.runtime.contract.job_spec import parse_job
from workers.runtime.policy import planning as planner_bridge
from workers.runtime.policy.replanner import heavy_groups_crossing

pytestmark = pytest.mark.unit


def _slow_link_on_last_rank(m: Any, c: MemoryCluster) -> str:
    assert m.gang is not None
    node = m.gang.rank_nodes[-1]
    c.machines[node].link_rtt_s = 2.0  # heartbeats to that node's ranks take 2 s, the others 10 ms
    return node


def test_tp_across_a_slow_link_moves_inside_the_nodes_and_the_node_stays() -> None:
    c = MemoryCluster.of(2, 2, 2)
    m = machine(c, steps=14, min_gpus=4, max_gpus=4, hint="tp=4")
    step_until(m, lambda: m.next_step >= 2)
    assert m.gang is not None and m.gang.layout.tp == 4 and len(set(m.gang.rank_nodes)) == 2
    slow = _slow_link_on_last_rank(m, c)
    events = finished_cleanly(m, c)
    found = of(events, ev.StragglerFound)
    assert found and found[0].node == slow and found[0].cause == "link"
    first = next(e for e in of(events, ev.Replanned) if e.seq > found[0].seq)
    assert first.decision == "replan" and first.change == {"slow_links": [slow]}, first
    assert first.old["tp"] == 4 and first.new["tp"] * first.new["cp"] <= 2
    assert slow in first.nodes, "the node with the slow link keeps its GPUs (its compute is fine)"
    assert "TP/CP moved inside nodes" in first.reason
    resumed = of(events, ev.Resumed)[0]
    assert resumed.cause == "straggler" and resumed.world_size == 4
    assert not heavy_groups_crossing(m.replanner.plans[1][0], [slow])
    assert not heavy_groups_crossing(m.replanner.plans[1][0], ["node0", "node1", "node2"])
    # only afterwards (DP still crosses the link) may the node be treated as slow
    later = [e for e in of(events, ev.Replanned) if e.seq > first.seq]
    assert all("slow_links" not in e.change for e in later)


def test_a_slow_link_only_dp_crosses_counts_the_node_as_slow() -> None:
    c = MemoryCluster.of(2, 2, 2)
    m = machine(c, steps=12, min_gpus=4, max_gpus=4, hint="tp=2,dp=2")
    step_until(m, lambda: m.next_step >= 2)
    assert m.gang is not None and not heavy_groups_crossing(m.replanner.in_force, m.gang.rank_nodes,
                                                            m.gang.rank_nodes)
    slow = _slow_link_on_last_rank(m, c)
    events = finished_cleanly(m, c)
    found = of(events, ev.StragglerFound)
    assert found and found[0].node == slow and found[0].cause == "link"
    first = next(e for e in of(events, ev.Replanned) if e.seq > found[0].seq)
    assert "slow_links" not in first.change and slow in first.change["slow_nodes"], first
    if first.decision != "keep":
        assert slow not in first.nodes  # the free third node replaces it


def test_heavy_groups_crossing_names_tp_and_cp_groups_on_the_slow_node_only() -> None:
    c = MemoryCluster.of(2, 2, 2)
    job = parse_job({"model": "tiny", "steps": 4, "global_batch": 12, "checkpoint_dir": "/nowhere",
                     "min_gpus": 4, "max_gpus": 4, "layout_hint": "tp=2,cp=2"})
    plan = planner_bridge.first_plan(job, c.nodes())
    where = planner_bridge.plan_nodes(plan)
    assert where is not None and where[0] == where[1] != where[2] == where[3]  # TP inside, CP across
    assert heavy_groups_crossing(plan, [where[2]]) == [("cp", (0, 2)), ("cp", (1, 3))]
    assert heavy_groups_crossing(plan, ["node-not-used"]) == []
    # the gang's own placement wins over the plan's grid: here TP spans the nodes, CP does not
    placed = [where[0], where[2], where[0], where[2]]
    assert heavy_groups_crossing(plan, [where[2]], placed) == [("tp", (0, 1)), ("tp", (2, 3))]
    tp4 = planner_bridge.first_plan(parse_job({**job.raw, "layout_hint": "tp=4"}), c.nodes())
    assert heavy_groups_crossing(tp4, [planner_bridge.plan_nodes(tp4)[0]]) == [("tp", (0, 1, 2, 3))]


def test_a_slow_gpu_under_a_spanning_tp_group_moves_tp_first_then_is_left_out() -> None:
    """Busy time includes the TP collectives: with TP across nodes a slow GPU and a slow link look
    alike, so TP moves inside nodes first; the slow GPU is found again and then handled as slow."""
    c = MemoryCluster.of(2, 2, 2)
    m = machine(c, steps=16, min_gpus=4, max_gpus=4, hint="tp=4",
                faults=[{"kind": "slow_node", "at_step": 2, "rank": -1, "factor": 4.0}])
    events = finished_cleanly(m, c)
    slow = of(events, ev.FaultInjected)[0].node
    found = [f for f in of(events, ev.StragglerFound) if f.node == slow]
    assert len(found) >= 2 and found[0].cause == "compute", found
    replans = [e for e in of(events, ev.Replanned) if e.seq > found[0].seq]
    assert replans[0].change == {"slow_links": [slow]} and replans[0].new["tp"] <= 2 and slow in replans[0].nodes
    later = next(e for e in replans if e.seq > found[1].seq)
    assert "slow_links" not in later.change and slow in later.change["slow_nodes"], later
    assert later.decision == "keep" or slow not in later.nodes
