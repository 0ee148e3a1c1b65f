"""The one rule for a job's recovery (``planner.recovery_choice``), on real plans priced by the planner:
``auto`` takes replica groups when the plan's data parallelism holds two or more full replicas in
memory, re-plans from memory otherwise, and uses a plan's own ``recovery`` object as it is."""

from __future__ import annotations

from typing import Any

import pytest

from planner.api import evaluate
from planner.recovery_choice import (
    DEFAULT_SNAPSHOT_EVERY,
    DEFAULT_WARM_RANKS,
    ChoiceError,
    RecoveryChoice,
    check_block,
    choose,
    for_grant,
    unplanned,
)
from planner.recovery_names import JOB_POLICIES, job_policy, runtime_policy
from planner.result import Plan

pytestmark = pytest.mark.unit


def _spec(model: str, gpus: int) -> dict[str, Any]:
    return {"model": {"name": model}, "cluster": {"gpu_type": "H100", "num_gpus": gpus, "gpus_per_node": 8},
            "parallel": {"global_batch": 64}}


def _plan(model: str, layout: str, gpus: int) -> tuple[Plan, dict[str, Any]]:
    spec = _spec(model, gpus)
    plan = evaluate(spec, layout)
    assert isinstance(plan, Plan), plan
    return plan, spec


def test_dp_1_re_plans_from_memory() -> None:
    plan, spec = _plan("llama3-8b", "tp=8", 8)
    c = choose(plan, None, spec)
    assert (c.policy, c.groups, c.snapshots, c.runtime_policy) == ("replan", 0, True, "replan_memory")
    assert c.source == "rule" and "dp=1" in c.reason
    # warm ranks auto (DEFAULT_WARM_RANKS): the plan's 8 ranks on one node, a node's worth warm
    assert DEFAULT_WARM_RANKS == "auto" and (c.snapshot_every, c.warm_ranks) == (DEFAULT_SNAPSHOT_EVERY, 8)


def test_dp_4_without_zero_is_four_replica_groups() -> None:
    plan, spec = _plan("llama3-8b", "tp=2,dp=4,recompute=full", 8)
    c = choose(plan.to_dict(), {}, spec)  # the plan's dict, as the API hands it on
    assert (c.policy, c.groups, c.group_gpus, c.runtime_policy) == ("replica_groups", 4, 2, "replica_group")
    assert c.group_layout is not None and (c.group_layout["tp"], c.group_layout["dp"]) == (2, 1)
    assert "full replica" in c.reason


def test_dp_4_sharded_with_room_takes_the_most_replicas_that_fit() -> None:
    plan, spec = _plan("llama3-70b", "tp=8,dp=4,zero=3,recompute=full", 32)
    c = choose(plan, None, spec)
    assert (c.policy, c.groups, c.group_gpus) == ("replica_groups", 2, 16)
    assert c.group_layout is not None and (c.group_layout["dp"], c.group_layout["zero"]) == (2, 3)
    assert "2 full replicas fit" in c.reason


def test_dp_4_without_memory_room_re_plans() -> None:
    plan, spec = _plan("llama3-70b", "tp=8,dp=4,zero=3", 32)
    c = choose(plan, None, spec)
    assert (c.policy, c.groups, c.snapshots) == ("replan", 0, True)
    assert "two full replicas need" in c.reason and "usable" in c.reason
    with pytest.raises(ChoiceError) as err:  # named in the spec, it cannot hold: the field says why
        choose(plan, {"policy": "replica_groups"}, spec)
    assert err.value.field == "recovery.policy"


def test_a_plan_with_a_recovery_object_is_used_as_it_is() -> None:
    plan, spec = _plan("llama3-70b", "tp=8,dp=4,zero=3", 32)  # the memory rule would re-plan
    obj = {"policy": "replica_group", "groups": 4, "snapshot_every": 5, "checkpoint_every_steps": 40,
           "warm_spares": 2, "reason": "goodput 0.97 over re-plan's 0.93"}
    c = choose({**plan.to_dict(), "recovery": obj}, None, spec)
    assert (c.policy, c.groups, c.snapshot_every, c.checkpoint_every_steps, c.warm_spares, c.source) == (
        "replica_groups", 4, 5, 40, 2, "plan")
    assert c.reason == obj["reason"] and c.snapshots
    off = choose({**plan.to_dict(), "recovery": {"policy": "replan_storage", "snapshot_every": 0, "reason": "r"}})
    assert (off.policy, off.snapshots, off.runtime_policy) == ("replan", False, "replan_storage")
    # what the user set explicitly wins over the plan's object
    mine = choose({**plan.to_dict(), "recovery": obj}, {"snapshots": {"every": 2}, "warm_ranks": 0}, spec)
    assert (mine.snapshot_every, mine.warm_ranks) == (2, 0)
    with pytest.raises(ChoiceError, match=r"plan\.recovery\.groups"):
        choose({**plan.to_dict(), "recovery": {**obj, "groups": 3}}, None, spec)  # 3 does not divide dp=4
    with pytest.raises(ChoiceError, match=r"plan\.recovery\.policy"):
        choose({**plan.to_dict(), "recovery": {**obj, "policy": "pray"}}, None, spec)


def test_named_policies_and_the_block_rules() -> None:
    plan, spec = _plan("llama3-8b", "tp=2,dp=4,recompute=full", 8)
    assert choose(plan, {"policy": "replica_groups", "groups": 2}, spec).groups == 2
    with pytest.raises(ChoiceError, match=r"recovery\.groups"):
        choose(plan, {"policy": "replica_groups", "groups": 3}, spec)
    r = choose(plan, {"policy": "restart"}, spec)
    assert (r.policy, r.snapshots, r.runtime_policy, r.source) == ("restart", False, "restart", "spec")
    assert choose(plan, {"policy": "replan", "snapshots": {"enabled": False}}, spec).runtime_policy == "replan_storage"
    for bad, field in (({"policy": "replan", "groups": 2}, "recovery.groups"),
                       ({"policy": "restart", "snapshots": {"enabled": True}}, "recovery.snapshots.enabled"),
                       ({"snapshots": {"every": 0}}, "recovery.snapshots.every"),
                       ({"warm_ranks": -1}, "recovery.warm_ranks"),
                       ({"policy": "sometimes"}, "recovery.policy")):
        with pytest.raises(ChoiceError) as err:
            check_block(bad)
        assert err.value.field == field


def test_a_grant_gets_whole_groups_or_re_plans() -> None:
    plan, spec = _plan("llama3-8b", "tp=2,dp=4,recompute=full", 8)
    c = choose(plan, None, spec)
    assert for_grant(c, 8) == c
    assert (for_grant(c, 6).groups, for_grant(c, 6).policy) == (3, "replica_groups")
    one = for_grant(c, 2)
    assert (one.policy, one.groups, one.snapshots) == ("replan", 0, True) and "1 replica group" in one.reason
    assert RecoveryChoice.from_dict(c.to_dict()) == c
    assert unplanned(None).policy == "replan" and unplanned({"policy": "restart"}).snapshots is False


def test_the_names_are_the_runtimes() -> None:
    assert JOB_POLICIES == ("auto", "replica_groups", "replan", "restart")
    assert [job_policy(n) for n in ("replica_group", "replan_memory", "replan_storage", "restart")] == [
        "replica_groups", "replan", "replan", "restart"]
    assert runtime_policy("replan", True) == "replan_memory" and runtime_policy("replica_groups", False) == "replica_group"


def test_a_goodput_aware_plan_is_used_as_the_planner_chose_it() -> None:
    """With ``duration_days`` the planner prices every recovery option (``planner.goodput``) and its best
    plan carries the choice: ``auto`` takes it (policy, groups, cadences) instead of the memory rule."""
    import planner

    spec = {**_spec("llama3-8b", 16), "duration_days": 30}
    best = planner.plan(spec, top_k=1).plans[0]
    assert best.recovery is not None
    c = choose(best, None, spec)
    assert c.source == "plan" and c.reason == best.recovery["reason"]
    assert c.runtime_policy == best.recovery["policy"] or (
        c.policy == "replan" and best.recovery["policy"] in ("replan_memory", "replan_storage"))
    assert choose(best.to_dict(), None, spec) == c  # the same from the plan's dict (the API's form)
