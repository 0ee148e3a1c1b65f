"""The recovery policy without Ray: every failure kind in, its typed decision out
(``RecoveryPolicy.decide``), then the attempt machine carrying decisions out over the in-memory
cluster (``memory_cluster``). Modelled on Ray Train v2's ``tests/test_failure_policy.py``."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from planner.layout import Layout
from planner.recovery_names import (
    POLICY_NAMES,
    REPLAN_MEMORY,
    REPLAN_STORAGE,
    REPLICA_GROUP,
    RESTART,
    SOURCES,
)
from service.failure_sim.policies import KINDS, Policy
from workers.runtime.cluster.gang import Gang, StartFailed
from workers.runtime.cluster.placement_groups import Reservation
from workers.runtime.cluster.ranks import RankMap
from workers.runtime.cluster.reachability import judge
from workers.runtime.cluster.watchdog import Failure
from workers.runtime.contract import events as ev
from workers.runtime.contract.job_spec import RuntimeSettings
from workers.runtime.policy.recovery import (
    DropGroups,
    Fail,
    FailureView,
    GroupStep,
    RecoveryPolicy,
    Replan,
    Restart,
    Retry,
    Suspect,
    policy_name,
)
from workers.runtime.recovery.replica_groups import ReplicaSet
from workers.runtime.supervision.attempt_machine import Phase

from .memory_cluster import MemoryCluster
from .test_recovery_decisions import finished_cleanly, machine, of, typed

pytestmark = pytest.mark.unit

NODES = ("node0", "node1", "node2")
RANK_NODES = ("node0", "node0", "node1", "node1", "node2", "node2")  # a gang of 6 ranks, 2 per node


def lost(*nodes: str) -> Failure:
    ranks = tuple(r for r, n in enumerate(RANK_NODES) if n in nodes)
    return Failure("node_lost", f"step: node(s) {list(nodes)} dead", nodes, ranks, 0.0)


def died(rank: int) -> Failure:
    return Failure("rank_failed", f"step: rank process(es) [{rank}] died", (RANK_NODES[rank],), (rank,), 0.0, died=True)


def raised(*ranks: int) -> Failure:
    nodes = tuple(sorted({RANK_NODES[r] for r in ranks}))
    return Failure("rank_failed", f"step: ranks {list(ranks)} raised", nodes, ranks, 0.0)


def hang(*ranks: int) -> Failure:
    return Failure("hang", f"step: ranks {list(ranks)} still pending", NODES, ranks, 0.0)


def gang_view(**kw: Any) -> FailureView:
    return FailureView(rank_nodes=RANK_NODES, **kw)


def all_connected() -> dict[str, dict[str, bool | None]]:
    return {a: {b: True for b in NODES if b != a} for a in NODES}


def cut(a: str, b: str) -> dict[str, dict[str, bool | None]]:
    m = all_connected()
    m[a][b] = m[b][a] = False
    return m


# ---------------------------------------------------------------------------------- names
def test_the_runtime_and_the_simulator_name_the_same_policies() -> None:
    assert KINDS is POLICY_NAMES and POLICY_NAMES == (RESTART, REPLAN_STORAGE, REPLAN_MEMORY, REPLICA_GROUP)
    assert {k: Policy(k).source for k in KINDS} == SOURCES
    assert RecoveryPolicy(REPLAN_MEMORY).source == "memory" and RecoveryPolicy(REPLAN_STORAGE).source == "storage"
    with pytest.raises(ValueError, match="restart"):
        RecoveryPolicy(RESTART)  # the simulator's baseline only: the runtime has no whole-job restart mode
    with pytest.raises(ValueError, match="unknown policy 'replan_disk'"):
        Policy("replan_disk")


def test_the_settings_pick_the_policy() -> None:
    assert policy_name(RuntimeSettings()) == REPLAN_STORAGE
    assert policy_name(RuntimeSettings.from_dict({"snapshots": True})) == REPLAN_MEMORY
    assert policy_name(RuntimeSettings.from_dict({"replica_groups": 3})) == REPLICA_GROUP
    assert policy_name(RuntimeSettings.from_dict({"replica_groups": 1, "snapshots": True})) == REPLAN_MEMORY  # 1 group: no replicas
    p = RecoveryPolicy.for_settings(RuntimeSettings.from_dict({"max_recoveries": 4, "node_death_limit": 3, "snapshots": True}))
    assert (p.name, p.max_recoveries, p.deaths.limit) == (REPLAN_MEMORY, 4, 3)


def test_the_policy_and_the_names_import_no_ray_and_no_torch() -> None:
    code = ("import sys; import workers.runtime.policy.recovery, service.failure_sim.simulation; "
            "print(sorted(m for m in ('ray', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stderr


# ---------------------------------------------------------------------------------- one gang
@pytest.mark.parametrize(("name", "source"), [(REPLAN_STORAGE, "storage"), (REPLAN_MEMORY, "memory")])
def test_a_lost_node_is_replanned_around_from_the_policys_source(name: str, source: str) -> None:
    d = RecoveryPolicy(name).decide(lost("node1"), gang_view())
    assert d == Replan(source=source, failure=lost("node1"), exclude=("node1",))


def test_a_rank_that_died_on_a_live_node_restarts_on_the_same_nodes() -> None:
    d = RecoveryPolicy().decide(died(2), gang_view())
    assert isinstance(d, Restart) and d.exclude == () and d.suspect is None and d.source == "storage"


def test_a_hang_restarts_on_the_same_nodes() -> None:
    d = RecoveryPolicy(REPLAN_MEMORY).decide(hang(3), gang_view())
    assert d == Restart(source="memory", failure=hang(3))


def test_a_node_where_ranks_keep_dying_is_suspect_at_the_limit_and_replanned_around() -> None:
    p = RecoveryPolicy(node_death_limit=2)
    assert isinstance(p.decide(died(2), gang_view()), Restart)
    d = p.decide(died(3), gang_view())  # the second death on node1 while it stayed up
    assert isinstance(d, Replan) and d.exclude == ("node1",) and d.suspect == Suspect("node1", 2)


def test_raises_deaths_over_several_nodes_and_a_limit_of_zero_make_no_suspect() -> None:
    p = RecoveryPolicy(node_death_limit=2)
    for _ in range(3):  # a rank that raised: alive, nothing against its node
        assert isinstance(p.decide(raised(2), gang_view()), Restart)
    spread = Failure("rank_failed", "step: ranks died on two nodes", ("node0", "node1"), (0, 2), 0.0, died=True)
    assert all(isinstance(p.decide(spread, gang_view()), Restart) for _ in range(3))
    off = RecoveryPolicy(node_death_limit=0)
    assert all(isinstance(off.decide(died(0), gang_view()), Restart) for _ in range(3))


def test_a_partition_the_probe_found_declares_the_cut_off_node_lost() -> None:
    p = RecoveryPolicy(REPLAN_MEMORY)
    assert p.wants_probe(hang(5), RANK_NODES)
    verdict = judge(cut("node0", "node2"), RANK_NODES, seconds=0.5)
    d = p.decide(hang(5), gang_view(partition=verdict))
    assert isinstance(d, Replan) and d.exclude == d.cut_off == ("node2",) and d.source == "memory"
    assert d.failure.kind == "node_lost" and d.failure.ranks == (4, 5) and d.failure.nodes == ("node2",)
    assert d.failure.reason.startswith("peer_unreachable:") and "(after: step: ranks [5] still pending)" in d.failure.reason
    assert p.cut_off == {"node2"}


def test_a_verdict_is_not_read_for_a_death_a_lost_node_or_a_gang_on_one_node() -> None:
    verdict = judge(cut("node0", "node2"), RANK_NODES)
    p = RecoveryPolicy()
    assert not p.wants_probe(died(0), RANK_NODES) and not p.wants_probe(lost("node1"), RANK_NODES)
    assert not p.wants_probe(hang(0), ("node0", "node0"))
    d = p.decide(died(0), gang_view(partition=verdict))
    assert isinstance(d, Restart) and d.failure == died(0) and d.cut_off == ()
    one = p.decide(hang(0), FailureView(rank_nodes=("node0", "node0"), partition=verdict))
    assert isinstance(one, Restart) and one.failure.kind == "hang"
    assert p.cut_off == set()


def test_a_probe_that_finds_every_pair_connected_leaves_the_failure_as_it_was() -> None:
    d = RecoveryPolicy().decide(raised(1), gang_view(partition=judge(all_connected(), RANK_NODES)))
    assert d == Restart(source="storage", failure=raised(1))


def test_the_failure_after_the_budget_fails_the_job_and_still_says_what_it_read() -> None:
    p = RecoveryPolicy(max_recoveries=2)
    assert isinstance(p.decide(hang(0), gang_view()), Restart)
    assert isinstance(p.decide(lost("node2"), gang_view()), Replan)
    d = p.decide(lost("node1"), gang_view())
    assert d == Fail(reason="more than 2 failures", failure=lost("node1"), exclude=("node1",)) and p.failures == 3


def test_the_same_start_failure_twice_fails_the_job_but_a_node_lost_at_start_does_not() -> None:
    p = RecoveryPolicy()
    rendezvous = raised(0)
    assert isinstance(p.decide(rendezvous, gang_view(during="start")), Restart)
    assert isinstance(p.decide(raised(2), gang_view(during="start")), Restart)  # another failure: counted apart
    d = p.decide(rendezvous, gang_view(during="start"))
    assert isinstance(d, Fail) and d.reason == f"the same start failure twice, giving up: {rendezvous.reason}"
    assert all(isinstance(p.decide(lost("node2"), gang_view(during="start")), Replan) for _ in range(3))
    q = RecoveryPolicy()
    assert all(isinstance(q.decide(rendezvous, gang_view()), Restart) for _ in range(3))  # in a step: no such rule


# ---------------------------------------------------------------------------------- the restore source
def entry(epoch: int, step: int, world: int, *files: str) -> dict[str, Any]:
    return {"epoch": epoch, "step": step, "world": world, "files": list(files)}


HELD = {"node0": [entry(1, 4, 2, ".metadata", "__0_0.distcp"), entry(1, 5, 2, ".metadata", "__0_0.distcp")],
        "node1": [entry(1, 4, 2, "__1_0.distcp"), entry(1, 5, 2, "__1_0.distcp")]}


def test_a_complete_snapshot_in_memory_is_restored_and_storage_otherwise() -> None:
    p = RecoveryPolicy(REPLAN_MEMORY)
    got = p.restore_choice(HELD, not_before=2, not_after=5)
    assert got is not None and got.key.step == 5 and got.by_node() == {"node0": [".metadata", "__0_0.distcp"],
                                                                       "node1": ["__1_0.distcp"]}
    assert p.restore_choice(HELD, not_before=2, not_after=4).key.step == 4  # none newer than the last step done
    assert p.restore_choice(HELD, not_before=6, not_after=8) is None  # a newer checkpoint wins
    assert p.restore_choice({"node0": HELD["node0"]}, not_before=0, not_after=5) is None  # rank 1's shard is gone
    assert p.restore_choice({}, not_before=0, not_after=5) is None
    assert RecoveryPolicy(REPLAN_STORAGE).restore_choice(HELD, not_before=0, not_after=5) is None


def test_a_copy_held_on_a_node_cut_off_by_a_partition_is_not_restored() -> None:
    p = RecoveryPolicy(REPLAN_MEMORY)
    p.decide(hang(3), FailureView(rank_nodes=RANK_NODES, partition=judge(cut("node0", "node1"), RANK_NODES)))
    assert p.cut_off == {"node1"}
    assert p.restore_choice(HELD, not_before=0, not_after=5) is None  # rank 1's only copy is on node1
    assert p.restore_choice({**HELD, "node2": [entry(1, 5, 2, "__1_0.distcp")]}, not_before=0,
                            not_after=5).key.step == 5


# ---------------------------------------------------------------------------------- replica groups
def replicas(groups: int = 3) -> tuple[ReplicaSet, list[tuple[int, int]]]:
    reps = ReplicaSet(Layout(tp=2), groups, "t")
    for g in range(groups):
        node = NODES[g]
        reps.add(g, Gang(None, Layout(tp=2), Reservation(g, [node, node], 0.0, "PACK"),
                         RankMap([0, 1], [node, node], "test"), workers=[None, None]))
    return reps, [(g, r) for g in range(groups) for r in range(2)]


def group_view(reps: ReplicaSet, owners: list[tuple[int, int]], **kw: Any) -> FailureView:
    return FailureView(groups=GroupStep(reps, owners, **kw))


def test_a_replica_group_on_a_lost_node_is_dropped_and_its_node_kept_out() -> None:
    reps, owners = replicas()
    d = RecoveryPolicy(REPLICA_GROUP).decide(lost("node1"), group_view(reps, owners, raised=[2, 3]))
    assert d == DropGroups(groups=(1,), failure=lost("node1"), exclude=("node1",))


def test_a_replica_group_whose_rank_died_or_stopped_answering_is_dropped() -> None:
    reps, owners = replicas()
    p = RecoveryPolicy(REPLICA_GROUP)
    assert p.decide(died(4), group_view(reps, owners, raised=[4])) == DropGroups(groups=(2,), failure=died(4))
    d = p.decide(hang(2, 3), group_view(reps, owners, unresponsive=[2, 3]))
    assert isinstance(d, DropGroups) and d.groups == (1,)


def test_a_replica_step_that_hung_with_every_group_alive_falls_back_to_a_replan() -> None:
    reps, owners = replicas()
    p = RecoveryPolicy(REPLICA_GROUP)
    d = p.decide(hang(), group_view(reps, owners))
    assert d == Replan(source="storage", drop=(0, 1, 2), failure=hang())
    assert not p.keeps_groups and p.name == REPLAN_STORAGE  # one gang from here on


def test_a_group_that_raised_is_retried_once_then_dropped() -> None:
    reps, owners = replicas()
    p = RecoveryPolicy(REPLICA_GROUP)
    assert isinstance(p.decide(raised(0), group_view(reps, owners, raised=[0], committed=frozenset({1, 2}))), Retry)
    d = p.decide(raised(0), group_view(reps, owners, raised=[0]))
    assert isinstance(d, DropGroups) and d.groups == (0,)


def test_the_last_replica_group_lost_falls_back_to_a_replan_from_memory_when_snapshots_are_on() -> None:
    reps, owners = replicas(2)
    p = RecoveryPolicy.for_settings(RuntimeSettings.from_dict({"replica_groups": 2, "snapshots": True}))
    assert p.keeps_groups and p.restore_choice({}, not_before=0, not_after=3) is None  # groups heal from peers
    d = p.decide(lost("node0", "node1"), group_view(reps, owners))
    assert d == Replan(source="memory", drop=(0, 1), failure=lost("node0", "node1"), exclude=("node0", "node1"))
    assert p.name == REPLAN_MEMORY and p.source == "memory"  # the re-planned gang restores from memory
    # without snapshots: from storage (the periodic checkpoints one group wrote)
    reps, owners = replicas(2)
    p = RecoveryPolicy.for_settings(RuntimeSettings.from_dict({"replica_groups": 2}))
    d = p.decide(lost("node1"), group_view(reps, owners))
    assert isinstance(d, DropGroups) and d.groups == (1,)  # one group left: it carries the whole batch
    del reps.groups[1]
    d = p.decide(lost("node0"), group_view(reps, owners))
    assert isinstance(d, Replan) and d.source == "storage" and d.drop == (0,) and p.name == REPLAN_STORAGE


def test_replica_groups_spend_the_budget_and_fall_back_on_a_failed_checkpoint() -> None:
    reps, owners = replicas()
    p = RecoveryPolicy(REPLICA_GROUP, max_recoveries=1)
    assert isinstance(p.decide(lost("node2"), group_view(reps, owners)), DropGroups)
    d = p.decide(died(0), group_view(reps, owners, raised=[0]))
    assert isinstance(d, Fail) and d.reason == "more than 1 failures" and d.drop == ()
    save = RecoveryPolicy(REPLICA_GROUP).decide(died(0), FailureView(during="save"))
    assert save == Replan(source="storage", failure=died(0))


def test_a_failed_checkpoint_falls_back_whatever_took_the_writer() -> None:
    """A node death, a dead process or a hang under the group writing a checkpoint: the job re-plans
    as one gang (another group's write of the same step would collide with the half-written one)."""
    for failure in (lost("node0"), died(0), hang(0)):
        reps, owners = replicas()
        d = RecoveryPolicy(REPLICA_GROUP).decide(failure, FailureView(groups=GroupStep(reps, owners), during="save"))
        assert isinstance(d, Replan) and d.drop == (0, 1, 2), (failure, d)


# ---------------------------------------------------------------------------------- the machine carries them out
def test_the_failure_after_the_budget_ends_the_attempt_with_nothing_leaked() -> None:
    c = MemoryCluster.of(4, 4)
    m = machine(c, steps=10, max_recoveries=1, node_death_limit=0,
                faults=[{"kind": "kill_rank", "at_step": 2, "rank": 0}, {"kind": "kill_rank", "at_step": 5, "rank": 0}])
    assert m.run() is Phase.FAILED and m.error == "more than 1 failures"
    events = typed(m)
    assert len(of(events, ev.RankFailed)) == 2 and isinstance(events[-1], ev.Failed)
    assert m.policy.failures == len(m.failures) == 2 and c.held == {} and m.gang is None


def test_a_straggler_is_a_replan_not_a_failure_and_spends_no_budget() -> None:
    c = MemoryCluster.of(4, 4, 4)
    m = machine(c, steps=12, max_recoveries=0, faults=[{"kind": "slow_node", "at_step": 2, "rank": -1, "factor": 4.0}])
    events = finished_cleanly(m, c)
    assert of(events, ev.StragglerFound) and of(events, ev.Resumed)[0].cause == "straggler"
    assert m.policy.failures == 0 and m.failures == []


class FailingStart(MemoryCluster):
    """Every gang start raises the same error on live nodes (a deterministic bug, not bad luck)."""

    def start_gang(self, plan: Any, reservation: Any, *, on_created: Any) -> Gang:
        gang = super().start_gang(plan, reservation, on_created=on_created)
        raise StartFailed(Failure("rank_failed", "rendezvous: rank raised: bad config", (gang.rank_nodes[0],),
                                  (0,), 0.0))


def test_the_same_start_failure_twice_ends_the_attempt() -> None:
    c = FailingStart.of(4, 4)
    m = machine(c)
    assert m.run() is Phase.FAILED and m.error.startswith("the same start failure twice")
    assert len(of(typed(m), ev.RankFailed)) == 2 and c.held == {}


def test_a_lost_node_under_replan_memory_resumes_from_memory_and_the_policy_keeps_it_out() -> None:
    c = MemoryCluster.of(4, 4, 4)
    m = machine(c, faults=[{"kind": "kill_node", "at_step": 3, "rank": -1}])
    assert m.policy.name == REPLAN_MEMORY
    events = finished_cleanly(m, c)
    node = of(events, ev.NodeLost)[0].nodes[0]
    assert of(events, ev.Resumed)[0].source == "memory" and node in m.replanner.excluded
    assert m.policy.failures == 1
