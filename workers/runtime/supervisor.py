"""JobSupervisor: owns one job attempt: plan, place, launch, watch, checkpoint, re-plan, resume.

A detached, named Ray actor (``orthoplex-job-{job_id}-a{attempt}``, namespace ``orthoplex``; see
``launch``). ``run()`` drives the job to an end in one thread while ``status()``, ``events()``,
``cancel()`` and ``preempt()`` answer from others (threaded actor). The control plane *pulls*
events, so training goes on while the service is down.

The loop, per gang (one plan on one placement group):

    plan -> reserve (timeout -> smaller plan, down to min_gpus) -> map ranks -> start actors
    -> rendezvous -> restore newest verified checkpoint (resharded) -> steps
       every step: deadline + heartbeats (hang), actor/node death, straggler scoring
       at the checkpoint cadence (Young): save; then maybe grow onto returned nodes
    -> on failure: classify, tear down everything, re-plan over the nodes left, go again.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from workers.runtime import events as ev
from workers.runtime import placement, planning
from workers.runtime.cadence import CheckpointCadence
from workers.runtime.events import RECOVERY_PHASES, EventLog
from workers.runtime.faults import FaultPlan, parse_faults
from workers.runtime.gang import Gang, StartFailed, start_gang, teardown
from workers.runtime.jobspec import JobSpec, parse_job
from workers.runtime.replanning import JobFailed, Replanning, Switch, held_gpus
from workers.runtime.straggler import StragglerScorer, median
from workers.runtime.watchdog import Failure, NodeDeaths, classify, gather

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED", "PREEMPTED")


class JobSupervisor(Replanning):
    def __init__(self, job_id: str, attempt: int, spec: dict[str, Any], enable_fault_injection: bool = False):
        self.job_id = str(job_id)
        self.attempt = int(attempt)
        self.job: JobSpec = parse_job(spec)
        self.settings = self.job.runtime
        self.log = EventLog(self.job.events_out)
        self.faults = FaultPlan(parse_faults(self.job.faults), enabled=enable_fault_injection)
        self.cadence = CheckpointCadence(self.job.min_every_steps, self.job.max_every_steps, self.job.mtbf_s)
        self._lock = threading.Lock()
        self._run_lock = threading.Lock()
        self._cancel = False
        self._preempt = False
        self._state = "PENDING"
        self._summary: dict[str, Any] | None = None
        self._gang: Gang | None = None
        self._next_step = 0
        self._last_loss: float | None = None
        self._losses: dict[int, float] = {}
        self._step_ts: dict[int, float] = {}  # launch time of every step (last run of it)
        self._plans: list[dict[str, Any]] = []
        self._failures: list[dict[str, Any]] = []
        self._recoveries: list[dict[str, Any]] = []
        self._excluded: set[str] = set()  # lost, slow or suspect nodes kept out of plans
        self._deaths = NodeDeaths(self.settings.node_death_limit)
        self._views: dict[str, placement.NodeView] = {}  # every node seen (gpus), by Ray node id
        self._released: dict[str, int] = {}  # GPUs per node of the gang just torn down
        self._start_failures: dict[tuple[str, str], int] = {}  # deterministic start errors end the job
        self._node_faults: dict[str, tuple[str, float]] = {}  # node -> ("slow"|"jitter", value), test hook
        self._last_ckpt_step = 0
        self._restart_s = 30.0  # measured cost of a gang switch (start + load), updated as we go
        self._cap: int | None = self.job.max_gpus  # the most GPUs the job may use (the scheduler's grant)
        self._resize_to: int | None = None  # a resize asked for and not acted on yet
        self._resize_tried: tuple[int, float] = (0, 0.0)  # (target, when) of the last grow that kept
        self._started_at = time.time()

    # ------------------------------------------------------------------ public API
    def run(self) -> dict[str, Any]:
        """Drive the job to an end; idempotent (a second call waits and returns the same summary)."""
        with self._run_lock:
            if self._summary is None:
                self._summary = self._drive()
                if self.settings.linger_s > 0:
                    threading.Timer(self.settings.linger_s, _exit_self).start()
            return dict(self._summary)

    def status(self) -> dict[str, Any]:
        with self._lock:
            gang = self._gang
            return {
                "job_id": self.job_id,
                "attempt": self.attempt,
                "state": self._state,
                "next_step": self._next_step,
                "steps": self.job.steps,
                "loss": self._last_loss,
                "layout": gang.layout.short() if gang else None,
                "world_size": gang.world_size if gang else 0,
                "nodes": gang.nodes if gang else [],
                "failures": len(self._failures),
                "recoveries": len(self._recoveries),
                "last_checkpoint_step": self._last_ckpt_step,
                "last_event_seq": self.log.last_seq,
                "cadence": self.cadence.to_dict(),
            }

    def events(self, since: int = 0) -> list[dict[str, Any]]:
        return self.log.since(since)

    def cancel(self) -> bool:
        self._cancel = True
        return True

    def preempt(self) -> bool:
        self._preempt = True
        return True

    def resize(self, gpus: int) -> dict[str, Any]:
        """Re-plan onto at most ``gpus`` GPUs at the next step boundary (the scheduler's Shrink/Grow).

        Idempotent: the control plane repeats its decision every round; a repeat arms nothing new,
        except a grow that found no free GPUs, which is tried again after ``resize_retry_s``."""
        gpus = int(gpus)
        if gpus < 1:
            raise ValueError(f"resize: gpus must be >= 1, got {gpus}")
        with self._lock:
            world = self._gang.world_size if self._gang is not None else 0
            last, when = self._resize_tried
            retry = gpus > world and (last != gpus or time.time() - when >= self.settings.resize_retry_s)
            changed = gpus != self._cap
            self._cap = gpus
            armed = (changed or retry) and gpus != world
            if armed:
                self._resize_to = gpus
        if changed:
            self.log.emit(ev.ResizeRequested(reason=f"resize to {gpus} GPUs requested (running {world})",
                                             gpus=gpus, world_size=world))
        return {"gpus": gpus, "armed": armed, "world_size": world}

    # ------------------------------------------------------------------ the loop
    def _set_state(self, state: str) -> None:
        with self._lock:
            self._state = state

    def _drive(self) -> dict[str, Any]:
        self._set_state("RUNNING")
        switch: Switch | None = None
        try:
            while True:
                if self._cancel or self._preempt:
                    switch = Switch("cancelled" if self._cancel else "preempted")
                    break
                phases: dict[str, float] = {}
                t_down = time.monotonic()
                old = self._take_gang()
                self._released = held_gpus(old) if old is not None else {}
                teardown_s = teardown(old)  # a failed or switched gang goes first
                t_plan = time.monotonic()
                chosen = self._plan_when_possible(switch)
                if isinstance(chosen, Switch):  # cancelled or preempted while waiting for GPUs
                    switch = chosen
                    break
                plan, replan = chosen
                phases["plan"] = time.monotonic() - t_plan + (switch.plan_s if switch else 0.0)
                t_place = time.monotonic()
                plan, reservation = self._place(plan)
                phases["place"] = time.monotonic() - t_place + (t_plan - t_down)
                t_start = time.monotonic()
                try:
                    gang = self._start(plan, reservation)
                    phases["start"] = time.monotonic() - t_start
                    t_load = time.monotonic()
                    start_step = self._restore(gang)
                    phases["load"] = time.monotonic() - t_load
                except StartFailed as exc:  # a node died while we started: re-plan without it
                    switch = self._record_failure(exc.failure, time.time())
                    self._check_failure_budget()
                    key = (exc.failure.kind, exc.failure.reason)
                    self._start_failures[key] = self._start_failures.get(key, 0) + 1
                    if exc.failure.kind != "node_lost" and self._start_failures[key] >= 2:
                        raise JobFailed(f"the same start failure twice, giving up: {exc.failure.reason}") from exc
                    continue
                if switch is not None:
                    self._event_resumed(switch, replan, start_step, gang)
                recovery = None
                if switch is not None:
                    recovery = {"switch": switch, "phases": {**phases, "detect": switch.detect_s},
                                "teardown_s": teardown_s, "t0": time.time()}
                switch = self._train(gang, start_step, recovery)
                if switch.kind in ("finished", "cancelled", "preempted"):
                    break
                if switch.kind == "failure":
                    self._check_failure_budget()
                self._set_state("RECOVERING")
        except (JobFailed, planning.PlanningError) as exc:
            teardown(self._take_gang())
            self._set_state("FAILED")
            self.log.emit(ev.Failed(reason=str(exc), step=self._next_step))
            return self._final("FAILED", str(exc))
        except Exception as exc:  # anything unexpected: never leak actors or placement groups
            teardown(self._take_gang())
            self._set_state("FAILED")
            self.log.emit(ev.Failed(reason=f"supervisor error: {type(exc).__name__}: {exc}", step=self._next_step))
            return self._final("FAILED", f"{type(exc).__name__}: {exc}")
        assert switch is not None
        if switch.kind == "finished":
            teardown(self._take_gang(), graceful=True)
            self._set_state("SUCCEEDED")
            self.log.emit(ev.Finished(reason=f"all {self.job.steps} steps done", final_step=self.job.steps,
                                      final_loss=self._last_loss, failures=len(self._failures),
                                      recoveries=len(self._recoveries)))
            return self._final("SUCCEEDED", "")
        if switch.kind == "preempted":
            teardown(self._take_gang(), graceful=True)
            self._set_state("PREEMPTED")
            self.log.emit(ev.Preempted(reason="preempted: checkpoint saved, gang released",
                                       checkpoint_step=self._last_ckpt_step))
            return self._final("PREEMPTED", "")
        teardown(self._take_gang())
        self._set_state("CANCELLED")
        self.log.emit(ev.Cancelled(reason="cancelled by request", step=self._next_step))
        return self._final("CANCELLED", "")

    def _check_failure_budget(self) -> None:
        self.cadence.observe_failure()
        if len(self._failures) > self.settings.max_recoveries:
            raise JobFailed(f"more than {self.settings.max_recoveries} failures")

    def _take_gang(self) -> Gang | None:
        with self._lock:
            gang, self._gang = self._gang, None
        return gang

    def _final(self, state: str, error: str) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "attempt": self.attempt,
            "state": state,
            "error": error,
            "steps_done": self._next_step,
            "final_loss": self._last_loss,
            "losses": {str(k): v for k, v in sorted(self._losses.items())},
            "plans": [{"short": p["plan"].layout.short(), "layout": p["plan"].layout.to_dict(),
                       "num_gpus": p["plan"].num_gpus, "ts": p["ts"]} for p in self._plans],
            "failures": list(self._failures),
            "recoveries": list(self._recoveries),
            "last_checkpoint_step": self._last_ckpt_step,
            "wall_s": round(time.time() - self._started_at, 3),
        }

    # ------------------------------------------------------------------ plan / place / start
    def _place(self, plan: Any) -> tuple[Any, placement.Reservation]:
        """Reserve the plan's GPUs; on timeout try smaller plans down to min_gpus, then wait and retry."""
        give_up = time.monotonic() + self.settings.placement_give_up_s
        while True:
            used = planning.nodes_used(plan)
            res = placement.reserve(plan.layout.world_size, nodes=used, cpu_per_bundle=self.settings.cpu_per_bundle,
                                    timeout_s=self.settings.placement_timeout_s, strategy=self.settings.strategy,
                                    name=f"orthoplex-{self.job_id}-a{self.attempt}")
            if res is not None:
                self.log.emit(ev.Placed(reason=f"gang of {res.size} GPU bundles ready in {res.seconds:.2f}s",
                                        gpus=res.size, placement_group=res.name, gpus_per_node=res.gpus_per_node,
                                        bundle_nodes=list(res.bundle_nodes), seconds=round(res.seconds, 4),
                                        strategy=res.strategy))
                return plan, res
            smaller = plan.layout.world_size - 1
            self.log.emit(ev.PlacementTimeout(reason=f"{plan.layout.world_size} GPUs not ready within "
                                              f"{self.settings.placement_timeout_s}s", gpus=plan.layout.world_size))
            nodes = self._nodes()
            if smaller < self.job.min_gpus:
                if time.monotonic() > give_up:
                    raise JobFailed(f"could not place even {self.job.min_gpus} GPUs")
                time.sleep(self.settings.placement_retry_s)
                smaller = None
            plan = planning.first_plan(self.job, nodes, max_gpus=smaller or self._cap)
            self._event_plan(plan, "smaller plan after a placement timeout")

    def _start(self, plan: Any, res: placement.Reservation) -> Gang:
        try:
            gang = start_gang(plan, res, self.job.train, plan_nodes=planning.plan_nodes(plan),
                              cpu_per_bundle=self.settings.cpu_per_bundle,
                              collective_timeout_s=self.settings.collective_timeout_s,
                              start_timeout_s=self.settings.start_timeout_s,
                              alive_nodes=placement.alive_node_ids, on_created=self._adopt)
        except BaseException:
            if self._gang is None or self._gang.reservation is not res:
                placement.release(res)  # failed before the gang existed: nobody else owns the group
            raise
        self.log.emit(ev.RanksMapped(reason=f"ranks mapped onto bundles ({gang.rank_map.method})",
                                     layout=gang.layout.to_dict(), **gang.rank_map.to_dict()))
        self.log.emit(ev.Started(reason=f"{gang.world_size} rank actors up, process group joined",
                                 actors_s=round(gang.timings["actors_s"], 4),
                                 setup_s=round(gang.timings["setup_s"], 4),
                                 backend=gang.timings["rendezvous"]["backend"]))
        for node, (kind, value) in self._node_faults.items():  # test hook: node properties persist
            for r in gang.rank_map.ranks_on(node):
                gang.workers[r].inject.remote(kind, factor=value, amplitude=value)
        return gang

    def _adopt(self, gang: Gang) -> None:
        """Called as soon as the gang's actors exist, so any later error tears them down."""
        with self._lock:
            self._gang = gang

    def _restore(self, gang: Gang) -> int:
        res = gather({r: w.restore.remote() for r, w in enumerate(gang.workers)},
                     deadline_s=self.settings.start_timeout_s, workers=gang.workers)
        if not res.ok:
            raise StartFailed(self._classify(res, gang, "restore"))
        starts = set(res.results.values())
        if len(starts) != 1:
            raise JobFailed(f"ranks restored different steps: {sorted(starts)}")
        return int(starts.pop())

    # ------------------------------------------------------------------ training
    def _deadline_s(self, walls: list[float], first: bool) -> float:
        base = self.settings.hang_factor * median(walls[-20:]) if walls else 0.0
        d = max(self.settings.hang_timeout_s, base)
        return d * 3 if first else d

    def _train(self, gang: Gang, start: int, recovery: dict[str, Any] | None) -> Switch:
        s = self.settings
        roles = {r: (gang.layout.coords(r).pp,) for r in range(gang.world_size)}
        scorer = StragglerScorer(dict(enumerate(gang.rank_nodes)), roles, window=s.straggler_window,
                                 threshold=s.straggler_threshold, persist_fraction=s.straggler_persist)
        walls: list[float] = []
        since_save = 0
        step = start
        self._next_step = start
        while step < self.job.steps:
            fault_ts = self._fire_faults(gang, step)
            t_launch = time.time()
            refs = {r: w.step.remote() for r, w in enumerate(gang.workers)}
            res = gather(refs, deadline_s=self._deadline_s(walls, first=not walls), workers=gang.workers,
                         heartbeat_s=s.heartbeat_s, heartbeat_timeout_s=s.heartbeat_timeout_s)
            if not res.ok:
                return self._on_failure(gang, res, fault_ts or t_launch)
            out = res.results
            wall = max(o["wall_s"] for o in out.values())
            walls.append(wall)
            loss = float(out[0]["loss"])
            with self._lock:
                self._last_loss = loss
                self._losses[step] = loss
                self._step_ts[step] = t_launch
                self._next_step = step + 1
            self.cadence.observe_step(wall)
            busy = {r: float(o["busy_s"]) for r, o in out.items()}
            self.log.emit(ev.StepDone(step=step, loss=round(loss, 6), wall_s=round(wall, 4),
                                      busy_max_s=round(max(busy.values()), 4), world_size=gang.world_size,
                                      tokens_per_s=round(out[0]["tokens"] / max(wall, 1e-9), 1)))
            self._metrics(step, out, gang)
            if recovery is not None:
                self._event_recovery(recovery, time.time() - recovery["t0"])
                recovery = None
            step += 1
            since_save += 1
            findings = scorer.observe(step - 1, busy)
            if self._cancel:
                return Switch("cancelled")
            if self._resize_to is not None and step < self.job.steps:
                sw = self._on_resize(gang, step)
                if sw is not None:
                    return sw
            if self._preempt or (step < self.job.steps and self.cadence.due(since_save)) or step == self.job.steps:
                failed = self._save(gang, step)
                if failed is not None:
                    return failed
                since_save = 0
                if self._preempt:
                    return Switch("preempted")
                if step < self.job.steps and s.grow:
                    grow = self._maybe_grow(gang, walls)
                    if grow is not None:
                        return grow
            if findings:
                sw = self._on_straggler(gang, findings, scorer, walls, step)
                if sw is not None:
                    return sw
        return Switch("finished")

    def _save(self, gang: Gang, step: int) -> Switch | None:
        t0 = time.time()
        res = gather({r: w.save.remote() for r, w in enumerate(gang.workers)},
                     deadline_s=max(self.settings.hang_timeout_s, 10 * self.cadence.save_s),
                     workers=gang.workers, heartbeat_s=self.settings.heartbeat_s,
                     heartbeat_timeout_s=self.settings.heartbeat_timeout_s)
        if not res.ok:
            return self._on_failure(gang, res, t0, what="checkpoint")
        info = res.results[0]
        self.cadence.observe_save(float(info["seconds"]))
        self._last_ckpt_step = int(info["step"])
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
               "layout": gang.layout.short()}
        path = Path(self.job.metrics_out)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(json.dumps(row) + "\n")

    # ------------------------------------------------------------------ faults (test hook)
    def _fire_faults(self, gang: Gang, step: int) -> float | None:
        import ray

        fired_at = None
        for f in self.faults.due(step):
            fired_at = fired_at or time.time()
            rank = f.target_rank(gang.world_size)
            node = gang.rank_nodes[rank]
            targets: list[int] = [rank]
            if f.kind == "kill_node":
                gang.workers[rank].inject.remote("kill_node")
            elif f.kind == "kill_rank":
                gang.workers[rank].inject.remote("exit")
            elif f.kind == "hang_rank":
                ray.get(gang.workers[rank].inject.remote("hang"))
            else:
                kind, value = ("slow", f.factor) if f.kind == "slow_node" else ("jitter", f.amplitude)
                self._node_faults[node] = (kind, value)
                targets = gang.rank_map.ranks_on(node)
                ray.get([gang.workers[r].inject.remote(kind, factor=value, amplitude=value) for r in targets])
            fired_at = fired_at or time.time()
            self.log.emit(ev.FaultInjected(reason=f"test hook: {f.kind} before step {step}", step=step, node=node,
                                           ranks=targets, kind=f.kind, at_step=f.at_step, factor=f.factor,
                                           amplitude=f.amplitude))
            if f.kind == "kill_node":
                time.sleep(0.2)  # let the node die before the step is launched onto it
        return fired_at

    # ------------------------------------------------------------------ failures and switches
    def _on_failure(self, gang: Gang, res: Any, fault_ts: float, what: str = "step") -> Switch:
        failure = self._classify(res, gang, what)
        return self._record_failure(failure, fault_ts)

    def _classify(self, res: Any, gang: Gang, what: str) -> Failure:
        return classify(res, gang.rank_nodes, alive_nodes=placement.alive_node_ids,
                        unreachable=placement.raylet_unreachable, confirm_s=self.settings.node_confirm_s, what=what)

    def _record_failure(self, failure: Failure, fault_ts: float) -> Switch:
        detected = time.time()
        change = planning.ClusterChange(reason=failure.reason)
        if failure.kind == "node_lost":
            self._excluded.update(failure.nodes)
            change.lost_nodes = list(failure.nodes)
            self.log.emit(ev.NodeLost(reason=failure.reason, nodes=list(failure.nodes), ranks=list(failure.ranks),
                                      step=self._next_step))
        elif failure.kind == "hang":
            self.log.emit(ev.Hang(reason=failure.reason, ranks=list(failure.ranks), step=self._next_step))
        else:
            self.log.emit(ev.RankFailed(reason=failure.reason, ranks=list(failure.ranks), nodes=list(failure.nodes),
                                        step=self._next_step))
            suspect = self._deaths.record(failure)
            if suspect is not None:  # re-planned as if the node were lost
                self._excluded.add(suspect)
                change.lost_nodes = [suspect]
                self.log.emit(ev.NodeExcluded(
                    reason=f"rank processes died {self._deaths.deaths[suspect]} times on node {suspect[:8]} "
                    "while it stayed up: kept out of this job's plans",
                    node=suspect, deaths=self._deaths.deaths[suspect], step=self._next_step))
        self._failures.append({**failure.to_dict(), "step": self._next_step, "ts": detected})
        return Switch("failure", failure=failure, fault_ts=fault_ts, change=change,
                      detect_s=max(0.0, detected - fault_ts))

    # ------------------------------------------------------------------ events
    def _event_resumed(self, switch: Switch, replan: Any, start: int, gang: Gang) -> None:
        cause = switch.failure.kind if switch.failure else switch.kind
        self.log.emit(ev.Resumed(reason=f"resumed from the checkpoint of step {start} after {cause}",
                                 from_step=start, cause=cause, layout=gang.layout.to_dict(), short=gang.layout.short(),
                                 world_size=gang.world_size, steps_redone=max(0, self._next_step - start)))

    def _event_recovery(self, recovery: dict[str, Any], first_step_s: float) -> None:
        sw: Switch = recovery["switch"]
        phases = {**recovery["phases"], "first_step": first_step_s}
        phases = {p: phases[p] for p in RECOVERY_PHASES}
        event = ev.Recovered.of(phases, sw.failure.kind if sw.failure else sw.kind, recovery["teardown_s"])
        self._restart_s = phases["start"] + phases["load"] + phases["first_step"]
        self._recoveries.append({"cause": event.cause, "phases": event.phases, "total_s": event.total_s})
        self.log.emit(event)



def _exit_self() -> None:
    """A finished detached supervisor that nobody collected goes away on its own (``linger_s``)."""
    import ray

    ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
