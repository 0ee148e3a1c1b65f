"""Fault injection on replica groups (issue #14): a ``kill_node`` on a replica rank lands in the
middle of its next step, so nothing waits for the node to settle first. Unit: a stand-in port."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from workers.runtime.cluster.gang import Gang

pytestmark = pytest.mark.unit



class _Injectable:
    def __init__(self) -> None:
        self.armed: list[str] = []

    def inject(self, gang: Any, ranks: Any, kind: str, value: float = 0.0, *, wait: bool = False) -> None:
        self.armed.append(kind)


def _gang(replica: bool) -> Gang:
    from planner.layout import Layout
    from workers.runtime.cluster.placement_groups import Reservation
    from workers.runtime.cluster.ranks import RankMap

    plan = SimpleNamespace(replica_group=0 if replica else None)
    return Gang(plan, Layout(tp=2), Reservation(None, ["n1"], 0.0, "PACK"), RankMap([0, 1], ["n1", "n1"], "test"),
                workers=[None, None])


def test_a_kill_in_the_middle_of_a_replica_step_is_not_followed_by_a_settle_wait(monkeypatch) -> None:
    """``kill_node`` on a replica rank lands after its backward pass in the step launched next: the
    survivors' stall must not include the injector's settle wait (0.2 s, for a gang whose next step
    would otherwise be launched onto the dying node)."""
    from workers.runtime.contract.events import EventLog
    from workers.testbed import fault_injector as faults

    slept: list[float] = []
    monkeypatch.setattr(faults.time, "sleep", slept.append)
    for replica, want in ((True, []), (False, [0.2])):
        plan = faults.FaultPlan(faults.parse_faults([{"kind": "kill_node", "at_step": 3, "rank": -1}]), enabled=True)
        inner = _Injectable()
        faults.FaultInjector(inner, plan, EventLog(), settle_s=0.2)._fire(_gang(replica), 3)
        assert inner.armed == ["kill_node"] and slept == want, (replica, slept)
        slept.clear()
