"""The bridge to ``planner``: turn what Ray has into a planner spec, ask for a plan or a re-plan.

The cluster view is the alive GPU nodes (by Ray node id) with the GPUs free for this job and a
per-node relative speed (1.0, or the straggler score measured for a slow node). A layout hint fixes
parallel fields of the *first* plan only; re-plans may change any of TP, PP, CP, DP.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from workers.planner_spec import PlanCluster, to_planner_spec
from workers.runtime.cluster.placement_groups import NodeCapacity
from workers.runtime.contract.job_spec import JobSpec


class PlanningError(RuntimeError):
    """No plan fits the GPUs available (or the planner refused the spec)."""


class NoCapacity(PlanningError):
    """Too few GPUs are free right now (this may change: wait, do not fail)."""


@dataclass
class ClusterChange:
    """What changed since the previous plan, in ``planner.replan``'s ``cluster_change`` shape."""

    lost_nodes: list[str] = field(default_factory=list)
    slow_nodes: dict[str, float] = field(default_factory=dict)
    added_nodes: list[dict[str, Any]] = field(default_factory=list)  # [{"id", "gpus", "speed"}]
    max_gpus: int | None = None  # the most GPUs the job may use afterwards (the scheduler's grant)
    slow_links: list[str] = field(default_factory=list)  # nodes whose link is slow (not for the planner)
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.lost_nodes:
            out["lost_nodes"] = list(self.lost_nodes)
        if self.slow_nodes:
            out["slow_nodes"] = dict(self.slow_nodes)
        if self.added_nodes:
            out["added_nodes"] = [dict(n) for n in self.added_nodes]
        if self.max_gpus is not None:
            out["max_gpus"] = int(self.max_gpus)
        if self.slow_links:
            out["slow_links"] = list(self.slow_links)
        return out

    def for_planner(self) -> dict[str, Any]:
        """``planner.replan``'s ``cluster_change`` (it has no notion of a node's link)."""
        return {k: v for k, v in self.to_dict().items() if k != "slow_links"}


def planner_spec(
    job: JobSpec,
    nodes: Sequence[NodeCapacity],
    *,
    speeds: Mapping[str, float] | None = None,
    max_gpus: int | None = None,
    hint: Mapping[str, Any] | None = None,
    restart_s: float | None = None,
    horizon_s: float | None = None,
) -> dict[str, Any]:
    """A ``planner.plan`` spec for ``job`` over ``nodes`` (ids are Ray node ids), built by the one
    builder (``workers.planner_spec.to_planner_spec``)."""
    if not nodes:
        raise NoCapacity("no alive node with free GPUs")
    speeds = dict(speeds or {})
    node_list = [{"id": n.id, "gpus": n.free_gpus, "speed": float(speeds.get(n.id, 1.0))} for n in nodes
                 if n.free_gpus > 0]
    if not node_list:
        raise NoCapacity("no GPU is free on the alive nodes")
    total = sum(int(n["gpus"]) for n in node_list)
    limit = max_gpus or job.max_gpus or total
    cap = min(total, limit)
    need = min(job.min_gpus, limit)  # a grant below min_gpus (a scheduler's shrink) lowers the floor
    if cap < need:
        raise NoCapacity(f"{cap} GPUs available, the job needs at least {need}")
    training: dict[str, Any] = {}
    if restart_s is not None:
        training["restart_s"] = max(float(restart_s), 1e-3)
    if horizon_s is not None:
        training["horizon_s"] = max(float(horizon_s), 1e-3)
    cluster = PlanCluster(gpu_type=str(job.raw.get("gpu_type", "CPU")), num_gpus=cap, min_gpus=need, nodes=node_list)
    goodput: dict[str, Any] = {}
    if job.duration_days is not None:  # goodput-aware plans; the runtime has no event store, so ``cluster``
        # rates price with llama3 here (the API's dry run reads the cluster's own history)
        rates = job.failure_rates or "llama3"
        goodput = {"duration_days": job.duration_days, "failure_rates": "llama3" if rates == "cluster" else rates}
    spec = to_planner_spec({"model": job.model, "global_batch": job.global_batch, "layout_hint": dict(hint or {}),
                            **goodput}, cluster, training=training)
    spec.setdefault("training", {})
    spec["cluster"].update(job.network)  # known link speeds (a capped test network) over the profile's
    return spec


def first_plan(job: JobSpec, nodes: Sequence[NodeCapacity], *, max_gpus: int | None = None) -> Any:
    """The best plan for ``nodes`` (honouring the job's layout hint when one is given)."""
    import planner

    spec = planner_spec(job, nodes, max_gpus=max_gpus, hint=job.layout_hint)
    try:
        result = planner.plan(spec, top_k=5)
    except ValueError as exc:
        raise PlanningError(f"planner refused the spec: {exc}") from exc
    if not result.plans:
        reasons = "; ".join(sorted({r.reason for r in result.rejected})[:3])
        raise PlanningError(f"no plan fits: {reasons or 'nothing searched'}")
    return result.plans[0]


def ranked_plans(job: JobSpec, nodes: Sequence[NodeCapacity], *, max_gpus: int | None = None,
                 top_k: int = 10) -> list[Any]:
    """The planner's best ``top_k`` plans for ``nodes`` (one per TP/PP/CP/DP shape, best first; no
    layout hint: for re-plans)."""
    import planner

    spec = planner_spec(job, nodes, max_gpus=max_gpus)
    try:
        result = planner.plan(spec, top_k=top_k)
    except ValueError as exc:
        raise PlanningError(f"planner refused the spec: {exc}") from exc
    if not result.plans:
        raise PlanningError("no plan fits")
    return list(result.plans)


def replan(
    job: JobSpec,
    previous: Any,
    checkpoint_layout: Any,
    change: ClusterChange,
    base_nodes: Sequence[NodeCapacity],
    *,
    restart_s: float | None = None,
    horizon_s: float | None = None,
) -> Any:
    """``planner.replan``; ``base_nodes`` is the cluster *before* ``change`` (lost nodes included,
    added nodes not). ``change.max_gpus`` caps the result (the scheduler's grant): without it a job
    would re-plan onto every free GPU of the survivors. Returns the planner's ``Replan``."""
    import planner

    spec = planner_spec(job, base_nodes, max_gpus=change.max_gpus, restart_s=restart_s, horizon_s=horizon_s)
    try:
        return planner.replan(previous, checkpoint_layout, change.for_planner(), spec)
    except ValueError as exc:
        raise PlanningError(f"planner refused the re-plan: {exc}") from exc


def plan_nodes(plan: Any) -> list[str] | None:
    """The node (Ray node id) the plan wants for each rank, or ``None`` when it does not say."""
    grid = sorted(getattr(plan, "rank_grid", ()) or (), key=lambda s: s.rank)
    if len(grid) != plan.layout.world_size:
        return None
    return [str(s.node) for s in grid]


def nodes_used(plan: Any) -> list[str]:
    used = [str(n) for n in (getattr(plan, "nodes_used", ()) or ())]
    return used or sorted(set(plan_nodes(plan) or []))
