"""Choosing a gang's plan and deciding when to switch to another: the first plan, re-plans after a
failure (waiting for GPUs when too few are free), stragglers, capacity that returned, and the
scheduler's resizes. A mixin of :class:`workers.runtime.supervisor.JobSupervisor`, kept apart so the
supervisor's file holds the loop and this one the decisions; every re-plan is capped at the job's
current grant (``self._cap``).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from workers.runtime import events as ev
from workers.runtime import placement, planning
from workers.runtime.gang import Gang
from workers.runtime.straggler import StragglerScorer
from workers.runtime.watchdog import Failure


class JobFailed(RuntimeError):
    pass


@dataclass
class Switch:
    """Why the current gang ends before the job does."""

    kind: str  # failure | straggler | grow | resize | finished | cancelled | preempted
    failure: Failure | None = None
    fault_ts: float | None = None  # when the fault that caused it started (detect phase)
    change: planning.ClusterChange | None = None
    replan: Any = None
    detect_s: float = 0.0
    plan_s: float = 0.0  # planner time already spent deciding the switch



def held_gpus(gang: Gang) -> dict[str, int]:
    """GPUs this gang holds per node (given back if the job switches plans)."""
    out: dict[str, int] = {}
    for n in gang.rank_nodes:
        out[n] = out.get(n, 0) + 1
    return out



class Replanning:
    """Plan and switch decisions (needs the attributes ``JobSupervisor.__init__`` sets)."""

    # mixin: these live on JobSupervisor
    job: Any
    settings: Any
    log: Any
    _cap: int | None

    def _horizon_s(self) -> float:
        """Time over which a switch must pay for itself (the planner's ``horizon_s``)."""
        return float(self.job.raw.get("replan_horizon_s") or 3600.0)

    def _nodes(self, held: dict[str, int] | None = None) -> list[placement.NodeView]:
        """The cluster view for planning; GPUs our torn-down gang held count as free (the GCS may
        not have caught up with the release yet)."""
        views = placement.cluster_nodes(exclude=self._excluded, held=held if held is not None else self._released)
        for v in views:
            self._views[v.id] = v
        return views

    def _plan_when_possible(self, switch: Switch | None) -> tuple[Any, Any] | Switch:
        """Plan (or re-plan). When too few GPUs are free, wait for them (``waiting_for_gpus``) up to
        ``placement_give_up_s`` instead of failing: a node comes back, another job ends. A plan that
        cannot exist whatever is free (a refused spec at the first plan) fails at once. Cancel and
        preempt are honoured while waiting (the newest checkpoint is what a preempted job keeps)."""
        give_up = time.monotonic() + self.settings.placement_give_up_s
        waiting = False
        while True:
            try:
                return self._choose_plan(switch)
            except planning.PlanningError as exc:
                if switch is None and not isinstance(exc, planning.NoCapacity):
                    raise
                if time.monotonic() > give_up:
                    raise JobFailed(f"no GPUs for {self.settings.placement_give_up_s:.0f}s: {exc}") from exc
                if not waiting:
                    waiting = True
                    self.log.emit(ev.WaitingForGpus(reason=f"waiting for GPUs: {exc}", step=self._next_step,
                                                    max_gpus=self._cap, min_gpus=self.job.min_gpus))
            self._released = {}  # the GCS has caught up with our own release by now
            deadline = time.monotonic() + self.settings.placement_retry_s
            while time.monotonic() < deadline:
                if self._cancel or self._preempt:
                    return Switch("cancelled" if self._cancel else "preempted")
                time.sleep(0.2)

    def _choose_plan(self, switch: Switch | None) -> tuple[Any, Any]:
        nodes = self._nodes()
        if switch is None:
            plan = planning.first_plan(self.job, nodes, max_gpus=self._cap)
            self._event_plan(plan, "initial plan over the GPUs Ray has")
            return plan, None
        if switch.replan is not None:  # decided already (straggler / grow)
            return switch.replan.plan, switch.replan
        prev = self._plans[-1]["plan"]
        change = switch.change or planning.ClusterChange()
        have = {n.id for n in nodes}
        base = nodes + [dataclasses.replace(self._views[n], free_gpus=self._views[n].gpus)
                        for n in change.lost_nodes if n in self._views and n not in have]
        change.lost_nodes = [n for n in change.lost_nodes if n in self._views]
        rp = self._replan(change, base)
        self._event_replan(prev, rp, change)
        return rp.plan, rp

    def _replan(self, change: planning.ClusterChange, base: list[placement.NodeView]) -> Any:
        """``planning.replan`` from the plan in force, capped at the job's grant unless ``change``
        names another cap (a resize)."""
        if change.max_gpus is None:
            change.max_gpus = self._cap
        prev = self._plans[-1]["plan"]
        return planning.replan(self.job, prev, prev.layout, change, base,
                               restart_s=self._restart_s, horizon_s=self._horizon_s())

    def _on_straggler(self, gang: Gang, findings: list[Any], scorer: StragglerScorer, walls: list[float],
                      step: int) -> Switch | None:
        speeds = {f.node: max(0.05, f.score) for f in findings}
        for f in findings:
            self.log.emit(ev.StragglerFound(reason=f"node {f.node[:8]} at {f.score:.2f}x the median over window "
                                            f"{f.window} (threshold {self.settings.straggler_threshold})",
                                            step=step, **f.to_dict()))
        prev = self._plans[-1]["plan"]
        change = planning.ClusterChange(slow_nodes=speeds, reason="straggler")
        t0 = time.monotonic()
        rp = self._replan(change, self._nodes(held=held_gpus(gang)))
        plan_s = time.monotonic() - t0
        self._event_replan(prev, rp, change)
        scorer.ignore_nodes = frozenset(scorer.ignore_nodes | set(speeds))
        if rp.decision == "keep":
            return None
        used = set(planning.nodes_used(rp.plan))
        self._excluded.update(n for n in speeds if n not in used)
        failed = self._save(gang, step) if self._last_ckpt_step != step else None
        if failed is not None:
            return failed
        # detected over a window of steps: the slowdown is dated to the launch of the window's first step
        slow_since = min((self._step_ts.get(f.first_step, time.time()) for f in findings), default=None)
        return Switch("straggler", change=change, replan=rp, plan_s=plan_s,
                      detect_s=max(0.0, time.time() - slow_since) if slow_since else 0.0)

    def _on_resize(self, gang: Gang, step: int) -> Switch | None:
        """At a step boundary: re-plan within the new grant; checkpoint and switch unless the planner
        keeps the running plan (a grow that gains too little, or finds no free GPU, keeps it)."""
        with self._lock:
            target, self._resize_to = self._resize_to, None
        if target is None or target == gang.world_size:
            return None
        t0 = time.monotonic()
        prev = self._plans[-1]["plan"]
        change = planning.ClusterChange(max_gpus=target, reason=f"resize to {target} GPUs")
        try:
            rp = self._replan(change, self._nodes(held=held_gpus(gang)))
        except planning.PlanningError as exc:
            self.log.emit(ev.ResizeRefused(reason=f"no plan for {target} GPUs: {exc}", gpus=target,
                                           world_size=gang.world_size, step=step))
            self._resize_tried = (target, time.time())
            return None
        self._event_replan(prev, rp, change)
        if rp.decision == "keep":
            self._resize_tried = (target, time.time())
            return None
        failed = self._save(gang, step) if self._last_ckpt_step != step else None
        if failed is not None:
            return failed
        return Switch("resize", change=change, replan=rp, plan_s=time.monotonic() - t0)

    def _maybe_grow(self, gang: Gang, walls: list[float]) -> Switch | None:
        """At a checkpoint boundary: re-plan onto nodes that (re)joined when the planner predicts a gain."""
        t0 = time.monotonic()
        nodes = self._nodes(held=held_gpus(gang))
        current = set(gang.nodes)
        added = [n for n in nodes if n.id not in current and n.free_gpus > 0]
        if not added:
            return None
        prev = self._plans[-1]["plan"]
        change = planning.ClusterChange(added_nodes=[{"id": n.id, "gpus": n.free_gpus, "speed": 1.0} for n in added],
                                        reason="capacity returned")
        base = [n for n in nodes if n.id in current or n.id in set(planning.nodes_used(prev))]
        base = [n for n in base if n not in added]
        try:
            rp = self._replan(change, base)
        except planning.PlanningError:
            return None
        if rp.decision == "keep" or rp.plan.layout.world_size <= gang.world_size:
            return None
        self._event_replan(prev, rp, change)
        return Switch("grow", change=change, replan=rp, plan_s=time.monotonic() - t0)

    def _event_plan(self, plan: Any, reason: str) -> None:
        self._plans.append({"plan": plan, "ts": time.time()})
        est = plan.estimate
        self.log.emit(ev.PlanChosen(reason=reason, layout=plan.layout.to_dict(), short=plan.layout.short(),
                                    num_gpus=plan.num_gpus, nodes=planning.nodes_used(plan),
                                    predicted_tokens_per_s=round(est.tokens_per_s, 2),
                                    predicted_step_time_s=round(est.step_time_s, 6)))

    def _event_replan(self, prev: Any, rp: Any, change: planning.ClusterChange) -> None:
        if rp.decision != "keep":
            self._plans.append({"plan": rp.plan, "ts": time.time()})
        self.log.emit(ev.Replanned(reason=rp.reason or change.reason, decision=rp.decision,
                                   old=prev.layout.to_dict(), new=rp.plan.layout.to_dict(),
                                   old_short=prev.layout.short(), new_short=rp.plan.layout.short(),
                                   old_tokens_per_s=round(rp.old_tokens_per_s, 2),
                                   new_tokens_per_s=round(rp.new_tokens_per_s, 2),
                                   switch_cost_s=round(rp.switch_cost_s, 3), change=change.to_dict(),
                                   nodes=planning.nodes_used(rp.plan)))

