"""The replica-group phases of the attempt machine (runtime option ``replica_groups >= 2``, the
``replica_group`` recovery policy).

PLAN makes one group's layout (the hint's TP; no planner search: the groups are the unit of
failure), PLACE a node and a placement group per group, START every group's gang, TRAIN one step
attempt of every live group per call, with the job's periodic checkpoint (written by one group) and
in-memory snapshot (taken by one group). A failed gather goes to the
:class:`~workers.runtime.policy.recovery.RecoveryPolicy`; its decision -- drop the groups it took
(replacements start in the background and join at a step boundary, healing from a peer), let the
live groups redo the step, fall back to a re-plan when the replica path ran out (every group torn
down; the job goes on as one gang from the newest snapshot or checkpoint), or end the job -- is
carried out here. :class:`ReplicaGroupPhases` is a
part of :class:`~workers.runtime.supervision.attempt_machine.AttemptMachine` (a base class of it):
it reads and writes the machine's state.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from planner.layout import Layout
from workers.engine.config import TrainConfig
from workers.engine.replica_rows import group_layout
from workers.runtime.cluster.gang import Gang, StartFailed
from workers.runtime.cluster.placement_groups import Reservation
from workers.runtime.cluster.watchdog import GatherResult
from workers.runtime.contract import events as ev
from workers.runtime.policy import planning as planner_bridge
from workers.runtime.policy.recovery import DropGroups, Fail, GroupStep, Replan
from workers.runtime.policy.replanner import held_gpus
from workers.runtime.policy.stragglers import StragglerScorer
from workers.runtime.recovery.replica_groups import ReplicaSet
from workers.runtime.supervision.attempt_state import Cycle, JobFailed, Phase, Run, Switch


class ReplicaGroupPhases:
    """PLAN, PLACE and START of replica groups, their step, drops, replacements and tear-down."""

    replicas: ReplicaSet | None
    _train_config: TrainConfig | None = None  # the job's, parsed once (``_after_step``)

    def _plan_replicas(self) -> tuple[Phase, str]:
        """One group's layout (the layout hint: any of TP, PP, CP, DP, ZeRO/FSDP; its trainers built for
        one pass, ``replica_rows.group_layout``) times ``replica_groups``; no planner search (the
        groups are the unit of failure)."""
        if self.cancel_requested or self.preempt_requested:
            return self._end_switch(Switch("cancelled" if self.cancel_requested else "preempted"))
        if self.replicas is not None:  # the fallback hands PLAN to the single-gang phases (_fall_back)
            raise JobFailed("replica groups: planned twice")
        layout = group_layout(Layout.from_dict(dict(self.job.layout_hint)))
        self.replicas = ReplicaSet(layout, int(self.settings.replicas.groups), self.name)
        now = time.monotonic()
        self._cycle = Cycle(t_down=now, t_plan=now, t_place=now, give_up=now + self.settings.placement.give_up_s)
        return Phase.PLACE, f"{self.replicas.want} replica groups of {layout.short()}"

    def _place_replicas(self) -> tuple[Phase, str]:
        """A node per group (nodes holding no group first; several when the group's layout needs more
        GPUs than a node has), each group its own placement group; fewer groups when fewer nodes have
        room (the others are started later, as replacements)."""
        cycle, reps = self._cycle, self.replicas
        assert cycle is not None and reps is not None
        world = reps.layout.world_size
        spots = reps.pick_spots(self.port, reps.want, self.replanner.excluded)
        got: list[tuple[dict[str, int], Reservation]] = []
        for g, spot in enumerate(spots):
            res = self.port.reserve(world, nodes=list(spot), name=f"{self.name}-rg{g}", per_node=dict(spot))
            if res is None:
                break
            got.append((spot, res))
        placement: dict[str, int] = {}  # every group's GPUs per node: the job's, on the last group's event
        for g, (spot, res) in enumerate(got):
            for n, k in res.gpus_per_node.items():
                placement[n] = placement.get(n, 0) + int(k)
            where = ", ".join(f"{k} on node {n[:8]}" for n, k in spot.items())
            self.log.emit(ev.Placed(reason=f"replica group {g} ({reps.layout.short()}): {where}",
                                    gpus=res.size, placement_group=res.name, gpus_per_node=res.gpus_per_node,
                                    bundle_nodes=list(res.bundle_nodes), seconds=round(res.seconds, 4),
                                    strategy=res.strategy, group=g,
                                    job_placement=dict(placement) if g == len(got) - 1 else None))
        if not got:
            if time.monotonic() > cycle.give_up:
                raise JobFailed(f"no room for a replica group of {world} GPUs")
            time.sleep(self.settings.placement.retry_s)
            return Phase.PLACE, "no room for a replica group yet"
        cycle.plan = got  # (spot, reservation) per group, in group order
        return Phase.START, f"{len(got)} of {reps.want} replica groups reserved"

    def _start_replicas(self) -> tuple[Phase, str]:
        cycle, reps = self._cycle, self.replicas
        assert cycle is not None and reps is not None
        t0 = time.monotonic()
        for g, (spot, res) in enumerate(cycle.plan):
            try:
                gang = self.port.start_gang(reps.plan(g, spot), res, on_created=lambda gang, g=g: reps.add(g, gang))
            except StartFailed as exc:
                if reps.groups.get(g) is None:
                    self.port.release(res)
                for _, later in cycle.plan[g + 1:]:
                    self.port.release(later)
                raise JobFailed(f"replica group {g} did not start: {exc.failure.reason}") from exc
            reps.add(g, gang)
            self._emit_started(gang, f"replica group {g}: {gang.world_size} rank actors up, torchft manager joined")
        self.port.refill_pool()  # what the groups took, on the nodes no group runs on
        view, _ = reps.view()
        s = self.settings
        scorer = StragglerScorer({}, {}, window=s.stragglers.window, threshold=s.stragglers.threshold,
                                 persist_fraction=s.stragglers.persist)
        self._run = Run(view, scorer, 0)
        self.next_step = 0
        self._cycle = None
        cycle.phases["start"] = time.monotonic() - t0
        return Phase.TRAIN, f"{reps.size} replica groups training from step 0"

    def _train_replicas(self, run: Run) -> Switch | None:
        """One step attempt of every live replica group. A group that lost a node is dropped (the
        others redo the step without it: torchft voted it down) and a replacement starts in the
        background; a replacement that is up joins at this step boundary and heals from a peer."""
        reps = self.replicas
        assert reps is not None
        self._adopt_replacements(reps)
        step = run.step
        if step >= self.job.steps:
            return Switch("finished")
        if self.cancel_requested:
            return Switch("cancelled")
        view, owners = reps.view()
        t_launch = time.time()
        # the groups of the last attempt still here: a redo's quorum (a replacement joins after it)
        expect = sorted({g for g, _ in owners} & run.last_groups) if run.last_groups else None
        prev, run.last_groups = sorted(run.last_groups), {g for g, _ in owners}
        res = self.port.gather(view, "step", deadline_s=self._deadline_s(run.walls, first=not run.walls),
                               step=step, kwargs={"expect": expect, "prev": prev, "snapshot_group": reps.snapshot_group()})
        if res.lost_nodes:
            self._tell_survivors(reps, res.lost_nodes)
        rows = {owners[r]: row for r, row in res.results.items()}
        done = {g for (g, _), row in rows.items() if row["event"] == "step"}
        if not res.ok:
            fallback = self._drop_replicas(reps, view, owners, res, t_launch, step, done)
            if fallback is not None:
                return fallback
        else:
            self.policy.clean_gather(reps, done)
        live = set(reps.groups)
        if ({owners[r][0] for r in res.errors if r < len(owners)} & live) - done:
            self._failed_tries[step] += 1  # a group that stays raised in it: the next gather launches it again
        for (g, r), row in rows.items():
            if r == 0:
                for st, k in Counter(int(x) for x in row.get("aborted_steps", [])).items():
                    self._failed_tries[st] = max(self._failed_tries[st], k)
            if r == 0 and g in reps.history:
                reps.history[g].update(aborted=list(row["aborted_steps"]), pids=sorted(
                    {int(x["pid"]) for (gg, _), x in rows.items() if gg == g}))
                keep_phases(reps.history[g], row)
        committed = {k: row for k, row in rows.items() if row["event"] == "step" and k[0] in live}
        if not committed:
            return None  # voted down (a group died in it): the survivors redo this step
        if max(len(r.get("groups") or ()) for r in committed.values()) > len(live):
            # a replacement was in this step's quorum (its first: it healed there, with no micro-batches):
            # it joins the step set now, before the next quorum (left out, it would hold that quorum up
            # for the join timeout)
            reps.wait_stepping(self.settings.replicas.timeout_s)
            self._adopt_replacements(reps)
        recent: dict[int, dict[str, Any]] = {}
        for (g, r), row in committed.items():
            if r == 0 and g in reps.history:
                keep_phases(reps.history[g], row)
        for (g, r), row in committed.items():  # commits an abandoned wait missed come back in ``recent``
            for old in row["recent"]:
                recent.setdefault(int(old["step"]), old)
            if r == 0:
                reps.history[g]["committed"] = sorted(set(reps.history[g]["committed"]) |
                                                      {int(x["step"]) for x in row["recent"]})
                # the group's own commit times (0-based step -> time.time()): the survivors' stalls
                reps.history[g].setdefault("commit_ts", {}).update({str(x["step"]): x["ts"] for x in row["recent"]})
        for st in sorted(k for k in recent if k >= step):
            self.step_attempts[st] = 1 + self._failed_tries[st]
            self._replica_step_done(run, recent[st], committed, reps, latest=st == max(recent))
        run.step = max(recent) + 1
        if run.step >= self.job.steps or self.preempt_requested or self.cadence.due(run.since_save):
            failed = self._save_replicas(reps, run)
            if failed is not None:  # the policy's fallback: a re-plan from what was saved before
                return self._fall_back(failed, run.step)
            run.since_save = 0
            if self.preempt_requested:
                return Switch("preempted")
        if run.step < self.job.steps:
            self._replica_moves(reps, run)  # drains and resizes by groups (planned_moves)
        reps.start_replacements(self.port, self.replanner.excluded, self.settings.replicas.retry_s, lambda g: None)
        return None

    def _replica_step_done(self, run: Run, row: dict[str, Any], committed: dict[tuple[int, int], dict[str, Any]],
                           reps: ReplicaSet, latest: bool = True) -> None:
        """A committed step: its ``step`` event, metrics and tracking; after the ``latest`` commit the
        validation loss and the HF export when due (one group runs them: :meth:`_after_step`)."""
        done = int(row["step"]) + 1
        wall = max(float(r["wall_s"]) for r in committed.values())
        run.walls.append(wall)
        run.since_save += 1
        loss = float(row["loss"])
        with self.lock:
            self.last_loss = loss
            self.losses[done] = loss
            self.step_ts[done] = float(row.get("ts", time.time()))
            self.next_step = done
        self.cadence.observe_step(wall)
        world = int(row["participants"]) * reps.layout.world_size
        busy = [float(r["busy_s"]) for r in committed.values()]
        snaps = [float(r["snapshot_s"]) for r in committed.values() if r.get("snapshot_s") is not None]
        after = self._after_step(reps, done) if latest else {}
        self.log.emit(ev.StepDone(step=done, loss=round(loss, 6), wall_s=round(wall, 4), busy_max_s=round(max(busy), 4),
                                  world_size=world, tokens_per_s=round(float(row["tokens"]) / max(wall, 1e-9), 1),
                                  val_loss=after.get("val_loss"), snapshot_s=round(max(snaps), 4) if snaps else None))
        out = {i: {**r, "loss": loss} for i, r in enumerate(committed.values())}
        out[0].update(after)
        view, _ = reps.view()
        self._metrics(done, out, view)
        self.tracking.on_step(done, out[0], world, wall)

    def _train_cfg(self) -> TrainConfig:
        if self._train_config is None:
            self._train_config = TrainConfig.from_dict(self.job.train)
        return self._train_config

    def _after_step(self, reps: ReplicaSet, done: int) -> dict[str, Any]:
        """What a one-gang job runs after step ``done`` when it is due (``TrainConfig.after_step``): the
        validation loss, and after the last step the HF export. The lowest live group runs it (every
        group holds the committed state); a group that fails it is left to the next step's gather to
        find, and the next group tries. The export must be written: when every group failed it, the
        job fails (its weights are in the last checkpoint)."""
        evaluates, exports = self._train_cfg().after_step(done)
        if not (evaluates or exports):
            return {}
        errors: list[str] = []
        for g in sorted(reps.groups):
            res = self.port.gather(reps.groups[g], "after_step", deadline_s=self.settings.detection.hang_timeout_s,
                                   kwargs={"step": done})
            if res.ok:
                return dict(res.results[0])
            errors.append(f"group {g}: {res.errors or res.pending}")
        if exports:
            raise JobFailed(f"the HF export after step {done} failed on every replica group: {'; '.join(errors)}")
        return {}

    def _drop_replicas(self, reps: ReplicaSet, view: Gang, owners: list[tuple[int, int]], res: GatherResult,
                       since: float, step: int, done: set[int]) -> Switch | None:
        """Carry out the policy's decision on a failed gather: drop the groups it took (and start
        replacements), or let the live groups redo the step, or fall back to a re-plan (the switch),
        or end the job."""
        failure = self.port.classify(res, view, "step")
        groups = GroupStep(reps, owners, res.unresponsive, list(res.errors), frozenset(done))
        decision = self._decide(failure, since, groups=groups)
        if isinstance(decision, Replan):
            return self._fall_back(self._switch_for(decision, since), step)
        lost = list(decision.groups if isinstance(decision, DropGroups) else
                    decision.drop if isinstance(decision, Fail) else ())
        if isinstance(decision, Fail) and not decision.drop:
            raise JobFailed(decision.reason)
        read = decision.failure
        self._remove_groups(reps, lost, step=step + 1, cause="lost", replace=not isinstance(decision, Fail),
                            reason=lambda g: f"replica group {g} lost ({read.kind}: {read.reason}); "
                                             f"{reps.size} groups keep stepping")
        if isinstance(decision, Fail):
            raise JobFailed(decision.reason)
        return None

    def _remove_groups(self, reps: ReplicaSet, groups: Iterable[int], *, step: int, cause: str,
                       reason: Callable[[int], str], replace: bool = False) -> list[int]:
        """The one way replica groups leave the job, lost (a node died in the step) or at a step
        boundary (``drain``, ``shrink``): left out of the next quorum
        at once (``forget_replicas``), torn down, recorded (``reps.dropped``) and told
        (``replica_dropped`` with ``cause``, ``reason(group)``, the job's GPUs after it and where they
        are). ``step``: the 1-based step being run. ``replace``: replacements start first (a loss), so
        their spots count in the job's placement the events carry. The groups removed (those of
        ``groups`` that were live)."""
        groups = list(groups)
        self.port.forget_replicas(groups)
        removed: list[tuple[int, list[str]]] = []
        for g in groups:
            gang = reps.drop(g)
            if gang is None:
                continue
            nodes = gang.nodes
            self.port.teardown(gang)
            removed.append((g, list(nodes)))
            reps.dropped.append({"group": g, "nodes": nodes, "step": step, "ts": time.time(), "cause": cause})
        if replace:
            reps.start_replacements(self.port, self.replanner.excluded, 0.0, lambda g: None)
        placement = reps.gpus_per_node()
        for g, nodes in removed:
            self.log.emit(ev.ReplicaDropped(reason=reason(g), group=g, nodes=nodes, step=step,
                                            groups_left=reps.size, cause=cause,  # type: ignore[arg-type]
                                            job_gpus=reps.want * reps.layout.world_size, job_placement=placement))
        return [g for g, _ in removed]

    def _save_replicas(self, reps: ReplicaSet, run: Run) -> Switch | None:
        """The checkpoint of step ``run.step``, written by the lowest live group of the newest fence
        epoch (the groups hold the same state); a failure is the policy's switch (its fallback, a
        re-plan: another group's write of the same step would collide with the half-written one)."""
        epoch = max(int(gang.timings.get("fence_epoch") or 0) for gang in reps.groups.values())
        target = min(g for g, gang in reps.groups.items() if int(gang.timings.get("fence_epoch") or 0) == epoch)
        return self._save(reps.groups[target], run.step)

    def _fall_back(self, switch: Switch, step: int) -> Switch:
        """The replica path ran out (the policy's :class:`Replan`; the policy is a re-plan policy from
        now on): every group and every replacement starting is torn down (``replica_dropped``), and the
        job goes on as one gang: the next PLAN is the single-gang one (a plan over the GPUs left, the
        layout hint honoured), START restores the newest complete in-memory snapshot (one group took
        them), else the newest checkpoint (one group wrote them), and the steps run as any job's."""
        reps = self.replicas
        assert reps is not None
        t0 = time.monotonic()
        reps.want = 0  # no replacement starts from here on
        held: dict[str, int] = {}
        teardown_s = 0.0
        read = switch.failure
        for g in sorted(reps.groups):
            gang = reps.drop(g)
            if gang is None:
                continue
            self.port.forget_replicas([g])
            for node, n in held_gpus(gang.rank_nodes).items():
                held[node] = held.get(node, 0) + n
            nodes = gang.nodes
            teardown_s += self.port.teardown(gang)
            reps.dropped.append({"group": g, "nodes": nodes, "step": step + 1, "ts": time.time()})
            why = f"{read.kind}: {read.reason}" if read is not None else switch.kind
            self.log.emit(ev.ReplicaDropped(reason=f"replica group {g} torn down ({why}); the replica path ran out: "
                                            "re-planning the job as one gang over the GPUs left", group=g,
                                            nodes=list(nodes), step=step + 1, groups_left=reps.size))
        self._teardown_replicas()
        # the single-gang phases from here on; PLAN finds no gang to tear down (this was it)
        self._phases.update({Phase.PLAN: self._plan, Phase.PLACE: self._place, Phase.START: self._start})
        self._train_step = self._train_one
        self.replanner.released = {n: g for n, g in held.items() if n not in self.replanner.excluded}
        now = time.monotonic()
        self._cycle = Cycle(t_down=t0, t_plan=now, teardown_s=teardown_s,
                            give_up=now + self.settings.placement.give_up_s)
        change = switch.change or planner_bridge.ClusterChange()
        change.reason = f"replica groups ran out ({change.reason or switch.cause}): one gang over the GPUs left"
        return Switch(switch.kind, failure=switch.failure, change=change, detect_s=switch.detect_s)

    def _tell_survivors(self, reps: ReplicaSet, nodes: list[str]) -> None:
        """The node heartbeat found ``nodes`` down: the other groups' ranks stop waiting for a
        cross-group reduction with the groups there (``RankWorker.replica_peers_lost``) before the
        failure is classified and the groups torn down, so the redo starts without waiting for gloo
        to notice (or, for a host gone silent, for its collective timeout); the quorum service drops
        them too, so the redo's quorum does not wait for their heartbeat to time out."""
        lost = reps.on_nodes(nodes)
        self.port.forget_replicas(lost)  # the survivors' next quorum forms without them at once
        if lost and len(lost) < reps.size:
            view, _ = reps.view(exclude=lost)
            self.port.gather(view, "replica_peers_lost", deadline_s=10.0, kwargs={"groups": lost})

    def _adopt_replacements(self, reps: ReplicaSet) -> None:
        """Replacements done starting: the ones that healed from a peer and stepped join the step set
        (``replica_joined``); a failed one is torn down (another is tried after ``replica_retry_s``)."""
        up, failed = reps.ready()
        for j in failed:
            reps.history.setdefault(j.group, {"node": j.node, "error": j.error})
            # a replacement whose node died is not in the step set, so no failure of the job names the
            # node: keep it out of the next replacement's placement here (the GCS may list it for seconds)
            self.replanner.exclude(j.lost_nodes)
            if j.gang is not None:
                self.port.teardown(j.gang)
        for j in up:
            gang = j.gang
            assert gang is not None
            row = j.first[0]
            reps.history[j.group].update(healed_from=row["healed_from"], committed=[int(row["step"])],
                                         commit_ts={str(row["step"]): row["ts"]},
                                         pids=sorted({int(r["pid"]) for r in j.first.values()}),
                                         warm_ranks=int(gang.timings.get("warm_ranks", 0)))
            keep_phases(reps.history[j.group], row)  # the replacement's first (healing) attempt
            self._emit_started(gang, f"replacement replica group {j.group} on node(s) "
                                     f"{', '.join(n[:8] for n in j.spot)}")
            healed = row["healed_from"]
            self.log.emit(ev.ReplicaJoined(reason=f"replica group {j.group} took the state of group {healed} over "
                                           f"the network in its first step (no share of that step's batch; its share from the "
                                           f"next step on): {reps.size} groups",
                                           group=j.group, seconds=round(float(row["ts"]) - j.t0, 3),
                                           step=int(row["step"]) + 1, from_group=int(-1 if healed is None else healed),
                                           nodes=list(j.spot), groups=reps.size,
                                           job_gpus=reps.want * reps.layout.world_size,
                                           job_placement=reps.gpus_per_node()))

    def _teardown_replicas(self) -> None:
        reps = self.replicas
        if reps is None:
            return
        if reps.at_end is None:
            reps.at_end = sorted(reps.groups)
        for j in reps.wait_joining(self.settings.detection.start_timeout_s):
            if j.gang is not None:
                self.port.teardown(j.gang)
        for g in sorted(reps.groups):
            self.port.teardown(reps.drop(g))


def keep_phases(history: dict[str, Any], row: dict[str, Any]) -> None:
    """A group's step attempts, committed and aborted (rank 0's rows: ``phases`` timestamps, torchft's
    error), kept by (step, attempt start) in ``history["attempts"]``: where a survivor's stall goes."""
    seen = history.setdefault("attempts", {})
    for x in [*row.get("recent", []), *row.get("recent_aborts", []), row]:
        ph = x.get("phases")
        if ph:
            seen[f"{x['step']}@{ph['start']:.3f}"] = {"step": int(x["step"]), "event": x.get("event", "step"),
                                                      "participants": x.get("participants"),
                                                      "error": x.get("error", ""), **ph}
