"""One job attempt as a small typed state machine: plan, wait, place, start, train, and how it ends.

:class:`AttemptMachine` holds the attempt's state (:class:`Phase`) and does one piece of work per
:meth:`AttemptMachine.step`, returning the :class:`Transition` it took (as Ray Train V2's controller
does). Plans and the decisions to change them come from the :class:`~workers.runtime.policy.replanner.Replanner`;
everything done to the cluster goes through the :class:`~workers.runtime.cluster.port.ClusterPort`.
The machine has no Ray in it, so tests drive it over an in-memory cluster, one transition at a time::

    PLAN ──> PLACE ──> START ──> TRAIN ──(one step per call)──> TRAIN ... ──> FINISHED
     │ ^       │ (timeout: smaller plan, stays)  │                 │ failure, straggler, grow,
     v │       │                                 │ start failed    │ resize: a Switch
    WAIT       │                                 v                 v
  (no GPUs;    └─────────────────────────────> PLAN <───────────── PLAN (tear down, re-plan)
   cancel or preempt end it)                   any: FAILED (budget, planner refused, error)
                                               TRAIN: CANCELLED, PREEMPTED (checkpoint first)

A ``Switch`` says why a gang ends before the job does; the next PLAN tears the gang down and asks
the replanner for the plan the switch names (or re-plans after a failure). The phases of a switch
(detect, plan, place, start, load, first_step) are timed into one ``recovery`` event.

What a failure leads to is the :class:`~workers.runtime.policy.recovery.RecoveryPolicy`'s decision
(:meth:`_decide`: one call, a typed decision); the machine carries it out. The policy's name picks
the phases once: replica groups (``replica_group``) plan, place and start in
:mod:`~workers.runtime.supervision.replica_attempt`.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from workers.runtime.cluster.gang import Gang, StartFailed
from workers.runtime.cluster.port import ClusterPort
from workers.runtime.cluster.reachability import PeerProbe, Verdict
from workers.runtime.cluster.watchdog import Failure, GatherResult
from workers.runtime.contract import events as ev
from workers.runtime.contract.job_spec import JobSpec
from workers.runtime.policy import planning as planner_bridge
from workers.runtime.policy.checkpoint_cadence import CheckpointCadence
from workers.runtime.policy.recovery import Fail, FailureDecision, FailureView, GroupStep, RecoveryPolicy
from workers.runtime.policy.replanner import Keep, Replanner, SwitchTo, held_gpus
from workers.runtime.policy.stragglers import LinkScorer, StragglerScorer, median
from workers.runtime.recovery import fencing
from workers.runtime.recovery.replica_groups import ReplicaSet
from workers.runtime.supervision.attempt_state import ENDS, Cycle, JobFailed, Phase, Run, Switch, Transition
from workers.runtime.supervision.job_tracking import JobTracking
from workers.runtime.supervision.planned_moves import PlannedMoves
from workers.runtime.supervision.replica_attempt import ReplicaGroupPhases
from workers.states import AttemptState

__all__ = ["ENDS", "AttemptMachine", "JobFailed", "Phase", "Switch", "Transition"]


class AttemptMachine(ReplicaGroupPhases, PlannedMoves):
    def __init__(self, job: JobSpec, port: ClusterPort, log: ev.EventLog, *, name: str = "orthoplex") -> None:
        self.job = job
        self.settings = job.runtime
        self.port = port
        self.log = log
        self.name = name  # the reservations' name
        self.replanner = Replanner(job, port, log)
        self.cadence = CheckpointCadence(job.checkpoint.min_every_steps, job.checkpoint.max_every_steps,
                                         job.checkpoint.mtbf_s)
        self.phase = Phase.PLAN
        self.state = AttemptState.RUNNING  # what ``status()`` reports
        self.error = ""
        self.lock = threading.Lock()
        self.gang: Gang | None = None
        self.cancel_requested = False
        self.preempt_requested = False
        self.resize_to: int | None = None  # a resize asked for and not acted on yet
        self._init_moves()  # drains (planned_moves)
        self.next_step = 0
        self.last_loss: float | None = None
        self.losses: dict[int, float] = {}
        self.step_ts: dict[int, float] = {}  # launch time of every step (last run of it)
        self.failures: list[dict[str, Any]] = []
        self.recoveries: list[dict[str, Any]] = []
        self.last_ckpt_step = 0
        # what a failure leads to (budget, node exclusion, restore source, replica groups dropped)
        self.policy = RecoveryPolicy.for_settings(self.settings)
        self._switch: Switch | None = None
        self._cycle: Cycle | None = None
        self._run: Run | None = None
        self.tracking = JobTracking(job.tracking, job.model, job.gpu_type, job.steps)
        # after a failure without a dead node: which node pairs cannot connect (``reachability``);
        # set by the supervisor (Ray), None in the in-memory tests
        self.peer_probe: PeerProbe | None = None
        # replica groups (runtime option replica_groups >= 2): the groups, dropped and replaced while
        # the others keep stepping (workers.runtime.recovery.replica_groups); None for a job re-planned as one gang
        self.replicas: ReplicaSet | None = None
        # replica groups: 0-based step -> attempts at it (1 + the survivors' voted-down attempts, or the
        # supervisor's launches that raised, whichever is more); counted from what the ranks report,
        # since a rank redoes a voted-down attempt at once, itself
        self.step_attempts: dict[int, int] = {}
        self._failed_tries: Counter[int] = Counter()  # step -> voted-down attempts (most of any group)
        self._phases = {Phase.PLAN: self._plan, Phase.WAIT: self._wait, Phase.PLACE: self._place,
                        Phase.START: self._start, Phase.TRAIN: self._train}
        self._train_step = self._train_one
        if self.policy.keeps_groups:  # replica groups: their own plan, placement, start and step
            self._phases.update({Phase.PLAN: self._plan_replicas, Phase.PLACE: self._place_replicas,
                                 Phase.START: self._start_replicas})
            self._train_step = self._train_replicas

    # ------------------------------------------------------------------ requests (from other threads)
    def request_resize(self, gpus: int, placement: dict[str, int] | None = None) -> dict[str, Any]:
        """Re-plan onto at most ``gpus`` GPUs (on ``placement``'s nodes, when given) at the next step
        boundary (the scheduler's Shrink/Grow).

        Idempotent: the control plane repeats its decision every round; a repeat arms nothing new,
        except a grow that found no free GPUs, which is tried again after ``resize_retry_s``."""
        if gpus < 1:
            raise ValueError(f"resize: gpus must be >= 1, got {gpus}")
        with self.lock:
            world = self.gang.world_size if self.gang is not None else self.replicas.ranks() if self.replicas else 0
        changed, armed = self.replanner.set_cap(gpus, world, self.settings.placement.resize_retry_s, placement)
        if armed:
            with self.lock:
                self.resize_to = gpus
        if changed:
            self.log.emit(ev.ResizeRequested(reason=f"resize to {gpus} GPUs requested (running {world})",
                                             gpus=gpus, world_size=world))
        return {"gpus": gpus, "armed": armed, "world_size": world}

    # ------------------------------------------------------------------ driving
    @property
    def done(self) -> bool:
        return self.phase in ENDS

    def step(self) -> Transition:
        """Do the current phase's work once; returns the transition taken (maybe to the same phase)."""
        source = self.phase
        if self.done:
            return Transition(source, source, "ended")
        try:
            target, reason = self._phases[source]()
        except (JobFailed, planner_bridge.PlanningError) as exc:
            target, reason = self._fail(str(exc))
        except Exception as exc:  # anything unexpected: never leak actors or placement groups
            target, reason = self._fail(f"supervisor error: {type(exc).__name__}: {exc}")
        self.phase = target
        return Transition(source, target, reason)

    def run(self) -> Phase:
        while not self.done:
            self.step()
        return self.phase

    # ------------------------------------------------------------------ phases
    def _plan(self) -> tuple[Phase, str]:
        if self._cycle is None:  # a new pass: the gang that ended goes first
            if self.cancel_requested or self.preempt_requested:
                return self._end_switch(Switch("cancelled" if self.cancel_requested else "preempted"))
            cycle = self._cycle = Cycle(t_down=time.monotonic())
            old = self._take_gang()
            self.replanner.released = held_gpus(old.rank_nodes) if old is not None else {}
            cycle.teardown_s = self.port.teardown(old)
            cycle.t_plan = time.monotonic()
            cycle.give_up = cycle.t_plan + self.settings.placement.give_up_s
        cycle = self._cycle
        switch = self._switch
        try:
            if switch is None:
                cycle.plan, cycle.replan = self.replanner.first(), None
            elif switch.replan is not None:  # decided already (straggler, grow, resize)
                cycle.plan, cycle.replan = switch.replan.plan, switch.replan
            elif not self.replanner.plans:  # replica groups fell back (_fall_back): no gang plan to re-plan from
                reason = switch.change.reason if switch.change else "replica groups ran out"
                # over the GPUs left, as any re-plan after a failure: the grant's nodes may all be gone
                cycle.plan, cycle.replan = self.replanner.first(reason, granted=False), None
            else:
                cycle.replan = self.replanner.after_failure(switch.change or planner_bridge.ClusterChange())
                cycle.plan = cycle.replan.plan
        except planner_bridge.PlanningError as exc:
            if switch is None and not isinstance(exc, planner_bridge.NoCapacity):
                raise  # a spec no cluster can run fails at once
            if time.monotonic() > cycle.give_up:
                raise JobFailed(f"no GPUs for {self.settings.placement.give_up_s:.0f}s: {exc}") from exc
            if not cycle.waiting:
                cycle.waiting = True
                self.log.emit(ev.WaitingForGpus(reason=f"waiting for GPUs: {exc}", step=self.next_step,
                                                max_gpus=self.replanner.cap, min_gpus=self.job.min_gpus))
            return Phase.WAIT, str(exc)
        cycle.phases["plan"] = time.monotonic() - cycle.t_plan + (switch.plan_s if switch else 0.0)
        cycle.t_place = time.monotonic()
        return Phase.PLACE, f"plan {cycle.plan.layout.short()}"

    def _wait(self) -> tuple[Phase, str]:
        self.replanner.released = {}  # the cluster has caught up with our own release by now
        deadline = time.monotonic() + self.settings.placement.retry_s
        while True:
            if self.cancel_requested or self.preempt_requested:
                return self._end_switch(Switch("cancelled" if self.cancel_requested else "preempted"))
            if time.monotonic() >= deadline:
                return Phase.PLAN, "try again"
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    def _place(self) -> tuple[Phase, str]:
        """Reserve the plan's GPUs; on timeout try a smaller plan down to min_gpus, then wait and retry."""
        cycle = self._cycle
        assert cycle is not None
        if cycle.place_give_up is None:
            cycle.place_give_up = time.monotonic() + self.settings.placement.give_up_s
        plan = cycle.plan
        res = self.port.reserve(plan.layout.world_size, nodes=planner_bridge.nodes_used(plan), name=self.name,
                                per_node=self.replanner.pinned(plan))
        if res is not None:
            cycle.reservation = res
            self.log.emit(ev.Placed(reason=f"gang of {res.size} GPU bundles ready in {res.seconds:.2f}s",
                                    gpus=res.size, placement_group=res.name, gpus_per_node=res.gpus_per_node,
                                    bundle_nodes=list(res.bundle_nodes), seconds=round(res.seconds, 4),
                                    strategy=res.strategy))
            cycle.phases["place"] = time.monotonic() - cycle.t_place + (cycle.t_plan - cycle.t_down)
            return Phase.START, f"{res.size} GPUs reserved"
        smaller: int | None = plan.layout.world_size - 1
        self.log.emit(ev.PlacementTimeout(reason=f"{plan.layout.world_size} GPUs not ready within "
                                          f"{self.settings.placement.timeout_s}s", gpus=plan.layout.world_size))
        if smaller is not None and smaller < self.job.min_gpus:
            if time.monotonic() > cycle.place_give_up:
                raise JobFailed(f"could not place even {self.job.min_gpus} GPUs")
            time.sleep(self.settings.placement.retry_s)
            smaller = None
        cycle.plan = self.replanner.first("smaller plan after a placement timeout", max_gpus=smaller)
        return Phase.PLACE, "placement timed out"

    def _start(self) -> tuple[Phase, str]:
        cycle = self._cycle
        assert cycle is not None and cycle.reservation is not None
        res = cycle.reservation
        t_start = time.monotonic()
        try:
            try:
                gang = self.port.start_gang(cycle.plan, res, on_created=self._adopt)
            except BaseException:
                if self.gang is None or self.gang.reservation is not res:
                    self.port.release(res)  # failed before the gang existed: nobody else owns the group
                raise
            self.log.emit(ev.RanksMapped(reason=f"ranks mapped onto bundles ({gang.rank_map.method})",
                                         layout=gang.layout.to_dict(), **gang.rank_map.to_dict()))
            self._emit_started(gang, f"{gang.world_size} rank actors up, process group joined")
            cycle.phases["start"] = time.monotonic() - t_start
            t_load = time.monotonic()
            start_step, source = self._restore(gang)
            cycle.phases["load"] = time.monotonic() - t_load
        except StartFailed as exc:  # a node died while we started: re-plan without it (the policy's call)
            since = time.time()
            self._switch = self._switch_for(self._decide(exc.failure, since, during="start"), since)
            self._cycle = None
            return Phase.PLAN, f"start failed: {exc.failure.reason}"
        switch = self._switch
        recovery = None
        if switch is not None:
            what = "in-memory snapshot" if source == "memory" else "checkpoint"
            self.log.emit(ev.Resumed(reason=f"resumed from the {what} of step {start_step} after {switch.cause}",
                                     from_step=start_step, cause=switch.cause, layout=gang.layout.to_dict(),
                                     short=gang.layout.short(), world_size=gang.world_size,
                                     steps_redone=max(0, self.next_step - start_step), source=source))
            recovery = {"switch": switch, "phases": {**cycle.phases, "detect": switch.detect_s},
                        "teardown_s": cycle.teardown_s, "t0": time.time()}
            if switch.kind == "drain":
                self._drained_gang(start_step, source)
        s = self.settings
        roles = {r: (gang.layout.coords(r).pp,) for r in range(gang.world_size)}
        scorer = StragglerScorer(dict(enumerate(gang.rank_nodes)), roles, window=s.stragglers.window,
                                 threshold=s.stragglers.threshold, persist_fraction=s.stragglers.persist)
        links = LinkScorer(dict(enumerate(gang.rank_nodes)), window=s.stragglers.window)
        self._run = Run(gang, scorer, start_step, links=links, recovery=recovery)
        self.next_step = start_step
        self._cycle = None
        self._set_state(AttemptState.RECOVERING if switch is not None else AttemptState.RUNNING)
        return Phase.TRAIN, f"training from step {start_step}"

    def _train(self) -> tuple[Phase, str]:
        run = self._run
        assert run is not None
        sw = self._train_step(run)
        if sw is None:
            # the warm pool refills once the gang has stepped twice and no replacement is joining: its new
            # processes would compete with a recovery's load and first step, or a replacement's heal
            settled = run.recovery is None and len(run.walls) >= 2
            if settled and (self.replicas is None or not self.replicas.joining):
                self.port.refill_pool()
            return Phase.TRAIN, f"step {run.step - 1} done"
        self._run = None
        if sw.kind in ("finished", "cancelled", "preempted"):
            return self._end_switch(sw)
        self._switch = sw
        self._set_state(AttemptState.RECOVERING)
        return Phase.PLAN, f"switch: {sw.cause}"

    # ------------------------------------------------------------------ training
    def _deadline_s(self, walls: list[float], first: bool) -> float:
        base = self.settings.detection.hang_factor * median(walls[-20:]) if walls else 0.0
        d = max(self.settings.detection.hang_timeout_s, base)
        return d * 3 if first else d

    def _train_one(self, run: Run) -> Switch | None:
        """One step of ``run`` and what follows it; a ``Switch`` when the gang must end."""
        gang, step, s = run.gang, run.step, self.settings
        if step >= self.job.steps:
            return Switch("finished")
        t_launch = time.time()
        res = self.port.gather(gang, "step", deadline_s=self._deadline_s(run.walls, first=not run.walls), step=step)
        if not res.ok:
            return self._on_failure(gang, res, t_launch)
        out = res.results
        wall = max(float(o["wall_s"]) for o in out.values())
        run.walls.append(wall)
        loss = float(out[0]["loss"])
        done = step + 1  # steps completed, the 1-based number every output uses (as a checkpoint does)
        with self.lock:
            self.last_loss = loss
            self.losses[done] = loss
            self.step_ts[done] = t_launch
            self.next_step = done
        self.cadence.observe_step(wall)
        busy = {r: float(o["busy_s"]) for r, o in out.items()}
        self.log.emit(ev.StepDone(step=done, loss=round(loss, 6), wall_s=round(wall, 4),
                                  busy_max_s=round(max(busy.values()), 4), world_size=gang.world_size,
                                  tokens_per_s=round(float(out[0]["tokens"]) / max(wall, 1e-9), 1),
                                  val_loss=out[0].get("val_loss"), snapshot_s=_snapshot_s(out),
                                  snapshot_push_s=_snapshot_s(out, "snapshot_push_s")))
        self._metrics(done, out, gang)
        self.tracking.on_step(done, out[0], gang.world_size, wall)
        if run.recovery is not None:
            self._event_recovery(run.recovery, time.time() - run.recovery["t0"])
            run.recovery = None
            self._set_state(AttemptState.RUNNING)
        run.step = step = step + 1
        run.since_save += 1
        findings = run.scorer.observe(step, busy)
        if run.links is not None:  # a slow or lossy link: busy time cannot see it, heartbeats can
            findings += [f for f in run.links.observe(step, res.hb_rtt) if f.node not in run.scorer.ignore_nodes]
        if self.cancel_requested:
            return Switch("cancelled")
        if self.drain_due and step < self.job.steps:
            sw = self._drain_gang(gang, step)
            if sw is not None:
                return sw
        if self.resize_to is not None and step < self.job.steps:
            sw = self._on_resize(gang, step)
            if sw is not None:
                return sw
        last = step == self.job.steps
        if self.preempt_requested or last or self.cadence.due(run.since_save):
            failed = self._save(gang, step)
            if failed is not None:
                return failed
            run.since_save = 0
            if self.preempt_requested:
                return Switch("preempted")
            if not last and s.placement.grow:
                decision = self.replanner.maybe_grow(gang.rank_nodes)
                if isinstance(decision, SwitchTo):
                    return Switch("grow", change=decision.change, replan=decision.replan, plan_s=decision.plan_s)
        if findings:
            return self._on_straggler(gang, findings, run, step)
        return None

    def _restore(self, gang: Gang) -> tuple[int, ev.RestoreSource]:
        """Load the newest complete in-memory snapshot (no older than the newest checkpoint, no newer
        than the last step the machine saw done), else the newest checkpoint; the start step and where
        it came from."""
        choice = None
        if self.policy.source == "memory":
            choice = self.policy.restore_choice(self.port.snapshots(), not_before=self.last_ckpt_step,
                                                not_after=self.next_step)
        res = self.port.restore(gang, choice, deadline_s=self.settings.detection.start_timeout_s)
        if not res.ok:
            raise StartFailed(self.port.classify(res, gang, "restore"))
        starts = set(res.results.values())
        if len(starts) != 1:
            raise JobFailed(f"ranks restored different steps: {sorted(starts)}")
        return int(starts.pop()), "memory" if choice is not None else "storage"

    def _save(self, gang: Gang, step: int) -> Switch | None:
        t0 = time.time()
        res = self.port.gather(gang, "save", deadline_s=max(self.settings.detection.hang_timeout_s, 10 * self.cadence.save_s))
        if not res.ok:
            return self._on_failure(gang, res, t0, what="checkpoint")
        info = res.results[0]
        self.cadence.observe_save(float(info["seconds"]))
        self.last_ckpt_step = int(info["step"])
        self.log.emit(ev.CheckpointSaved(reason="checkpoint committed", step=int(info["step"]),
                                         path=str(info["path"]), seconds=round(float(info["seconds"]), 4),
                                         bytes=int(info["bytes"]), next_interval_steps=self.cadence.interval_steps(),
                                         cadence=self.cadence.to_dict()))
        return None

    def _metrics(self, step: int, out: dict[int, dict[str, Any]], gang: Gang) -> None:
        if not self.job.metrics_out:
            return
        busy = [float(o["busy_s"]) for o in out.values()]
        row = {"ts": time.time(), "step": step, "loss": out[0]["loss"], "grad_norm": out[0]["grad_norm"],
               "lr": out[0]["lr"], "tokens": out[0]["tokens"], "wall_s": max(o["wall_s"] for o in out.values()),
               "busy_max_s": max(busy), "busy_median_s": median(busy), "world_size": gang.world_size,
               "layout": gang.layout.short(), "snapshot_s": _snapshot_s(out)}
        path = Path(self.job.metrics_out)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(json.dumps(row) + "\n")

    # ------------------------------------------------------------------ decisions at a step boundary
    def _on_resize(self, gang: Gang, step: int) -> Switch | None:
        """Re-plan within the new grant; unless the planner keeps the plan, hold the step's state (memory
        snapshot, else checkpoint: ``_hold_state``) and switch."""
        with self.lock:
            target, self.resize_to = self.resize_to, None
        if target is None or target == gang.world_size:
            return None
        decision = self.replanner.on_resize(target, gang.rank_nodes, step)
        if isinstance(decision, Keep):
            return None
        failed = self._hold_state(gang, step, self.policy.source)  # a memory snapshot, else a checkpoint
        if failed is not None:
            return failed
        return Switch("resize", change=decision.change, replan=decision.replan, plan_s=decision.plan_s)

    def _on_straggler(self, gang: Gang, findings: list[Any], run: Run, step: int) -> Switch | None:
        for f in findings:
            self.log.emit(ev.StragglerFound(reason=f"node {f.node[:8]} ({f.cause}) at {f.score:.2f}x the median over window "
                                            f"{f.window} (threshold {self.settings.stragglers.threshold})",
                                            step=step, **f.to_dict()))
        decision = self.replanner.on_straggler(findings, gang.rank_nodes)
        run.scorer.ignore_nodes = frozenset(run.scorer.ignore_nodes | {f.node for f in findings})
        if isinstance(decision, Keep):
            return None
        failed = self._save(gang, step) if self.last_ckpt_step != step else None
        if failed is not None:
            return failed
        # detected over a window of steps: the slowdown is dated to the launch of the window's first step
        slow_since = min((self.step_ts.get(f.first_step, time.time()) for f in findings), default=None)
        return Switch("straggler", change=decision.change, replan=decision.replan, plan_s=decision.plan_s,
                      detect_s=max(0.0, time.time() - slow_since) if slow_since else 0.0)

    # ------------------------------------------------------------------ failures
    def _on_failure(self, gang: Gang, res: GatherResult, since: float, what: str = "step") -> Switch:
        during = "save" if what == "checkpoint" else "step"
        return self._switch_for(self._decide(self.port.classify(res, gang, what), since, during=during), since)

    def _decide(self, failure: Failure, since: float, *, during: str = "step",
                groups: GroupStep | None = None) -> FailureDecision:
        """The policy's decision on ``failure`` (``since``: when the failed call was launched), with
        what it read carried out: the fence and event of a partition, the failure's event, nodes kept
        out of plans, the failure on record. The caller carries out the rest."""
        rank_nodes = self._rank_nodes()
        verdict = self._probe(failure, rank_nodes)
        decision = self.policy.decide(failure, FailureView(during, tuple(rank_nodes), verdict, groups))
        detected = time.time()
        read = decision.failure
        if decision.cut_off and verdict is not None:
            ckpt_dir = self.job.train.get("checkpoint_dir")
            if ckpt_dir:  # the left-out node's ranks can neither save nor step from now on
                fencing.advance(ckpt_dir, owner="peer_unreachable")
            self.log.emit(ev.PeerUnreachable(reason=verdict.reason(), nodes=list(verdict.exclude),
                                             pairs=[list(p) for p in verdict.cut], probe_s=round(verdict.seconds, 3),
                                             step=self.next_step))
        if read.kind == "node_lost":
            self.log.emit(ev.NodeLost(reason=read.reason, nodes=list(read.nodes), ranks=list(read.ranks),
                                      step=self.next_step))
        elif read.kind == "hang":
            self.log.emit(ev.Hang(reason=read.reason, ranks=list(read.ranks), step=self.next_step))
        else:
            self.log.emit(ev.RankFailed(reason=read.reason, ranks=list(read.ranks), nodes=list(read.nodes),
                                        step=self.next_step))
        self.replanner.exclude(decision.exclude)
        if decision.suspect is not None:
            node, deaths = decision.suspect.node, decision.suspect.deaths
            self.log.emit(ev.NodeExcluded(
                reason=f"rank processes died {deaths} times on node {node[:8]} while it stayed up: kept out of "
                "this job's plans", node=node, deaths=deaths, step=self.next_step))
        self.failures.append({**read.to_dict(), "step": self.next_step, "ts": detected})
        self.cadence.observe_failure()
        return decision

    def _switch_for(self, decision: FailureDecision, since: float) -> Switch:
        """Carry out a gang's decision: a switch that re-plans (over the nodes left, or the same nodes),
        or the end of the job."""
        if isinstance(decision, Fail):
            raise JobFailed(decision.reason)
        change = planner_bridge.ClusterChange(reason=decision.failure.reason, lost_nodes=list(decision.exclude))
        detected = float(self.failures[-1]["ts"])
        return Switch("failure", failure=decision.failure, change=change, detect_s=max(0.0, detected - since))

    def _rank_nodes(self) -> list[str]:
        """Where the failed gang's ranks ran (its reservation's bundles while it was not up yet)."""
        with self.lock:
            gang = self.gang
        cycle = self._cycle
        if gang is not None:
            return list(gang.rank_nodes)
        if cycle is not None and cycle.reservation is not None:
            return list(cycle.reservation.bundle_nodes)
        return []

    def _probe(self, failure: Failure, rank_nodes: list[str]) -> Verdict | None:
        """Which node pairs of the gang cannot connect, when the policy asks (ranks raised or hung on
        two nodes or more); None when not asked, or when the probe cannot run (the failure stays as it was)."""
        if self.peer_probe is None or not self.policy.wants_probe(failure, rank_nodes):
            return None
        try:
            return self.peer_probe(rank_nodes)
        except Exception:
            return None

    def _event_recovery(self, recovery: dict[str, Any], first_step_s: float) -> None:
        sw: Switch = recovery["switch"]
        phases = {**recovery["phases"], "first_step": first_step_s}
        event = ev.Recovered.of(phases, sw.cause, recovery["teardown_s"])
        self.replanner.restart_s = phases["start"] + phases["load"] + phases["first_step"]
        self.recoveries.append({"cause": event.cause, "phases": event.phases, "total_s": event.total_s})
        self.log.emit(event)

    # ------------------------------------------------------------------ endings
    def _end_switch(self, sw: Switch) -> tuple[Phase, str]:
        try:
            return self._end(sw)
        finally:
            self.port.close()

    def _end(self, sw: Switch) -> tuple[Phase, str]:
        self._teardown_replicas()
        if sw.kind == "finished":
            self.port.teardown(self._take_gang(), graceful=True)
            self._set_state(AttemptState.SUCCEEDED)
            self.log.emit(ev.Finished(reason=f"all {self.job.steps} steps done", final_step=self.job.steps,
                                      final_loss=self.last_loss, failures=len(self.failures),
                                      recoveries=len(self.recoveries)))
            return Phase.FINISHED, "all steps done"
        if sw.kind == "preempted":
            self.port.teardown(self._take_gang(), graceful=True)
            self._set_state(AttemptState.PREEMPTED)
            self.log.emit(ev.Preempted(reason="preempted: checkpoint saved, gang released",
                                       checkpoint_step=self.last_ckpt_step))
            return Phase.PREEMPTED, "preempted"
        self.port.teardown(self._take_gang())
        self._set_state(AttemptState.CANCELLED)
        self.log.emit(ev.Cancelled(reason="cancelled by request", step=self.next_step))
        return Phase.CANCELLED, "cancelled"

    def _fail(self, error: str) -> tuple[Phase, str]:
        try:
            self._teardown_replicas()
            self.port.teardown(self._take_gang())
            self.port.close()
        finally:
            self.error = error
            self.tracking.close("FAILED")
            self._set_state(AttemptState.FAILED)
            self.log.emit(ev.Failed(reason=error, step=self.next_step))
        return Phase.FAILED, error

    # ------------------------------------------------------------------ replica groups


    # ------------------------------------------------------------------ the gang
    def _emit_started(self, gang: Gang, reason: str) -> None:
        """The ``started`` event of a gang (or a replica group's gang) from its start timings."""
        t = gang.timings
        self.log.emit(ev.Started(reason=reason, actors_s=round(float(t.get("actors_s", 0.0)), 4),
                                 setup_s=round(float(t.get("setup_s", 0.0)), 4),
                                 backend=str(t.get("rendezvous", {}).get("backend", "")),
                                 warm_ranks=int(t.get("warm_ranks", 0)),
                                 warm_rank_rss_mb=t.get("warm_rank_rss_mb")))

    # ------------------------------------------------------------------ the gang
    def _adopt(self, gang: Gang) -> None:
        """Called as soon as the gang's actors exist, so any later error tears them down."""
        with self.lock:
            self.gang = gang

    def _take_gang(self) -> Gang | None:
        with self.lock:
            gang, self.gang = self.gang, None
        return gang

    def _set_state(self, state: AttemptState) -> None:
        with self.lock:
            self.state = state


def _snapshot_s(out: dict[int, dict[str, Any]], key: str = "snapshot_s") -> float | None:
    """The longest wait of any rank's step for its in-memory snapshot (the step ends with the slowest
    rank); None when the ranks took no snapshot. ``key="snapshot_push_s"``: the slowest rank's
    previous push, likewise."""
    waits = [float(o[key]) for o in out.values() if o.get(key) is not None]
    return round(max(waits), 4) if waits else None


