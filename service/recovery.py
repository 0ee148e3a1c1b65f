"""A job's recovery on the control plane's GPU profile: plan the job, then the one rule
(``planner.recovery_choice.choose``). Used by the controller (the scheduler's group sizes, an
attempt's runtime settings) and the API (``POST /v1/plans`` says the same). Pure Python: the planner
and the planner-spec builder, no Ray, no database.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from planner.recovery_choice import ChoiceError, RecoveryChoice, choose, unplanned
from service.log import get_logger
from workers.planner_spec import PlanCluster, to_planner_spec

log = get_logger("service.recovery")


def job_plan_spec(spec: Mapping[str, Any], gpus: int, *, gpu_type: str, gpus_per_node: int | None) -> dict[str, Any]:
    """The planner spec of a stored job ``spec`` on up to ``gpus`` of the profile (at least its
    ``min_gpus``, as the runtime plans within a grant)."""
    low = max(1, min(int(spec.get("min_gpus", 1)), gpus))
    cluster = PlanCluster(gpu_type=gpu_type, num_gpus=gpus, min_gpus=low if low < gpus else None,
                          gpus_per_node=gpus_per_node)
    return to_planner_spec(spec, cluster)


def plan_recovery(spec: Mapping[str, Any], gpus: int, *, gpu_type: str, gpus_per_node: int | None,
                  model: Any = None) -> RecoveryChoice:
    """The recovery of the stored job ``spec`` on its best plan for up to ``gpus`` GPUs.
    ``ChoiceError`` when a policy the spec names cannot hold on that plan; a planner that cannot
    plan the job gives :func:`~planner.recovery_choice.unplanned` (``auto``: re-plan from memory).
    ``model``: the engine shape to plan (an HF model's, from its ``config.json``)."""
    import planner

    job = dict(spec) if model is None else {**spec, "model": model}
    recovery = spec.get("recovery")
    try:
        pspec = job_plan_spec(job, gpus, gpu_type=gpu_type, gpus_per_node=gpus_per_node)
        result = planner.plan(pspec, top_k=1)
    except Exception as exc:  # the planner refused the spec (the fit check says why) or cannot read it
        log.warning("no plan for the recovery choice", extra={"error": repr(exc)})
        return unplanned(recovery)
    if not result.plans:
        return unplanned(recovery)
    best = result.plans[0]
    groups = int(dict(recovery or {}).get("groups") or 0)
    if groups >= 2 and best.layout.dp % groups:  # named groups: the best plan whose dp they divide
        best = _plan_for_groups(job, groups, gpus, gpu_type=gpu_type, gpus_per_node=gpus_per_node) or best
    exact = job_plan_spec(job, best.num_gpus, gpu_type=gpu_type, gpus_per_node=gpus_per_node)
    exact["cluster"].pop("min_gpus", None)
    return choose(best, recovery, exact)


def runnable(spec: Mapping[str, Any], choice: RecoveryChoice, *, strict: bool = False) -> RecoveryChoice:
    """``choice`` as the runtime will run it for the job ``spec`` (``attempt_spec.replica_refusal``:
    a layout or snapshots a replica group does not run yet). Replica groups the job named keep
    going without the default snapshots when those are all the runtime refuses; otherwise the
    replica path running out re-plans from memory, saying why (never a failed job), or, ``strict``
    (a submission), a named ``replica_groups`` is a :class:`ChoiceError` on ``recovery.policy``."""
    from workers.runtime.contract.attempt_spec import replica_refusal

    why = replica_refusal(spec, choice.to_dict())
    if why is None:
        return choice
    named = dict(dict(spec.get("recovery") or {}).get("snapshots") or {})
    if choice.source == "spec" and choice.snapshots and "enabled" not in named:
        quiet = dataclasses.replace(choice, snapshots=False, reason=f"{choice.reason}; snapshots off: the "
                                                                    "runtime's replica groups do not take them yet")
        if replica_refusal(spec, quiet.to_dict()) is None:
            return quiet
    if strict and choice.source == "spec":
        raise ChoiceError("recovery.policy", f"the runtime does not run these replica groups: {why}")
    return dataclasses.replace(choice, policy="replan", groups=0, group_layout=None,
                               group_gpus=choice.groups * choice.group_gpus,
                               reason=f"re-plan from memory: the runtime does not run these replica groups ({why}); "
                                      f"the plan: {choice.reason}")


def _plan_for_groups(job: Mapping[str, Any], groups: int, gpus: int, *, gpu_type: str,
                     gpus_per_node: int | None) -> Any:
    """The best plan on the most GPUs (a multiple of ``groups``, at most ``gpus``) whose ``dp`` the
    ``groups`` divide; None when no count has one."""
    import planner

    for n in range(gpus - gpus % groups, groups - 1, -groups):
        pspec = job_plan_spec(job, n, gpu_type=gpu_type, gpus_per_node=gpus_per_node)
        pspec["cluster"].pop("min_gpus", None)
        result = planner.plan(pspec, top_k=1)
        if result.plans and result.plans[0].layout.dp % groups == 0:
            return result.plans[0]
    return None


def job_recovery(spec: Mapping[str, Any], gpus: int, *, gpu_type: str, gpus_per_node: int | None) -> RecoveryChoice:
    """:func:`plan_recovery` for the control plane, which must go on whatever the spec says: a policy
    that cannot hold on the plan (a named ``replica_groups`` the plan has no room for) or that the
    runtime would refuse (:func:`runnable`) re-plans from memory instead, saying why."""
    try:
        return runnable(spec, plan_recovery(spec, gpus, gpu_type=gpu_type, gpus_per_node=gpus_per_node))
    except ChoiceError as exc:
        block = {k: v for k, v in dict(spec.get("recovery") or {}).items() if k not in ("policy", "groups")}
        fallback = unplanned({**block, "policy": "replan"})
        return dataclasses.replace(fallback, reason=f"re-plan from memory: {exc}")


def whole_groups(choice: RecoveryChoice | None, min_gpus: int, max_gpus: int) -> tuple[int, int, int]:
    """(min, max, unit): a replica job's GPU range in whole groups of ``unit`` GPUs (the plan's
    groups at most); ``unit`` 1 for any other job (its range as it is)."""
    if choice is None or choice.policy != "replica_groups" or choice.group_gpus < 1 or choice.groups < 2:
        return min_gpus, max_gpus, 1
    unit = choice.group_gpus
    top = min(max_gpus // unit, choice.groups) * unit
    low = min(top, max(unit, -(-min_gpus // unit) * unit))
    return low, top, unit


__all__ = ["ChoiceError", "job_plan_spec", "job_recovery", "plan_recovery", "runnable", "whole_groups"]
