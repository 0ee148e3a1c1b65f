"""Re-planning after the cluster changed (nodes lost, added, slower or faster).

Three options are costed on the changed cluster and compared by the tokens they deliver over the
spec's horizon ``H`` (``training.horizon_s``, default one hour): ``tokens/s x max(0, H - switch cost)``.

- ``keep``: the previous plan as it is, when every node it used is still there and it stays within
  ``max_gpus`` (no switch cost; its speed is now set by its slowest node).
- ``shrink_dp``: the previous TP/PP/CP/VPP shape with fewer data-parallel replicas on the fastest
  remaining nodes (same global batch, more micro-batches); costs a restart and a checkpoint load, no
  reshard of the model-parallel dimensions.
- ``replan``: the planner's best plan for the remaining GPUs, any count down to the job's minimum,
  so a slow node is left out when that is faster; costs a restart, a load, and a reshard when the
  model-parallel shape differs from the checkpoint's.

Switch cost: ``restart_s`` (``training.restart_s``, default 60 s) + checkpoint load
``14 B/param x N / (GPUs x checkpoint_read_GBps)`` (bf16 weights + fp32 master + Adam m, v), doubled
when the checkpoint must be resharded to another TP/PP/CP/VPP.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from planner.flops import total_params
from planner.layout import Layout
from planner.recovery_cost import CHECKPOINT_BYTES_PER_PARAM
from planner.result import Plan, Replan
from planner.search import evaluate_on, search
from planner.spec import NodeSpec, PlanSpec, SpecError, _bool, _float, _int, parse_spec


def apply_change(spec: PlanSpec, change: Mapping[str, Any]) -> PlanSpec:
    """The spec's cluster after ``change``: ``lost_nodes`` (or ``failed_nodes``), ``node_speeds``
    (or ``slow_nodes``) mapping id -> relative speed, ``added_nodes`` ([{id, gpus, speed}]),
    ``max_gpus`` (the most GPUs the job may use afterwards: the scheduler's grant; default: every GPU
    of the changed cluster)."""
    if not isinstance(change, Mapping):
        raise SpecError("cluster_change", f"must be an object, got {type(change).__name__}")
    known = {"lost_nodes", "failed_nodes", "node_speeds", "slow_nodes", "added_nodes", "allow_fewer", "max_gpus"}
    for key in change:
        if key not in known:
            raise SpecError(f"cluster_change.{key}", f"unknown field; known: {', '.join(sorted(known))}")
    nodes = {str(n.id): n for n in spec.cluster.nodes}
    lost_raw = change.get("lost_nodes", change.get("failed_nodes")) or []
    if not isinstance(lost_raw, list):
        raise SpecError("cluster_change.lost_nodes", "must be a list of node ids")
    for node_id in lost_raw:
        if str(node_id) not in nodes:
            raise SpecError("cluster_change.lost_nodes", f"unknown node id {node_id!r}")
        del nodes[str(node_id)]
    speeds = change.get("node_speeds", change.get("slow_nodes")) or {}
    if not isinstance(speeds, Mapping):
        raise SpecError("cluster_change.node_speeds", "must map node id -> relative speed")
    for node_id, speed in speeds.items():
        if str(node_id) not in nodes:
            raise SpecError("cluster_change.node_speeds", f"unknown or lost node id {node_id!r}")
        nodes[str(node_id)] = dataclasses.replace(nodes[str(node_id)],
                                                  speed=_float(speed, f"cluster_change.node_speeds.{node_id}"))
    added = change.get("added_nodes") or []
    if not isinstance(added, list):
        raise SpecError("cluster_change.added_nodes", "must be a list of {id, gpus, speed}")
    for i, item in enumerate(added):
        where = f"cluster_change.added_nodes[{i}]"
        if not isinstance(item, Mapping) or "id" not in item:
            raise SpecError(where, "must be an object with id, gpus and optional speed")
        if str(item["id"]) in nodes:
            raise SpecError(f"{where}.id", f"node {item['id']!r} is already in the cluster")
        nodes[str(item["id"])] = NodeSpec(id=item["id"], gpus=_int(item.get("gpus"), f"{where}.gpus"),
                                          speed=_float(item.get("speed", 1.0), f"{where}.speed"))
    if not nodes:
        raise SpecError("cluster_change.lost_nodes", "no node is left")
    allow_fewer = _bool(change.get("allow_fewer", True), "cluster_change.allow_fewer")
    total = sum(n.gpus for n in nodes.values())
    if change.get("max_gpus") is not None:
        total = min(total, _int(change["max_gpus"], "cluster_change.max_gpus"))
    min_gpus = min(spec.cluster.min_gpus, total) if spec.cluster.min_gpus else (1 if allow_fewer else total)
    cluster = dataclasses.replace(spec.cluster, nodes=tuple(nodes.values()), num_gpus=total, min_gpus=min_gpus)
    return spec.with_cluster(cluster)


def switch_cost_s(spec: PlanSpec, new: Layout, checkpoint: Layout | None) -> float:
    load = CHECKPOINT_BYTES_PER_PARAM * total_params(spec.model) / (new.world_size * spec.checkpoint_read_GBps * 1e9)
    same_shape = checkpoint is not None and (checkpoint.tp, checkpoint.pp, checkpoint.cp, checkpoint.vpp) == (
        new.tp, new.pp, new.cp, new.vpp)
    return spec.restart_s + load * (1.0 if same_shape else 2.0)


def _shrink_dp(spec: PlanSpec, old: Layout) -> Plan | None:
    """The old model-parallel shape with the most useful number of DP replicas that still works."""
    mp = old.tp * old.pp * old.cp
    best: Plan | None = None
    for dp in range(spec.cluster.num_gpus // mp, 0, -1):
        per = spec.global_batch // dp if spec.global_batch % dp == 0 else 0
        if not per:
            continue
        mbs = [b for b in range(min(old.micro_batch, per), 0, -1) if per % b == 0]
        for b in mbs:
            # with replica groups, shrinking DP drops whole replica groups (the shard split stays);
            # a DP count the shard size does not divide falls back to plain ZeRO over all of DP
            rep = dp // old.dp_shard if old.dp_replicate > 1 and dp % old.dp_shard == 0 else 1
            lay = dataclasses.replace(old, dp=dp, dp_replicate=rep, micro_batch=b, num_micro_batches=per // b)
            if lay.schedule == "interleaved" and lay.num_micro_batches % lay.pp:
                continue
            plan = evaluate_on(spec, lay, None)
            if isinstance(plan, Plan):
                if best is None or plan.estimate.tokens_per_s > best.estimate.tokens_per_s:
                    best = plan
                break
    return best


def _as_layout(value: Layout | Mapping[str, Any] | str | None) -> Layout | None:
    if value is None or isinstance(value, Layout):
        return value
    if isinstance(value, str):
        return Layout.parse(value)
    return Layout.from_dict(dict(value))


def replan(previous_plan: Plan | Mapping[str, Any], checkpoint_layout: Layout | Mapping[str, Any] | str | None,
           cluster_change: Mapping[str, Any], spec: Mapping[str, Any] | PlanSpec) -> Replan:
    prev = previous_plan if isinstance(previous_plan, Plan) else Plan.from_dict(previous_plan)
    ckpt = _as_layout(checkpoint_layout) or prev.layout
    base = parse_spec(spec)
    changed = apply_change(base, cluster_change)
    horizon = changed.horizon_s
    options: dict[str, dict[str, Any]] = {}
    candidates: list[tuple[float, int, str, Plan, float]] = []

    # keep: every node the old plan used is still there
    alive = {str(n.id): n for n in changed.cluster.nodes}
    used = [alive.get(str(i)) for i in prev.nodes_used] if prev.nodes_used else []
    old_tps = 0.0
    if prev.layout.world_size > changed.cluster.num_gpus:
        options["keep"] = {"rejected": f"the previous plan uses {prev.layout.world_size} GPUs, more than the "
                                       f"{changed.cluster.num_gpus} the job may use now"}
    elif used and all(n is not None for n in used):
        nodes = tuple(n for n in used if n is not None)
        keep = evaluate_on(changed, prev.layout, nodes)
        if isinstance(keep, Plan):
            old_tps = keep.estimate.tokens_per_s
            candidates.append((old_tps * horizon, 2, "keep", keep, 0.0))
            options["keep"] = {"tokens_per_s": old_tps, "switch_cost_s": 0.0}
        else:
            options["keep"] = {"rejected": keep.reason}
    else:
        options["keep"] = {"rejected": "a node of the previous plan is gone"}

    shrink = _shrink_dp(changed, prev.layout)
    if shrink is not None:
        cost = switch_cost_s(changed, shrink.layout, ckpt)
        tps = shrink.estimate.tokens_per_s
        candidates.append((tps * max(0.0, horizon - cost), 1, "shrink_dp", shrink, cost))
        options["shrink_dp"] = {"tokens_per_s": tps, "switch_cost_s": cost, "layout": shrink.layout.short(),
                                "num_gpus": shrink.num_gpus}
        old_tps = old_tps or tps
    else:
        options["shrink_dp"] = {"rejected": "the old TP/PP/CP shape does not fit the remaining GPUs"}

    result = search(changed, top_k=1)
    if result.plans:
        new = result.plans[0]
        cost = switch_cost_s(changed, new.layout, ckpt)
        tps = new.estimate.tokens_per_s
        candidates.append((tps * max(0.0, horizon - cost), 0, "replan", new, cost))
        options["replan"] = {"tokens_per_s": tps, "switch_cost_s": cost, "layout": new.layout.short(),
                             "num_gpus": new.num_gpus}
    else:
        reasons = "; ".join(f"{k}: {v}" for k, v in sorted(result.rejected_counts.items()))
        options["replan"] = {"rejected": f"no layout fits the remaining GPUs ({reasons})"}
    if not candidates:
        raise SpecError("cluster_change", "nothing can run on the remaining GPUs: "
                        + "; ".join(f"{k}: {v.get('rejected')}" for k, v in options.items()))
    candidates.sort(key=lambda c: (c[0], c[1]), reverse=True)
    tokens, _, decision, plan, cost = candidates[0]
    parts = [f"{name}: {o['tokens_per_s']:.0f} tok/s, switch {o['switch_cost_s']:.0f} s"
             if "tokens_per_s" in o else f"{name}: {o['rejected']}" for name, o in options.items()]
    reason = (f"{decision} delivers the most tokens over the {horizon:.0f} s horizon "
              f"({tokens:.3g} tokens on {plan.num_gpus} GPUs, nodes {list(plan.nodes_used)}); " + "; ".join(parts))
    return Replan(plan=plan, decision=decision, reason=reason, old_tokens_per_s=old_tps,
                  new_tokens_per_s=plan.estimate.tokens_per_s, switch_cost_s=cost, options=options)

