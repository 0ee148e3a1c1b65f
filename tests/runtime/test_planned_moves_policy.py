"""The planned-moves policy (``workers.runtime.policy.planned_moves``): drains and resizes by groups,
pure decisions, no Ray."""

from __future__ import annotations

import pytest

from workers.runtime.policy.planned_moves import (
    AddGroups,
    LeaveGroups,
    MoveGang,
    Stay,
    hold_state_from,
    on_drain,
    on_group_resize,
)


def test_a_gang_on_a_draining_node_moves_from_memory_and_one_elsewhere_stays() -> None:
    d = on_drain({"b"}, rank_nodes=["a", "a", "b", "b"], snapshots=True)
    assert isinstance(d, MoveGang) and d.nodes == ("b",) and d.source == "memory"
    assert isinstance(on_drain({"c"}, rank_nodes=["a", "b"]), Stay)
    # no snapshots kept: the step's state goes to a checkpoint (a storage read, still nothing redone)
    d = on_drain({"a", "c"}, rank_nodes=["a", "b"], snapshots=False)
    assert isinstance(d, MoveGang) and d.nodes == ("a",) and d.source == "storage"
    assert hold_state_from(True) == "memory" and hold_state_from(False) == "storage"


def test_replica_groups_on_a_draining_node_leave_and_are_replaced() -> None:
    groups = {0: ["a", "a"], 1: ["b", "b"], 2: ["c", "c"]}
    d = on_drain({"b"}, groups=groups)
    assert isinstance(d, LeaveGroups) and d.groups == (1,) and d.replace
    assert isinstance(on_drain({"x"}, groups=groups), Stay)
    # every group on the draining nodes: none could heal the others, nothing leaves
    stay = on_drain({"a", "b", "c"}, groups=groups)
    assert isinstance(stay, Stay) and "every replica group" in stay.reason


def test_group_resize_shrinks_and_grows_in_whole_groups() -> None:
    shrink = on_group_resize(4, group_size=2, live=[0, 1, 3], want=3)
    assert isinstance(shrink, LeaveGroups) and shrink.groups == (3,) and not shrink.replace  # the newest goes
    odd = on_group_resize(5, group_size=2, live=[0, 1, 3], want=3)  # 5 GPUs: 2 whole groups
    assert isinstance(odd, LeaveGroups) and odd.groups == (3,)
    grow = on_group_resize(8, group_size=2, live=[0, 1], want=2)
    assert isinstance(grow, AddGroups) and grow.count == 2
    # a replacement already starting counts toward the groups asked for
    assert isinstance(on_group_resize(6, group_size=2, live=[0, 1], want=3), Stay)
    assert isinstance(on_group_resize(1, group_size=2, live=[0, 1], want=2), Stay)  # not one whole group
    with pytest.raises(ValueError, match="group_size"):
        on_group_resize(4, group_size=0, live=[0], want=1)
