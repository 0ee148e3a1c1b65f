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
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from planner.layout import Layout
from workers.runtime.cluster.gang import Gang, StartFailed
from workers.runtime.cluster.placement_groups import Reservation
from workers.runtime.cluster.port import ClusterPort
from workers.runtime.cluster.reachability import PeerProbe
from workers.runtime.cluster.watchdog import Failure, GatherResult, NodeDeaths
from workers.runtime.contract import events as ev
from workers.runtime.contract.job_spec import JobSpec
from workers.runtime.policy import planning as planner_bridge
from workers.runtime.policy.checkpoint_cadence import CheckpointCadence
from workers.runtime.policy.replanner import Keep, Replanner, SwitchTo, held_gpus
from workers.runtime.policy.stragglers import LinkScorer, StragglerScorer, median
from workers.runtime.recovery import fencing
from workers.runtime.recovery import memory_snapshots as memsnap
from workers.runtime.recovery.replica_groups import ReplicaSet, raised_to_drop
from workers.runtime.supervision.job_tracking import JobTracking
from workers.states import AttemptState


class JobFailed(RuntimeError):
    pass


class Phase(StrEnum):
    PLAN = "PLAN"  # tear down the gang that ended, choose the next plan
    WAIT = "WAIT"  # too few GPUs free: wait for some (cancel and preempt end the wait)
    PLACE = "PLACE"  # reserve the plan's GPUs (a timeout tries a smaller plan)
    START = "START"  # start the gang and restore the newest checkpoint
    TRAIN = "TRAIN"  # one step per call (and checkpoints, resizes, stragglers, grows between steps)
    FINISHED = "FINISHED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    PREEMPTED = "PREEMPTED"


ENDS: dict[Phase, AttemptState] = {
    Phase.FINISHED: AttemptState.SUCCEEDED,
    Phase.FAILED: AttemptState.FAILED,
    Phase.CANCELLED: AttemptState.CANCELLED,
    Phase.PREEMPTED: AttemptState.PREEMPTED,
}


@dataclass(frozen=True)
class Transition:
    source: Phase
    target: Phase
    reason: str = ""


@dataclass
class Switch:
    """Why the current gang ends before the job does."""

    kind: str  # failure | straggler | grow | resize | finished | cancelled | preempted
    failure: Failure | None = None
    change: planner_bridge.ClusterChange | None = None
    replan: Any = None  # decided already (straggler, grow, resize): the planner's Replan
    detect_s: float = 0.0
    plan_s: float = 0.0  # planner time already spent deciding the switch

    @property
    def cause(self) -> str:
        return self.failure.kind if self.failure else self.kind


@dataclass
class _Cycle:
    """Timings of one pass from tear-down to the first step of the next gang."""

    t_down: float
    t_plan: float = 0.0
    teardown_s: float = 0.0
    give_up: float = 0.0  # waiting for GPUs ends in failure after this (monotonic)
    waiting: bool = False
    place_give_up: float | None = None
    t_place: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    plan: Any = None
    replan: Any = None
    reservation: Reservation | None = None


@dataclass
class _Run:
    """One gang's training run."""

    gang: Gang
    scorer: StragglerScorer
    step: int
    links: LinkScorer | None = None  # slow or lossy links, from heartbeat round trips
    walls: list[float] = field(default_factory=list)
    since_save: int = 0
    recovery: dict[str, Any] | None = None  # the switch being timed, until its first step
    last_groups: set[int] = field(default_factory=set)  # replica groups: those the last attempt ran on


class AttemptMachine:
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
        self.next_step = 0
        self.last_loss: float | None = None
        self.losses: dict[int, float] = {}
        self.step_ts: dict[int, float] = {}  # launch time of every step (last run of it)
        self.failures: list[dict[str, Any]] = []
        self.recoveries: list[dict[str, Any]] = []
        self.last_ckpt_step = 0
        self.deaths = NodeDeaths(self.settings.node_death_limit)
        self._start_failures: dict[tuple[str, str], int] = {}  # deterministic start errors end the job
        self._switch: Switch | None = None
        self._cycle: _Cycle | None = None
        self._run: _Run | None = None
        self.tracking = JobTracking(job.tracking, job.model, job.gpu_type, job.steps)
        # after a failure without a dead node: which node pairs cannot connect (``reachability``);
        # set by the supervisor (Ray), None in the in-memory tests
        self.peer_probe: PeerProbe | None = None
        self.cut_off: set[str] = set()  # nodes left out for a peer partition
        # replica groups (runtime option replica_groups >= 2): the groups, dropped and replaced while
        # the others keep stepping (workers.runtime.recovery.replica_groups); None for a job re-planned as one gang
        self.replicas: ReplicaSet | None = None
        # replica groups: 0-based step -> attempts at it (1 + the survivors' voted-down attempts, or the
        # supervisor's launches that raised, whichever is more); counted from what the ranks report,
        # since a rank redoes a voted-down attempt at once, itself
        self.step_attempts: dict[int, int] = {}
        self._failed_tries: Counter[int] = Counter()  # step -> voted-down attempts (most of any group)

    # ------------------------------------------------------------------ requests (from other threads)
    def request_resize(self, gpus: int, placement: dict[str, int] | None = None) -> dict[str, Any]:
        """Re-plan onto at most ``gpus`` GPUs (on ``placement``'s nodes, when given) at the next step
        boundary (the scheduler's Shrink/Grow).

        Idempotent: the control plane repeats its decision every round; a repeat arms nothing new,
        except a grow that found no free GPUs, which is tried again after ``resize_retry_s``."""
        if gpus < 1:
            raise ValueError(f"resize: gpus must be >= 1, got {gpus}")
        with self.lock:
            world = self.gang.world_size if self.gang is not None else 0
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
            target, reason = getattr(self, f"_{source.value.lower()}")()
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
        if self.settings.replicas.groups >= 2:
            return self._plan_replicas()
        if self._cycle is None:  # a new pass: the gang that ended goes first
            if self.cancel_requested or self.preempt_requested:
                return self._end_switch(Switch("cancelled" if self.cancel_requested else "preempted"))
            cycle = self._cycle = _Cycle(t_down=time.monotonic())
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
        if self.replicas is not None:
            return self._place_replicas(cycle, self.replicas)
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
        if self.replicas is not None and cycle is not None:
            return self._start_replicas(cycle, self.replicas)
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
        except StartFailed as exc:  # a node died while we started: re-plan without it
            self._switch = self._record_failure(exc.failure, time.time())
            self._check_failure_budget()
            key = (exc.failure.kind, exc.failure.reason)
            self._start_failures[key] = self._start_failures.get(key, 0) + 1
            if exc.failure.kind != "node_lost" and self._start_failures[key] >= 2:
                raise JobFailed(f"the same start failure twice, giving up: {exc.failure.reason}") from exc
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
        s = self.settings
        roles = {r: (gang.layout.coords(r).pp,) for r in range(gang.world_size)}
        scorer = StragglerScorer(dict(enumerate(gang.rank_nodes)), roles, window=s.stragglers.window,
                                 threshold=s.stragglers.threshold, persist_fraction=s.stragglers.persist)
        links = LinkScorer(dict(enumerate(gang.rank_nodes)), window=s.stragglers.window)
        self._run = _Run(gang, scorer, start_step, links=links, recovery=recovery)
        self.next_step = start_step
        self._cycle = None
        self._set_state(AttemptState.RECOVERING if switch is not None else AttemptState.RUNNING)
        return Phase.TRAIN, f"training from step {start_step}"

    def _train(self) -> tuple[Phase, str]:
        run = self._run
        assert run is not None
        sw = self._train_one(run) if self.replicas is None else self._train_replicas(run, self.replicas)
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
        if sw.kind == "failure":
            self._check_failure_budget()
        self._switch = sw
        self._set_state(AttemptState.RECOVERING)
        return Phase.PLAN, f"switch: {sw.cause}"

    # ------------------------------------------------------------------ training
    def _deadline_s(self, walls: list[float], first: bool) -> float:
        base = self.settings.detection.hang_factor * median(walls[-20:]) if walls else 0.0
        d = max(self.settings.detection.hang_timeout_s, base)
        return d * 3 if first else d

    def _train_one(self, run: _Run) -> Switch | None:
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
        if self.settings.snapshots.enabled:
            # no copy held on a node left out for a peer partition (it may be cut from the new gang)
            held = {n: v for n, v in self.port.snapshots().items() if n not in self.cut_off}
            choice = memsnap.choose(held, not_before=self.last_ckpt_step, not_after=self.next_step)
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
        """Re-plan within the new grant; checkpoint and switch unless the planner keeps the plan."""
        with self.lock:
            target, self.resize_to = self.resize_to, None
        if target is None or target == gang.world_size:
            return None
        decision = self.replanner.on_resize(target, gang.rank_nodes, step)
        if isinstance(decision, Keep):
            return None
        failed = self._save(gang, step) if self.last_ckpt_step != step else None
        if failed is not None:
            return failed
        return Switch("resize", change=decision.change, replan=decision.replan, plan_s=decision.plan_s)

    def _on_straggler(self, gang: Gang, findings: list[Any], run: _Run, step: int) -> Switch | None:
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
        return self._record_failure(self.port.classify(res, gang, what), since)

    def _record_failure(self, failure: Failure, since: float) -> Switch:
        """Record ``failure`` (events, excluded nodes); ``since``: when the failed call was launched."""
        failure = self._peer_partition(failure)
        detected = time.time()
        change = planner_bridge.ClusterChange(reason=failure.reason)
        if failure.kind == "node_lost":
            self.replanner.exclude(failure.nodes)
            change.lost_nodes = list(failure.nodes)
            self.log.emit(ev.NodeLost(reason=failure.reason, nodes=list(failure.nodes), ranks=list(failure.ranks),
                                      step=self.next_step))
        elif failure.kind == "hang":
            self.log.emit(ev.Hang(reason=failure.reason, ranks=list(failure.ranks), step=self.next_step))
        else:
            self.log.emit(ev.RankFailed(reason=failure.reason, ranks=list(failure.ranks), nodes=list(failure.nodes),
                                        step=self.next_step))
            suspect = self.deaths.record(failure)
            if suspect is not None:  # re-planned as if the node were lost
                self.replanner.exclude([suspect])
                change.lost_nodes = [suspect]
                self.log.emit(ev.NodeExcluded(
                    reason=f"rank processes died {self.deaths.deaths[suspect]} times on node {suspect[:8]} "
                    "while it stayed up: kept out of this job's plans",
                    node=suspect, deaths=self.deaths.deaths[suspect], step=self.next_step))
        self.failures.append({**failure.to_dict(), "step": self.next_step, "ts": detected})
        return Switch("failure", failure=failure, change=change, detect_s=max(0.0, detected - since))

    def _peer_partition(self, failure: Failure) -> Failure:
        """A failure with no dead node (ranks raised, or hung): probe which node pairs of the gang can
        connect; when some cannot while all answer the head, the nodes ``reachability.to_exclude``
        picks are fenced at once (a new epoch) and the failure becomes ``node_lost`` for them, so the
        re-plan leaves them out instead of restarting on the same nodes."""
        if self.peer_probe is None or failure.kind not in ("rank_failed", "hang") or failure.died:
            return failure
        with self.lock:
            gang = self.gang
        cycle = self._cycle
        if gang is not None:
            rank_nodes = list(gang.rank_nodes)
        elif cycle is not None and cycle.reservation is not None:
            rank_nodes = list(cycle.reservation.bundle_nodes)
        else:
            return failure
        if len(set(rank_nodes)) < 2:
            return failure
        try:
            verdict = self.peer_probe(rank_nodes)
        except Exception:  # a probe that cannot run leaves the failure as it was (restart as before)
            return failure
        if verdict is None or not verdict.exclude:
            return failure
        ckpt_dir = self.job.train.get("checkpoint_dir")
        if ckpt_dir:  # the left-out node's ranks can neither save nor step from now on
            fencing.advance(ckpt_dir, owner="peer_unreachable")
        self.log.emit(ev.PeerUnreachable(reason=verdict.reason(), nodes=list(verdict.exclude),
                                         pairs=[list(p) for p in verdict.cut], probe_s=round(verdict.seconds, 3),
                                         step=self.next_step))
        self.cut_off.update(verdict.exclude)
        ranks = tuple(r for r, n in enumerate(rank_nodes) if n in verdict.exclude)
        return Failure("node_lost", f"{verdict.reason()} (after: {failure.reason})", tuple(verdict.exclude), ranks,
                       failure.detected_at)

    def _check_failure_budget(self) -> None:
        self.cadence.observe_failure()
        if len(self.failures) > self.settings.max_recoveries:
            raise JobFailed(f"more than {self.settings.max_recoveries} failures")

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
    def _plan_replicas(self) -> tuple[Phase, str]:
        """One group's layout (the hint's TP, nothing else: ``job_spec.check_replica_spec``) times
        ``replica_groups``; no planner search (the groups are the unit of failure)."""
        if self.cancel_requested or self.preempt_requested:
            return self._end_switch(Switch("cancelled" if self.cancel_requested else "preempted"))
        if self.replicas is not None:
            raise JobFailed("replica groups: every group was lost (no re-plan path for replica groups yet)")
        hint = self.job.layout_hint
        layout = Layout(tp=int(hint.get("tp", 1)), micro_batch=int(hint.get("micro_batch", 1)),
                        sp=bool(hint.get("sp", False))).with_global_batch(self.job.global_batch)
        self.replicas = ReplicaSet(layout, int(self.settings.replicas.groups), self.name)
        now = time.monotonic()
        self._cycle = _Cycle(t_down=now, t_plan=now, t_place=now, give_up=now + self.settings.placement.give_up_s)
        return Phase.PLACE, f"{self.replicas.want} replica groups of {layout.short()}"

    def _place_replicas(self, cycle: _Cycle, reps: ReplicaSet) -> tuple[Phase, str]:
        """A node per group (nodes holding no group first), each group its own placement group; fewer
        groups when fewer nodes have room (the others are started later, as replacements)."""
        tp = reps.layout.world_size
        nodes = reps.pick_nodes(self.port, reps.want, self.replanner.excluded)
        got: list[tuple[str, Reservation]] = []
        for g, node in enumerate(nodes):
            res = self.port.reserve(tp, nodes=[node], name=f"{self.name}-rg{g}", per_node={node: tp})
            if res is None:
                break
            got.append((node, res))
            self.log.emit(ev.Placed(reason=f"replica group {g}: {tp} GPU bundles on node {node[:8]}",
                                    gpus=res.size, placement_group=res.name, gpus_per_node=res.gpus_per_node,
                                    bundle_nodes=list(res.bundle_nodes), seconds=round(res.seconds, 4),
                                    strategy=res.strategy))
        if not got:
            if time.monotonic() > cycle.give_up:
                raise JobFailed(f"no node with {tp} free GPUs for a replica group")
            time.sleep(self.settings.placement.retry_s)
            return Phase.PLACE, "no room for a replica group yet"
        cycle.plan = got  # (node, reservation) per group, in group order
        return Phase.START, f"{len(got)} of {reps.want} replica groups reserved"

    def _start_replicas(self, cycle: _Cycle, reps: ReplicaSet) -> tuple[Phase, str]:
        t0 = time.monotonic()
        for g, (node, res) in enumerate(cycle.plan):
            try:
                gang = self.port.start_gang(reps.plan(g, node), res, on_created=lambda gang, g=g: reps.add(g, gang))
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
        self._run = _Run(view, scorer, 0)
        self.next_step = 0
        self._cycle = None
        cycle.phases["start"] = time.monotonic() - t0
        return Phase.TRAIN, f"{reps.size} replica groups training from step 0"

    def _train_replicas(self, run: _Run, reps: ReplicaSet) -> Switch | None:
        """One step attempt of every live replica group. A group that lost a node is dropped (the
        others redo the step without it: torchft voted it down) and a replacement starts in the
        background; a replacement that is up joins at this step boundary and heals from a peer."""
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
                               step=step, kwargs={"expect": expect, "prev": prev})
        if res.lost_nodes:
            self._tell_survivors(reps, res.lost_nodes)
        rows = {owners[r]: row for r, row in res.results.items()}
        done = {g for (g, _), row in rows.items() if row["event"] == "step"}
        if not res.ok:
            self._drop_replicas(reps, view, owners, res, t_launch, step, done)
        else:
            raised_to_drop(reps, set(), done, [])
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
                _keep_phases(reps.history[g], row)
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
                _keep_phases(reps.history[g], row)
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
            self._replica_step_done(run, recent[st], committed, reps)
        run.step = max(recent) + 1
        if run.step >= self.job.steps or self.preempt_requested:
            target = max(reps.groups, key=lambda g: int(reps.groups[g].timings.get("fence_epoch") or 0))
            failed = self._save(reps.groups[target], run.step)
            if failed is not None:
                raise JobFailed(f"replica groups: the final checkpoint failed: {failed.cause}")
            if self.preempt_requested:
                return Switch("preempted")
        reps.start_replacements(self.port, self.replanner.excluded, self.settings.replicas.retry_s, lambda g: None)
        return None

    def _replica_step_done(self, run: _Run, row: dict[str, Any], committed: dict[tuple[int, int], dict[str, Any]],
                           reps: ReplicaSet) -> None:
        done = int(row["step"]) + 1
        wall = max(float(r["wall_s"]) for r in committed.values())
        run.walls.append(wall)
        loss = float(row["loss"])
        with self.lock:
            self.last_loss = loss
            self.losses[done] = loss
            self.step_ts[done] = float(row.get("ts", time.time()))
            self.next_step = done
        self.cadence.observe_step(wall)
        world = int(row["participants"]) * reps.layout.world_size
        busy = [float(r["busy_s"]) for r in committed.values()]
        self.log.emit(ev.StepDone(step=done, loss=round(loss, 6), wall_s=round(wall, 4), busy_max_s=round(max(busy), 4),
                                  world_size=world, tokens_per_s=round(float(row["tokens"]) / max(wall, 1e-9), 1),
                                  val_loss=None))
        out = {i: {**r, "loss": loss} for i, r in enumerate(committed.values())}
        view, _ = reps.view()
        self._metrics(done, out, view)
        self.tracking.on_step(done, out[0], world, wall)

    def _drop_replicas(self, reps: ReplicaSet, view: Gang, owners: list[tuple[int, int]], res: GatherResult,
                       since: float, step: int, done: set[int]) -> None:
        failure = self.port.classify(res, view, "step")
        lost = reps.hit(failure, owners, res.unresponsive)
        # a group whose ranks raised in two attempts in a row is dropped (and replaced) rather than
        # redoing the step with it for ever; a survivor's raises while the redo after a peer's death
        # waits for torchft are not held against it (replicas.raised_to_drop)
        raised = {owners[r][0] for r in res.errors if r < len(owners)} if failure.kind == "rank_failed" else set()
        blamed = raised_to_drop(reps, raised - set(lost), done, list(lost))
        lost = lost or blamed
        self.port.forget_replicas(lost)
        self._record_failure(failure, since)  # node_lost / rank_failed / hang, as for any gang
        self._check_failure_budget()
        if not lost and failure.kind == "hang":
            raise JobFailed(f"replica groups: a step hung with every group alive ({failure.reason})")
        for g in lost:
            gang = reps.drop(g)
            if gang is None:
                continue
            nodes = gang.nodes
            self.port.teardown(gang)
            reps.dropped.append({"group": g, "nodes": nodes, "step": step + 1, "ts": time.time()})
            self.log.emit(ev.ReplicaDropped(reason=f"replica group {g} lost ({failure.kind}: {failure.reason}); "
                                            f"{reps.size} groups keep stepping", group=g, nodes=list(nodes),
                                            step=step + 1, groups_left=reps.size))
        if reps.size == 0:
            raise JobFailed("replica groups: every group was lost (no re-plan path for replica groups yet)")
        reps.start_replacements(self.port, self.replanner.excluded, 0.0, lambda g: None)

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
            _keep_phases(reps.history[j.group], row)  # the replacement's first (healing) attempt
            self._emit_started(gang, f"replacement replica group {j.group} on node {j.node[:8]}")
            healed = row["healed_from"]
            self.log.emit(ev.ReplicaJoined(reason=f"replica group {j.group} took the state of group {healed} over "
                                           f"the network in its first step (no share of that step's batch; its share from the "
                                           f"next step on): {reps.size} groups",
                                           group=j.group, seconds=round(float(row["ts"]) - j.t0, 3),
                                           step=int(row["step"]) + 1, from_group=int(-1 if healed is None else healed),
                                           nodes=[j.node], groups=reps.size))

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

    # ------------------------------------------------------------------ the gang
    def _emit_started(self, gang: Gang, reason: str) -> None:
        """The ``started`` event of a gang (or a replica group's gang) from its start timings."""
        t = gang.timings
        self.log.emit(ev.Started(reason=reason, actors_s=round(float(t.get("actors_s", 0.0)), 4),
                                 setup_s=round(float(t.get("setup_s", 0.0)), 4),
                                 backend=str(t.get("rendezvous", {}).get("backend", "")),
                                 warm_ranks=int(t.get("warm_ranks", 0))))

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


def _keep_phases(history: dict[str, Any], row: dict[str, Any]) -> None:
    """A group's step attempts, committed and aborted (rank 0's rows: ``phases`` timestamps, torchft's
    error), kept by (step, attempt start) in ``history["attempts"]``: where a survivor's stall goes."""
    seen = history.setdefault("attempts", {})
    for x in [*row.get("recent", []), *row.get("recent_aborts", []), row]:
        ph = x.get("phases")
        if ph:
            seen[f"{x['step']}@{ph['start']:.3f}"] = {"step": int(x["step"]), "event": x.get("event", "step"),
                                                      "participants": x.get("participants"),
                                                      "error": x.get("error", ""), **ph}
