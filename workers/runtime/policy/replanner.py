"""The plans one job attempt runs on, and the decisions to change them: :class:`Replanner`.

The replanner owns what the decisions need and nothing else: the plans in force (newest last), the
nodes kept out of plans (lost, suspect, slow), the last view of every node seen, the GPU cap and
per-node placement (the scheduler's grant, changed by ``resize``) and the measured cost of a switch.
A plan made from a grant (the first plan, a resize) stays within the granted GPUs of each node; a
re-plan after a failure may use any node left (the grant's nodes may be gone), capped at the GPU
count; the ``placed`` event tells the control plane where the gang went. It reads the cluster
through the :class:`~workers.runtime.cluster.port.ClusterPort` and asks ``planner_bridge`` (the bridge to
``planner``) for plans; it returns typed decisions (:class:`Keep`, :class:`SwitchTo`) and records
every plan and re-plan as an event. It never touches a gang: the state machine
(``workers.runtime.supervision.attempt_machine``) acts on its decisions.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from workers.runtime.cluster.placement_groups import NodeCapacity
from workers.runtime.cluster.port import ClusterPort
from workers.runtime.contract import events as ev
from workers.runtime.contract.job_spec import JobSpec
from workers.runtime.policy import planning as planner_bridge
from workers.runtime.policy.stragglers import StragglerFinding


@dataclass(frozen=True)
class Keep:
    """Stay on the plan in force."""

    reason: str


@dataclass(frozen=True)
class SwitchTo:
    """Checkpoint, tear the gang down and start ``replan.plan`` (the planner's ``Replan``)."""

    replan: Any
    change: planner_bridge.ClusterChange
    plan_s: float  # planner time spent deciding

    @property
    def plan(self) -> Any:
        return self.replan.plan


Decision = Keep | SwitchTo


def held_gpus(rank_nodes: Sequence[str]) -> dict[str, int]:
    """GPUs a gang whose ranks sit on ``rank_nodes`` holds per node."""
    out: dict[str, int] = {}
    for n in rank_nodes:
        out[n] = out.get(n, 0) + 1
    return out


HEAVY_DIMS = ("tp", "cp")  # the communication-heavy dimensions (collectives every layer), in order


def heavy_groups_crossing(plan: Any, slow_links: Sequence[str],
                          rank_nodes: Sequence[str] | None = None) -> list[tuple[str, tuple[int, ...]]]:
    """The TP and CP groups of ``plan`` that span nodes and have a member on one of ``slow_links``
    (their traffic crosses that node's link), as (dim, ranks). Ranks are numbered TP fastest, then
    CP (``planner.layout``); the node of every rank is ``rank_nodes`` (where a gang's ranks run) or
    else the plan's rank grid."""
    where = list(rank_nodes) if rank_nodes is not None else planner_bridge.plan_nodes(plan)
    if where is None or len(where) != plan.layout.world_size:
        return []
    lay, slow = plan.layout, set(slow_links)
    tp, cp = lay.tp, lay.cp
    groups: dict[tuple[str, tuple[int, ...]], None] = {}
    for r in range(lay.world_size):
        base_tp = r - r % tp
        tp_group = tuple(range(base_tp, base_tp + tp))
        cp_base = r % tp + (r // (tp * cp)) * tp * cp
        cp_group = tuple(cp_base + tp * i for i in range(cp))
        for dim, g in (("tp", tp_group), ("cp", cp_group)):
            nodes = {where[i] for i in g}
            if len(nodes) > 1 and nodes & slow:
                groups[(dim, g)] = None
    return list(groups)


class Replanner:
    def __init__(self, job: JobSpec, port: ClusterPort, log: ev.EventLog) -> None:
        self.job = job
        self.port = port
        self.log = log
        self.plans: list[tuple[Any, float]] = []  # (plan, when it was chosen), newest last
        self.excluded: set[str] = set()  # lost, suspect, slow or draining nodes kept out of plans
        self.drained: set[str] = set()  # draining nodes (an operator's notice): out until undrained
        self._kept_out: set[str] = set()  # excluded for a failure or slowness (undrain keeps them out)
        self.views: dict[str, NodeCapacity] = {}  # every node seen, by node id
        self.released: dict[str, int] = {}  # GPUs per node of the gang just torn down
        self.restart_s = 30.0  # measured cost of a gang switch (start + load + first step)
        self._lock = threading.Lock()
        self._cap: int | None = job.max_gpus  # the most GPUs the job may use (the scheduler's grant)
        self._grant: dict[str, int] = dict(job.placement)  # node id -> GPUs granted ({}: any node)
        self._resize_tried: tuple[int, float] = (0, 0.0)  # (target, when) of the last resize that kept

    # ---------------------------------------------------------------- the grant
    @property
    def cap(self) -> int | None:
        with self._lock:
            return self._cap

    def set_cap(self, gpus: int, world_size: int, retry_s: float,
                placement: Mapping[str, int] | None = None) -> tuple[bool, bool]:
        """A new grant (``placement``: where, when the scheduler says); returns (changed, armed):
        whether the cap changed and whether a re-plan at the next step boundary is due (a repeat arms
        nothing, except a grow that found no free GPU, tried again after ``retry_s``)."""
        with self._lock:
            last, when = self._resize_tried
            retry = gpus > world_size and (last != gpus or time.time() - when >= retry_s)
            changed = gpus != self._cap
            self._cap = gpus
            if placement is not None:
                self._grant = {str(n): int(g) for n, g in placement.items()}
            return changed, (changed or retry) and gpus != world_size

    def pinned(self, plan: Any) -> dict[str, int] | None:
        """GPUs per node ``plan`` must be placed with, while the scheduler's placement is in force
        (a plan made from it stays on those GPUs); ``None``: any of the plan's nodes will do."""
        with self._lock:
            grant = dict(self._grant)
        where = planner_bridge.plan_nodes(plan)
        if not grant or where is None:
            return None
        per_node = held_gpus(where)
        return per_node if all(per_node[n] <= grant.get(n, 0) for n in per_node) else None

    @property
    def in_force(self) -> Any:
        return self.plans[-1][0]

    # ---------------------------------------------------------------- cluster view
    def nodes(self, held: Mapping[str, int] | None = None, *, granted: bool = False) -> list[NodeCapacity]:
        """The cluster view for planning; GPUs our torn-down gang held count as free (the cluster
        may not have caught up with the release yet). ``granted``: only the granted GPUs of the
        granted nodes (when the scheduler named them)."""
        views = self.port.nodes(exclude=self.excluded, held=held if held is not None else self.released)
        for v in views:
            self.views[v.id] = v
        with self._lock:
            grant = dict(self._grant)
        if granted and grant:
            views = [dataclasses.replace(v, free_gpus=min(v.free_gpus, grant[v.id])) for v in views if v.id in grant]
        return views

    def exclude(self, nodes: Sequence[str]) -> None:
        self.excluded.update(nodes)
        self._kept_out.update(nodes)

    def set_drained(self, nodes: Collection[str]) -> tuple[set[str], set[str]]:
        """The draining nodes are ``nodes`` from now on (kept out of every plan and placement until
        undrained); returns (newly draining, undrained)."""
        now = set(nodes)
        added, removed = now - self.drained, self.drained - now
        self.drained = now
        # new sets, not changed in place: another thread (the supervisor's) calls this mid-iteration
        self.excluded = (self.excluded | added) - (removed - self._kept_out)
        return added, removed

    def _horizon_s(self) -> float:
        """Time over which a switch must pay for itself (the planner's ``horizon_s``)."""
        return float(self.job.raw.get("replan_horizon_s") or 3600.0)

    # ---------------------------------------------------------------- decisions
    def first(self, reason: str = "initial plan over the GPUs the cluster has", max_gpus: int | None = None,
              *, granted: bool = True) -> Any:
        """The first plan (or a smaller one after a placement timeout); raises ``PlanningError``.
        ``granted``: over the scheduler's named GPUs (else, as a re-plan after a failure, over the
        free GPUs of the nodes left, up to the grant's size)."""
        plan = planner_bridge.first_plan(self.job, self.nodes(granted=granted), max_gpus=max_gpus or self.cap)
        self._record_plan(plan, reason)
        return plan

    def after_failure(self, change: planner_bridge.ClusterChange) -> Any:
        """The planner's re-plan after a failure over the nodes left (lost nodes are named in
        ``change`` and counted in the base view, as ``planner.replan`` expects)."""
        nodes = self.nodes()
        have = {n.id for n in nodes}
        base = nodes + [dataclasses.replace(self.views[n], free_gpus=self.views[n].gpus)
                        for n in change.lost_nodes if n in self.views and n not in have]
        change.lost_nodes = [n for n in change.lost_nodes if n in self.views]
        prev = self.in_force
        rp = self._replan(change, base)
        self._record_replan(prev, rp, change)
        return rp

    def on_straggler(self, findings: Sequence[StragglerFinding], rank_nodes: Sequence[str]) -> Decision:
        """Slow nodes found. When a TP or CP group of the gang crosses a slow node's link, those groups
        move inside nodes first (:meth:`_heavy_dims_off`: the node stays). That covers a slow *link*
        (``cause == "link"``) and a ``compute`` finding alike, since busy time includes the TP/CP
        collectives that cross the link. Otherwise (a slow GPU, or a slow link only DP/PP cross)
        re-plan with the measured speed; a switch keeps unused slow nodes out."""
        # a compute finding counts too: a rank's busy time includes its TP/CP collectives, so when
        # those cross the node's link a slow link and a slow GPU look alike; the cheap remedy first
        # (a slow GPU is found again on the next window, with TP/CP inside nodes, and handled below)
        nodes = sorted({f.node for f in findings})
        moved = self._heavy_dims_off(nodes, rank_nodes)
        if moved is not None:
            return moved
        speeds = {f.node: max(0.05, f.score) for f in findings}
        change = planner_bridge.ClusterChange(slow_nodes=speeds, reason="straggler")
        t0 = time.monotonic()
        prev = self.in_force
        rp = self._replan(change, self.nodes(held=held_gpus(rank_nodes)))
        plan_s = time.monotonic() - t0
        self._record_replan(prev, rp, change)
        if rp.decision == "keep":
            return Keep(rp.reason or "the planner keeps the running plan")
        used = set(planner_bridge.nodes_used(rp.plan))
        self.exclude([n for n in speeds if n not in used])
        return SwitchTo(rp, change, plan_s)

    def _heavy_dims_off(self, slow_links: Sequence[str], rank_nodes: Sequence[str]) -> SwitchTo | None:
        """The planner's best plan over the same GPUs in which no TP or CP group spans nodes (so none
        crosses a slow link; a slow-link node keeps its GPUs), when the gang in force (ranks on
        ``rank_nodes``) has such a group on one of ``slow_links``; ``None`` when it has none (nothing to move: the caller treats
        the node as slow) or when no plan keeps them off (e.g. TP wider than every node)."""
        prev = self.in_force
        crossing = heavy_groups_crossing(prev, slow_links, rank_nodes)
        if not crossing:
            return None
        t0 = time.monotonic()
        nodes = self.nodes(held=held_gpus(rank_nodes))
        try:
            ranked = planner_bridge.ranked_plans(self.job, nodes, max_gpus=self.cap)
        except planner_bridge.PlanningError:
            return None
        # where the placement puts a plan's ranks is not known yet: no TP/CP group may span nodes at all
        off = [p for p in ranked if not heavy_groups_crossing(p, planner_bridge.plan_nodes(p) or [])]
        if not off:
            return None
        plan = off[0]
        where = ", ".join(f"{dim}{list(ranks)}" for dim, ranks in crossing)
        reason = (f"slow node(s) {[n[:8] for n in slow_links]} whose link {where} cross: TP/CP moved inside nodes "
                  f"({prev.layout.short()} -> {plan.layout.short()}), the node(s) stay")
        change = planner_bridge.ClusterChange(slow_links=list(slow_links), reason=reason)
        from planner.result import Replan

        rp = Replan(plan=plan, decision="replan", reason=reason,
                    old_tokens_per_s=prev.estimate.tokens_per_s, new_tokens_per_s=plan.estimate.tokens_per_s,
                    switch_cost_s=self.restart_s)
        self._record_replan(prev, rp, change)
        return SwitchTo(rp, change, time.monotonic() - t0)

    def on_resize(self, target: int, rank_nodes: Sequence[str], step: int) -> Decision:
        """Re-plan within a new grant; keeps the running plan when the planner says so (a grow that
        gains too little, or finds no free GPU), or when no plan fits (``resize_refused``)."""
        t0 = time.monotonic()
        world = len(rank_nodes)
        change = planner_bridge.ClusterChange(max_gpus=target, reason=f"resize to {target} GPUs")
        prev = self.in_force
        try:
            rp = self._replan(change, self.nodes(held=held_gpus(rank_nodes), granted=True))
        except planner_bridge.PlanningError as exc:
            self.log.emit(ev.ResizeRefused(reason=f"no plan for {target} GPUs: {exc}", gpus=target,
                                           world_size=world, step=step))
            self._tried(target)
            return Keep(str(exc))
        self._record_replan(prev, rp, change)
        if rp.decision == "keep":
            self._tried(target)
            return Keep(rp.reason or "the planner keeps the running plan")
        return SwitchTo(rp, change, time.monotonic() - t0)

    def maybe_grow(self, rank_nodes: Sequence[str]) -> Decision:
        """At a checkpoint boundary: re-plan onto nodes that (re)joined when the planner predicts a gain."""
        t0 = time.monotonic()
        nodes = self.nodes(held=held_gpus(rank_nodes))
        current = set(rank_nodes)
        added = [n for n in nodes if n.id not in current and n.free_gpus > 0]
        if not added:
            return Keep("no node joined")
        prev = self.in_force
        change = planner_bridge.ClusterChange(added_nodes=[{"id": n.id, "gpus": n.free_gpus, "speed": 1.0} for n in added],
                                        reason="capacity returned")
        base = [n for n in nodes if (n.id in current or n.id in set(planner_bridge.nodes_used(prev))) and n not in added]
        try:
            rp = self._replan(change, base)
        except planner_bridge.PlanningError as exc:
            return Keep(str(exc))
        if rp.decision == "keep" or rp.plan.layout.world_size <= len(rank_nodes):
            return Keep(rp.reason or "growing gains too little")
        self._record_replan(prev, rp, change)
        return SwitchTo(rp, change, time.monotonic() - t0)

    # ---------------------------------------------------------------- internals
    def _tried(self, target: int) -> None:
        with self._lock:
            self._resize_tried = (target, time.time())

    def _replan(self, change: planner_bridge.ClusterChange, base: list[NodeCapacity]) -> Any:
        """``planner_bridge.replan`` from the plan in force, capped at the job's grant unless ``change``
        names another cap (a resize)."""
        if change.max_gpus is None:
            change.max_gpus = self.cap
        prev = self.in_force
        return planner_bridge.replan(self.job, prev, prev.layout, change, base,
                               restart_s=self.restart_s, horizon_s=self._horizon_s())

    def _record_plan(self, plan: Any, reason: str) -> None:
        self.plans.append((plan, time.time()))
        est = plan.estimate
        self.log.emit(ev.PlanChosen(reason=reason, layout=plan.layout.to_dict(), short=plan.layout.short(),
                                    num_gpus=plan.num_gpus, nodes=planner_bridge.nodes_used(plan),
                                    predicted_tokens_per_s=round(est.tokens_per_s, 2),
                                    predicted_step_time_s=round(est.step_time_s, 6),
                                    ettr=getattr(plan, "ettr", None), recovery=getattr(plan, "recovery", None)))

    def _record_replan(self, prev: Any, rp: Any, change: planner_bridge.ClusterChange) -> None:
        if rp.decision != "keep":
            self.plans.append((rp.plan, time.time()))
        self.log.emit(ev.Replanned(reason=rp.reason or change.reason, decision=rp.decision,
                                   old=prev.layout.to_dict(), new=rp.plan.layout.to_dict(),
                                   old_short=prev.layout.short(), new_short=rp.plan.layout.short(),
                                   old_tokens_per_s=round(rp.old_tokens_per_s, 2),
                                   new_tokens_per_s=round(rp.new_tokens_per_s, 2),
                                   switch_cost_s=round(rp.switch_cost_s, 3), change=change.to_dict(),
                                   nodes=planner_bridge.nodes_used(rp.plan)))
