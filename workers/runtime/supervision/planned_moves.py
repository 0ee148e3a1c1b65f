"""Planned moves of the attempt machine: drains and resizes by groups, at a step boundary.

The control plane tells a supervisor which nodes are draining (``JobSupervisor.drain``: node id ->
seconds to the notice's deadline) and what the scheduler grants (``resize``). What to do is the pure
policy's (:mod:`workers.runtime.policy.planned_moves`); this part of the
:class:`~workers.runtime.supervision.attempt_machine.AttemptMachine` (a base class of it) carries it
out at the next step boundary, so no step is redone:

- one gang on a draining node: every rank's memory snapshot of the step just done is pushed before
  the gang goes (``RankWorker.flush_snapshot``; a checkpoint when the job keeps no snapshots), then a
  ``drain`` switch re-plans without the node and restores from that snapshot (``resumed`` with
  ``source: memory``, then ``drained``);
- replica groups: the groups with a rank on a draining node leave (``replica_dropped``, ``cause:
  drain``) while the others keep stepping, and replacements start elsewhere and heal from a live peer
  (``replica_joined``); a shrink drops the newest groups the same way (``cause: shrink``), a grow
  starts more groups.

Draining nodes stay out of every plan and placement of the job (``Replanner.set_drained``) until the
control plane leaves them out of its next ``drain`` call.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from workers.runtime.cluster.gang import Gang
from workers.runtime.contract import events as ev
from workers.runtime.policy import planning as planner_bridge
from workers.runtime.policy.planned_moves import (
    AddGroups,
    LeaveGroups,
    MoveGang,
    Stay,
    on_drain,
    on_group_resize,
)
from workers.runtime.recovery.replica_groups import ReplicaSet
from workers.runtime.supervision.attempt_state import Run, Switch


class PlannedMoves:
    """Drains and group resizes (see the module docstring); reads and writes the machine's state."""

    def _init_moves(self) -> None:
        self.drain_due: set[str] = set()  # draining nodes not acted on yet (the next step boundary does)
        self.drain_notice: dict[str, tuple[float, float]] = {}  # node -> (time.time() of the notice, deadline_s)
        self._moving: tuple[str, ...] = ()  # the nodes a drain switch is moving the gang off

    # ------------------------------------------------------------------ requests (from other threads)
    def request_drain(self, nodes: Mapping[str, float]) -> dict[str, Any]:
        """The nodes draining now (node id -> seconds to the notice's deadline): the whole set, so a
        node left out is undrained. Idempotent: a repeat changes nothing."""
        now = time.time()
        with self.lock:
            added, removed = self.replanner.set_drained(nodes)
            for n in added:
                self.drain_notice[n] = (now, float(nodes[n]))
            for n in removed:
                self.drain_notice.pop(n, None)
            self.drain_due = (self.drain_due | added) - removed
        return {"draining": sorted(nodes), "new": sorted(added), "undrained": sorted(removed)}

    def _notice(self, nodes: Iterable[str]) -> tuple[float, float]:
        """(seconds since the earliest notice for ``nodes``, the tightest deadline of them)."""
        got = [self.drain_notice[n] for n in nodes if n in self.drain_notice]
        if not got:
            return 0.0, 0.0
        return round(time.time() - min(t for t, _ in got), 3), min(d for _, d in got)

    # ------------------------------------------------------------------ one gang
    def _drain_gang(self, gang: Gang, step: int) -> Switch | None:
        """At the boundary after ``step`` steps: move the gang off draining nodes (the policy's call)."""
        with self.lock:
            due, self.drain_due = set(self.drain_due), set()
        if not due:
            return None
        d = on_drain(due, rank_nodes=gang.rank_nodes, snapshots=self.policy.source == "memory")
        if isinstance(d, Stay):
            return None
        assert isinstance(d, MoveGang)
        failed = self._hold_state(gang, step, d.source)
        if failed is not None:
            return failed
        self._moving = d.nodes
        return Switch("drain", change=planner_bridge.ClusterChange(reason=d.reason, lost_nodes=list(d.nodes)))

    def _hold_state(self, gang: Gang, step: int, source: str) -> Switch | None:
        """The state of the step just done, held where the next gang restores it from: every rank's
        memory snapshot pushed to its holders, or a checkpoint; a ``Switch`` when that failed."""
        if source != "memory":
            return self._save(gang, step) if self.last_ckpt_step != step else None
        t0 = time.time()
        deadline = max(self.settings.detection.hang_timeout_s, 10 * self.cadence.save_s)
        res = self.port.gather(gang, "flush_snapshot", deadline_s=deadline)
        if not res.ok:
            return self._on_failure(gang, res, t0, what="snapshot")
        return None

    def _drained_gang(self, start_step: int, source: ev.RestoreSource) -> None:
        """After a drain switch resumed: the ``drained`` event."""
        nodes, self._moving = sorted(self._moving), ()
        seconds, deadline = self._notice(nodes)
        self.log.emit(ev.Drained(reason=f"moved off draining node(s) {', '.join(n[:8] for n in nodes)}: resumed "
                                 f"from the {source} state of step {start_step}, nothing redone",
                                 nodes=nodes, step=start_step, how="replan", source=source, seconds=seconds,
                                 deadline_s=deadline))

    # ------------------------------------------------------------------ replica groups
    def _replica_moves(self, reps: ReplicaSet, run: Run) -> None:
        """At the boundary after ``run.step`` steps: drop the groups on draining nodes (replacements
        start elsewhere), and carry out a resize in whole groups."""
        with self.lock:
            due, self.drain_due = set(self.drain_due), set()
            target, self.resize_to = self.resize_to, None
        changed = False
        if due:
            with reps.lock:
                where = {g: list(gang.rank_nodes) for g, gang in reps.groups.items()}
            d = on_drain(due, groups=where)
            if isinstance(d, LeaveGroups):
                nodes = sorted({n for g in d.groups for n in where[g]} & due)
                self._leave_groups(reps, run, d.groups, "drain", d.reason)
                seconds, deadline = self._notice(nodes)
                self.log.emit(ev.Drained(reason=d.reason, nodes=nodes, step=run.step, how="replica_groups",
                                         source="peer", groups=list(d.groups), seconds=seconds, deadline_s=deadline))
                changed = True
        if target is not None:
            r = on_group_resize(target, group_size=reps.layout.world_size, live=sorted(reps.groups), want=reps.want)
            if isinstance(r, LeaveGroups):
                reps.want -= len(r.groups)
                self._leave_groups(reps, run, r.groups, "shrink", r.reason)
            elif isinstance(r, AddGroups):
                reps.want += r.count
                changed = True
            elif target < reps.layout.world_size:
                self.log.emit(ev.ResizeRefused(reason=r.reason, gpus=target, world_size=reps.ranks(), step=run.step))
        if changed:  # the drained groups' replacements and the grow's new groups, off draining nodes, now
            reps.start_replacements(self.port, self.replanner.excluded, 0.0, lambda g: None)

    def _leave_groups(self, reps: ReplicaSet, run: Run, groups: Iterable[int], cause: str, reason: str) -> None:
        """Groups leave at a step boundary (no step of theirs is in flight): torn down, then left out of
        the next quorum; the others' next step runs without them, nothing is redone."""
        groups = self._remove_groups(reps, [g for g in groups if g in reps.groups], step=run.step + 1, cause=cause,
                                     reason=lambda g: f"replica group {g} leaves ({cause}): {reason}")
        run.last_groups -= set(groups)  # the next step is a new one, not a redo without them
