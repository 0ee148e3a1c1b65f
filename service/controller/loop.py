"""The controller loop: one round = pull events → cancel → snapshot → decide → apply.

Only the replica holding the controller lease acts (``lease.py``); a heartbeat renews it every
third of its TTL. Becoming the leader (first start, or taking over from a replica that stopped
renewing) starts with :func:`~service.controller.reconcile.reconcile`. One round, as the leader:

1. **pull** every active attempt's new events and store them with the states they imply
   (``events_pull``); a supervisor that is gone without a final event gets a new attempt, or the
   job FAILS after ``max_attempts`` (``apply.retry_attempt``); a finished one is reaped;
2. **cancel**: jobs with ``cancel_requested`` → ``supervisor.cancel()`` → CANCELLED (fenced);
   **drain**: supervisors learn the draining nodes, jobs past a drain deadline are preempted (``drains``);
3. **schedule**: snapshot (job store + :func:`~service.controller.cluster.cluster_view`) →
   :func:`service.scheduler.policy.decide` → apply (``apply.apply_decisions``). No decisions while
   Ray is unavailable.

Any write of a round runs in a lease-guarded transaction; losing the lease mid-round raises
:class:`LeaseLost`, which ends the round without writing and demotes this replica.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import sqlalchemy as sa

from service.controller import apply
from service.controller.cluster import ClusterView, cluster_view
from service.controller.cluster_snapshot import DbState, JobRow, build_snapshot, load_db_state
from service.controller.context import ControllerConfig, Ctx
from service.controller.crashpoints import crash_point
from service.controller.drains import load_drains, overdue, tell_supervisors
from service.controller.events_pull import pull
from service.controller.lease import LeaderLease, LeaseLost
from service.controller.reconcile import ACTIVE, ReconcileReport, reconcile
from service.controller.supervisors import AttemptKey, SupervisorGone, Supervisors, SupervisorUnreachable
from service.db import transitions as tx
from service.log import get_logger
from workers.states import AttemptState, JobState

log = get_logger("service.controller.loop")


@dataclass
class TickResult:
    """What one round did (``leader=False``: this replica did nothing)."""

    leader: bool
    reconciled: ReconcileReport | None = None
    events_stored: int = 0
    finished: list[tuple[int, str]] = field(default_factory=list)
    retried: list[tuple[int, str]] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)
    drains_told: list[int] = field(default_factory=list)  # jobs whose supervisor learnt the draining nodes
    applied: list[apply.Applied] = field(default_factory=list)
    cluster: ClusterView | None = None


class Controller:
    """The control loop of one service replica (see the module docstring)."""

    def __init__(
        self,
        engine: sa.Engine,
        config: ControllerConfig | None = None,
        holder: str | None = None,
        connect: Callable[[], bool] | None = None,
    ) -> None:
        """``connect``: called (at most every 10 s) while this process is not connected to Ray;
        without it the controller only waits for someone else to connect."""
        self.config = config or ControllerConfig()
        self._connect = connect
        self._last_connect = 0.0
        lease = LeaderLease(engine, holder, ttl_s=self.config.lease_ttl_s)
        self.ctx = Ctx(engine, lease, Supervisors(self.config.call_timeout_s), self.config)
        from service.settings import Settings

        profile = Settings()  # read now, not the process-wide cache: the environment is the truth
        self.ctx.gpu_type, self.ctx.gpus_per_node = profile.gpu_type, profile.gpus_per_node
        from service.controller.curves import CurveBook

        self._curve_book = CurveBook(self._curve)
        self.decisions: deque[apply.Applied] = deque(maxlen=1000)
        self.rounds = 0  # rounds run as the leader
        self._leading = False
        self._leading_epoch: int | None = None

    @property
    def lease(self) -> LeaderLease:
        return self.ctx.lease

    @property
    def is_leader(self) -> bool:
        return self.ctx.lease.valid()

    def heartbeat(self) -> bool:
        """Renew (or try to take) the lease; True while this replica is the leader."""
        try:
            return self.ctx.lease.acquire_or_renew()
        except Exception as exc:  # the database is unreachable: stop acting until it is back
            log.warning("lease heartbeat failed", extra={"error": repr(exc)})
            self.ctx.lease._lost()
            return False

    # -- one round --------------------------------------------------------------------------------
    def tick(self) -> TickResult:
        """One round; does nothing unless this replica holds the lease."""
        if not self.ctx.lease.valid():
            self._leading = False
            return TickResult(leader=False)
        result = TickResult(leader=True)
        self.rounds += 1
        if not self._ray_ready():
            result.cluster = cluster_view()  # says why: not connected
            return result
        try:
            epoch = self.ctx.lease.epoch
            if not self._leading or epoch != self._leading_epoch:
                # a new term (first, or the lease was lost and won back): trust no cached state
                self.ctx.sups = Supervisors(self.config.call_timeout_s)
                self.ctx.decided.clear()
                self.ctx.drains_told.clear()
                result.reconciled = reconcile(self.ctx)
                self._leading, self._leading_epoch = True, epoch
            self._pull_all(result)
            self._cancel_requested(result)
            self._drain(result)
            self._schedule(result)
        except LeaseLost as exc:
            log.warning("round aborted: lease lost", extra={"error": str(exc)})
            self._leading = False
            result.leader = False
        return result

    def _ray_ready(self) -> bool:
        import ray

        if ray.is_initialized():
            return True
        if self._connect is not None and time.monotonic() - self._last_connect > 10.0:
            self._last_connect = time.monotonic()
            return bool(self._connect())
        return False

    def _active_jobs(self) -> list[JobRow]:
        with self.ctx.read() as s:
            return [j for j in load_db_state(s).jobs if j.state in ACTIVE and j.attempt >= 1]

    def _pull_all(self, result: TickResult) -> None:
        for job in self._active_jobs():
            key = AttemptKey(job.id, job.attempt)
            try:
                res = pull(self.ctx, apply.as_ref(job))
            except SupervisorUnreachable as exc:
                log.info(
                    "supervisor unreachable; retry next round", extra={"job_id": job.id, "error": str(exc)}
                )
                continue
            except SupervisorGone as exc:
                outcome = apply.retry_attempt(self.ctx, job, f"supervisor vanished: {exc}")
                result.retried.append((job.id, outcome))
                continue
            result.events_stored += res.stored
            if res.final is not None:
                result.finished.append((job.id, res.final))
                self._reap(key)

    def _reap(self, key: AttemptKey) -> None:
        self.ctx.sups.kill(key)
        self.ctx.preempting.discard(key)
        self.ctx.cancelling.pop(key, None)

    def _cancel_requested(self, result: TickResult) -> None:
        """Ask each cancel-requested job's supervisor to stop; its ``cancelled`` event (pulled next
        round) ends the job cleanly. Without one after ``cancel_grace_s`` (or with the supervisor
        gone), the job is CANCELLED here and the supervisor killed."""
        for job in self._active_jobs():
            if not job.cancel_requested:
                continue
            key = AttemptKey(job.id, job.attempt)
            asked = self.ctx.cancelling.get(key)
            if asked is None:
                try:
                    self.ctx.sups.call(key, "cancel")
                    crash_point("cancel:asked")
                    self.ctx.cancelling[key] = time.monotonic()
                    continue
                except SupervisorUnreachable:
                    continue
                except SupervisorGone:
                    pass
            elif time.monotonic() - asked < self.config.cancel_grace_s:
                continue
            with self.ctx.txn() as s:
                ok = tx.transition(
                    s,
                    job.id,
                    expected={job.state},
                    new=JobState.CANCELLED,
                    epoch=job.epoch,
                    reason="cancelled on request (supervisor stopped)",
                    commit=False,
                )
                if ok:
                    tx.end_attempt(
                        s, job.id, epoch=job.epoch, state=AttemptState.CANCELLED, reason="cancelled", commit=False
                    )
            if ok:
                result.cancelled.append(job.id)
            self._reap(key)

    def _drain(self, result: TickResult) -> None:
        with self.ctx.read() as s:
            found = load_drains(s)
            jobs = [j for j in load_db_state(s).jobs if j.attempt >= 1]
        result.drains_told = tell_supervisors(self.ctx, jobs, found)
        for job, preempt in overdue(jobs, found):
            result.applied.append(apply.Applied(preempt.kind, job.id, None, apply.preempt(self.ctx, job, preempt),
                                                preempt.reason))

    def _schedule(self, result: TickResult) -> None:
        from service.scheduler.policy import decide

        view = cluster_view()
        result.cluster = view
        if not view.available:
            return
        with self.ctx.read() as s:
            db = load_db_state(s)
            draining = set(load_drains(s))
        self._update_curves(db)
        self._update_recoveries(db)
        snapshot = build_snapshot(db, view, resizable=self.config.runtime_resizes, curves=self.ctx.curves,
                                  recoveries=self.ctx.recoveries, draining=draining)
        decisions = decide(snapshot)
        jobs = {j.id: j for j in db.jobs}
        result.applied += apply.apply_decisions(self.ctx, jobs, decisions)
        self.decisions.extend(result.applied)

    def _update_curves(self, db: DbState) -> None:
        """Goodput curves for elastic jobs not seen before (computed off the loop: a round waits
        for them at most ``CurveBook.wait_s``); forget those of jobs that ended."""
        self._curve_book.update(db.jobs, self.ctx.curves)

    def _update_recoveries(self, db: DbState) -> None:
        """Each live job's recovery choice (planned once per job: specs never change); forget ended jobs."""
        from service.recovery import job_recovery

        live = {j.id for j in db.jobs}
        for job_id in [k for k in self.ctx.recoveries if k not in live]:
            del self.ctx.recoveries[job_id]
        for j in db.jobs:
            if j.id not in self.ctx.recoveries:
                self.ctx.recoveries[j.id] = job_recovery(j.spec, j.max_gpus, gpu_type=self.ctx.gpu_type,
                                                         gpus_per_node=self.ctx.gpus_per_node).to_dict()

    def _curve(self, job: JobRow) -> dict[int, float] | None:
        from service.controller.curves import goodput_curve

        return goodput_curve(job.spec, job.min_gpus, job.max_gpus, gpu_type=self.ctx.gpu_type,
                             gpus_per_node=self.ctx.gpus_per_node)

    # -- running ----------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Heartbeat in a side thread, rounds every ``tick_s`` here, until ``stop`` is set."""
        beat = threading.Thread(
            target=self._heartbeat_loop, args=(stop,), name="controller-lease", daemon=True
        )
        beat.start()
        try:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    self.tick()
                except Exception:  # one bad round must not end the loop; the next one retries
                    log.exception("controller round failed")
                    self._leading = False
                stop.wait(max(0.0, self.config.tick_s - (time.monotonic() - started)))
        finally:
            beat.join(timeout=5)
            try:
                self.ctx.lease.release()
            except Exception as exc:
                log.warning("lease release failed", extra={"error": repr(exc)})

    def _heartbeat_loop(self, stop: threading.Event) -> None:
        interval = self.config.lease_ttl_s / 3
        while not stop.is_set():
            self.heartbeat()
            stop.wait(interval)
