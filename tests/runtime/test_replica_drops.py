"""Which replica groups a raise gets dropped (issue #14): "my peer died" is not "I am broken"; and where
new groups go (issue #38: a node each, several for a layout wider than a node)."""

from __future__ import annotations

from planner.layout import Layout
from workers.runtime.recovery.replica_groups import FRUITLESS_LIMIT, ReplicaSet, raised_to_drop


def _reps() -> ReplicaSet:
    reps = ReplicaSet(Layout(tp=2), 3, "t")
    reps.groups = {0: None, 1: None, 2: None}  # type: ignore[dict-item]  # only the keys matter here
    return reps


def test_a_survivor_raising_in_the_redo_after_a_peer_died_is_not_dropped() -> None:
    # the old rule dropped group 0 here (bench run 3, 2026-12-03): it raised a torchft "Timeout
    # expired" in the two redo attempts after group 2's node died, while group 1 could not commit either
    reps = _reps()
    assert raised_to_drop(reps, set(), set(), [2]) == []  # the gather in which group 2 died
    del reps.groups[2]
    assert raised_to_drop(reps, {0}, set(), []) == []
    assert raised_to_drop(reps, {0}, set(), []) == []
    assert raised_to_drop(reps, set(), {0, 1}, []) == []  # the redo went through
    assert reps.raised == {} and reps.fruitless == 0 and reps.excused == set()


def test_a_group_that_raises_twice_in_a_row_in_steady_state_is_dropped() -> None:
    reps = _reps()
    assert raised_to_drop(reps, {0}, {1}, []) == []
    assert raised_to_drop(reps, {0}, set(), []) == [0]


def test_a_replacement_that_raises_twice_is_not_excused() -> None:
    reps = _reps()
    raised_to_drop(reps, set(), set(), [2])
    del reps.groups[2]
    reps.groups[3] = None  # type: ignore[assignment]  # joined after the loss
    assert raised_to_drop(reps, {3}, set(), []) == []
    assert raised_to_drop(reps, {3}, set(), []) == [3]


def test_a_commit_clears_the_count() -> None:
    reps = _reps()
    assert raised_to_drop(reps, {0}, {1}, []) == []
    assert raised_to_drop(reps, set(), {0, 1}, []) == []
    assert raised_to_drop(reps, {0}, {1}, []) == []


def test_an_excused_group_is_blamed_when_no_step_commits_for_long() -> None:
    reps = _reps()
    raised_to_drop(reps, set(), set(), [2])
    out = [raised_to_drop(reps, {0}, set(), []) for _ in range(FRUITLESS_LIMIT + 1)]
    assert out[:FRUITLESS_LIMIT - 1] == [[]] * (FRUITLESS_LIMIT - 1)
    assert out[-1] == [0]



def test_a_group_gets_a_node_of_its_own_and_spans_nodes_only_when_no_node_could_hold_it() -> None:
    from .memory_cluster import MemoryCluster

    c = MemoryCluster.of(4, 4, 4)
    four = ReplicaSet(Layout(tp=2, pp=2), 3, "t")  # 4 GPUs a group: one node each
    assert four.pick_spots(c, 3, set()) == [{"node0": 4}, {"node1": 4}, {"node2": 4}]
    assert four.pick_spots(c, 3, {"node1"}) == [{"node0": 4}, {"node2": 4}]  # fewer groups, the rest later
    two = ReplicaSet(Layout(pp=2), 2, "t")
    c.hold(4, ["node0"])
    assert two.pick_spots(c, 2, set()) == [{"node1": 2}, {"node2": 2}]
    # tp2 x pp2 x dp2 = 8 GPUs: more than a node has, so each group spans two nodes (the freest first)
    eight = ReplicaSet(Layout(tp=2, pp=2, dp=2), 2, "t")
    c = MemoryCluster.of(4, 4, 4, 4)
    assert eight.pick_spots(c, 2, set()) == [{"node0": 4, "node1": 4}, {"node2": 4, "node3": 4}]
    assert eight.pick_spots(c, 2, {"node3"}) == [{"node0": 4, "node1": 4}]


def test_groups_share_a_node_once_every_node_holds_one() -> None:
    """A job granted one node's 4 GPUs for 4 one-GPU groups runs all 4 there at once (not one group
    and three late replacements); with two nodes the groups alternate, the freest node first."""
    from .memory_cluster import MemoryCluster

    one = ReplicaSet(Layout(), 4, "t")
    assert one.pick_spots(MemoryCluster.of(4), 4, set()) == [{"node0": 1}] * 4
    assert one.pick_spots(MemoryCluster.of(4, 4), 4, set()) == [{"node0": 1}, {"node1": 1}, {"node0": 1}, {"node1": 1}]
    c = MemoryCluster.of(4, 4)
    c.hold(3, ["node1"])
    assert one.pick_spots(c, 4, set()) == [{"node0": 1}, {"node1": 1}, {"node0": 1}, {"node0": 1}]
