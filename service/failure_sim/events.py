"""The event loop: one policy played on one failure trace.

Training progress between events is computed in closed form (work in periods of ``tau`` seconds,
each followed by a blocking save of ``save_s``), so the loop only visits failures, repairs, resumes
and group joins. Tokens are counted at the throughput of the shape the job runs on; ETTR is the
tokens trained over what the full job would have trained in the same wall time.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Protocol

from planner.recovery_names import REPLICA_GROUP, RESTART
from service.failure_sim.policies import Policy
from service.failure_sim.recovery import CostModel
from service.failure_sim.trace import Failure, Trace
from workers.runtime.policy.checkpoint_cadence import CheckpointCadence


class Throughput(Protocol):
    tokens_per_s: float
    step_s: float
    job_gpus: int

    def after_loss(self, lost: int) -> tuple[float, bool, int]: ...

    def group_shape(self) -> tuple[int, int, int]: ...


@dataclass
class PolicyResult:
    name: str
    ettr: float
    lost_gpu_hours: float
    recoveries: int
    mean_recovery_s: float
    tokens: float
    events: int
    interval_s: float
    save_s: float
    restart_s: float

    def as_dict(self) -> dict[str, float | int]:
        return {"ettr": round(self.ettr, 5), "lost_gpu_hours": round(self.lost_gpu_hours, 1),
                "recoveries": self.recoveries, "mean_recovery_s": round(self.mean_recovery_s, 2),
                "tokens": float(f"{self.tokens:.6g}")}


@dataclass
class Progress:
    """Tokens trained, committed (saved) and not yet saved, with the position in the save cycle."""

    tau: float
    save_s: float
    tps: float = 0.0
    running: bool = False
    t: float = 0.0
    phase: float = 0.0
    committed: float = 0.0
    unsaved: float = 0.0

    def advance(self, t: float) -> None:
        w = t - self.t
        self.t = t
        if not self.running or w <= 0:
            return
        tau, cyc, tps = self.tau, self.tau + self.save_s, self.tps
        p = self.phase
        if p < tau:  # finish the current work period
            work = min(w, tau - p)
            self.unsaved += tps * work
            p += work
            w -= work
        if w > 0 and p >= tau:  # finish the current save
            s = min(w, cyc - p)
            p += s
            w -= s
            if p >= cyc - 1e-12:
                self.committed += self.unsaved
                self.unsaved = 0.0
                p = 0.0
        if w > 0:
            n = math.floor(w / cyc)
            self.committed += n * tau * tps
            w -= n * cyc
            work = min(w, tau)
            self.unsaved += tps * work
            p = w
        self.phase = p

    def start(self, t: float, tps: float, fresh: bool) -> None:
        self.t, self.tps, self.running = t, tps, True
        if fresh:
            self.phase = 0.0

    def stop(self, t: float) -> None:
        self.advance(t)
        self.running = False

    def lose(self, amount: float | None = None) -> None:
        self.unsaved -= self.unsaved if amount is None else min(self.unsaved, amount)

    def save_all(self) -> None:
        self.committed += self.unsaved
        self.unsaved = 0.0
        self.phase = 0.0


@dataclass
class _Loop:
    policy: Policy
    trace: Trace
    thr: Throughput
    cost: CostModel
    idle_nodes: int
    restart_s: float
    stall_s: float
    switch_horizon_s: float
    save_s: float = 0.0
    heap: list[tuple[float, int, str, int]] = field(default_factory=list)
    seq: int = 0
    version: int = 0
    empty: set[int] = field(default_factory=set)
    pool: int = 0
    down_since: float | None = None
    resume_at: float | None = None
    downtime: float = 0.0
    recoveries: int = 0
    events: int = 0
    lost: int = 0  # job nodes missing from the running shape (re-plan policies)

    def push(self, t: float, kind: str, data: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, data))


def _cadence(trace: Trace, save_s: float, step_s: float) -> CheckpointCadence:
    cad = CheckpointCadence(min_steps=1, max_steps=10**9, prior_mtbf_s=trace.mttf_s if math.isfinite(trace.mttf_s)
                            else trace.horizon_s * 10, default_save_s=save_s)
    cad.observe_step(step_s)
    return cad


def play(policy: Policy, trace: Trace, thr: Throughput, cost: CostModel, *, idle_nodes: int = 0,
         restart_s: float, stall_s: float, save_s: float | None = None, switch_horizon_s: float = 3600.0) -> PolicyResult:
    """Play ``policy`` on ``trace``; ``idle_nodes`` are cluster nodes the plan leaves unused (spares too)."""
    if policy.kind == REPLICA_GROUP or policy.source == "memory":
        save = cost.snapshot_s() if save_s is None else save_s
    else:
        save = cost.save_storage_s() if save_s is None else save_s
    cad = _cadence(trace, save, thr.step_s)
    tau = cad.interval_steps() * thr.step_s
    prog = Progress(tau=tau, save_s=save)
    st = _Loop(policy, trace, thr, cost, idle_nodes, restart_s, stall_s, switch_horizon_s, save_s=save)
    st.pool = idle_nodes + policy.spares
    full = thr.tokens_per_s
    prog.start(0.0, full, fresh=True)
    kind = policy.kind
    _, _, nodes_per_group = thr.group_shape()  # a node failure takes out one unit of whole groups
    units = max(1, trace.slots // nodes_per_group)
    inactive: set[int] = set()
    first_restart = restart_s if kind == RESTART else cost.phases(policy.source).total

    def interrupt(t: float) -> None:
        if prog.running:
            prog.stop(t)
            st.down_since = t
            st.recoveries += 1

    def resume_in(t: float, delay: float) -> None:
        st.version += 1
        st.resume_at = t + delay
        st.push(t + delay, "resume", st.version)

    def fill() -> int:
        n = 0
        while st.pool > 0 and st.empty:
            st.empty.remove(min(st.empty))
            st.pool -= 1
            n += 1
        return n

    def shape_tps() -> tuple[float, bool, int]:
        return thr.after_loss(len(st.empty))

    def unit_tps() -> float:
        return full * (units - len(inactive)) / units

    def observe_failure(t: float) -> None:
        cad.elapsed_s = t
        cad.observe_failure()
        prog.tau = cad.interval_steps() * thr.step_s

    def restart_like(f: Failure) -> None:
        t = f.t
        prog.advance(t)
        was_running = prog.running
        if f.planned:
            prog.save_all()
        else:
            prog.lose()
            observe_failure(t)
        interrupt(t)
        if not was_running and st.down_since is None:
            st.down_since = t
        if f.repair_s > 0:
            st.empty.add(f.slot)
            st.push(t + f.repair_s, "repair")
        fill()
        extra = save if f.planned else 0.0
        if kind == RESTART:
            if st.empty:
                st.version += 1  # wait for a repair
                st.resume_at = None
            else:
                resume_in(t, extra + st.restart_s)
        else:
            tps, changed, gpus = shape_tps()
            if tps <= 0:
                st.version += 1
                st.resume_at = None
                return
            ph = cost.phases(policy.source, reshard=changed or st.lost != len(st.empty), gpus=gpus)
            resume_in(t, extra + (ph.planned() if f.planned else ph.total))

    def replan_grow(t: float) -> None:
        if not st.empty or st.pool <= 0 or not prog.running:
            return
        cur, _, _ = thr.after_loss(st.lost)
        k = min(st.pool, len(st.empty))
        tps, _, gpus = thr.after_loss(len(st.empty) - k)
        switch = save + cost.phases(policy.source, reshard=True, gpus=gpus).planned()
        if tps * max(0.0, st.switch_horizon_s - switch) > cur * st.switch_horizon_s:
            prog.stop(t)
            prog.save_all()
            fill()
            st.down_since = None  # a planned switch: downtime, not a recovery
            resume_in(t, switch)

    def replica_failure(f: Failure) -> None:
        t = f.t
        prog.advance(t)
        unit = f.slot // nodes_per_group
        if not f.planned and unit not in inactive:
            prog.lose(prog.tps * thr.step_s / 2)  # the step in flight
            observe_failure(t)
            was = prog.running
            interrupt(t)
            if not was and st.down_since is None:
                st.down_since = t
            resume_in(t, st.stall_s)
        inactive.add(unit)
        if prog.running:
            prog.stop(t)
            prog.start(t, unit_tps(), fresh=False)
        if f.repair_s > 0:
            st.empty.add(f.slot)
            st.push(t + f.repair_s, "repair")
            fill()
        if not any(s // nodes_per_group == unit for s in st.empty):
            st.push(t + (0.0 if f.planned else st.stall_s) + cost.replica_join_s(), "join", unit)

    def on_repair(t: float) -> None:
        st.pool += 1
        if kind == REPLICA_GROUP:
            before = set(st.empty)
            fill()
            for slot in before - st.empty:
                unit = slot // nodes_per_group
                if not any(s // nodes_per_group == unit for s in st.empty):
                    st.push(t + cost.replica_join_s(), "join", unit)
        elif not prog.running and st.resume_at is None:  # waiting for nodes
            fill()
            if kind == RESTART:
                if not st.empty:
                    resume_in(t, st.restart_s)
            else:
                tps, _, gpus = shape_tps()
                if tps > 0:
                    resume_in(t, cost.phases(policy.source, reshard=True, gpus=gpus).total)
        elif kind != RESTART:
            replan_grow(t)

    def on_resume(t: float) -> None:
        if st.down_since is not None:
            st.downtime += t - st.down_since
        st.down_since = None
        st.resume_at = None
        if kind == REPLICA_GROUP:
            prog.start(t, unit_tps(), fresh=False)
            return
        if kind == RESTART:
            prog.start(t, full, fresh=True)
            return
        st.lost = len(st.empty)
        prog.start(t, shape_tps()[0], fresh=True)
        replan_grow(t)

    def on_join(t: float, unit: int) -> None:
        if unit in inactive and not any(s // nodes_per_group == unit for s in st.empty):
            prog.advance(t)
            inactive.discard(unit)
            if prog.running:
                prog.tps = unit_tps()

    failures = trace.failures
    i = 0
    while True:
        next_f = failures[i].t if i < len(failures) else math.inf
        next_h = st.heap[0][0] if st.heap else math.inf
        t = min(next_f, next_h)
        if t >= trace.horizon_s:
            break
        st.events += 1
        if next_f <= next_h:
            f = failures[i]
            i += 1
            if f.slot in st.empty:
                continue  # no node in that slot now
            if kind == REPLICA_GROUP:
                replica_failure(f)
            else:
                restart_like(f)
            continue
        _, _, what, data = heapq.heappop(st.heap)
        if what == "repair":
            on_repair(t)
        elif what == "resume":
            if data == st.version:
                on_resume(t)
        elif what == "join":
            on_join(t, data)
    end = trace.horizon_s
    prog.advance(end)
    if st.down_since is not None:
        st.downtime += end - st.down_since
    tokens = prog.committed + prog.unsaved
    ettr = tokens / (full * end) if full > 0 and end > 0 else 0.0
    lost_h = thr.job_gpus * end * (1.0 - ettr) / 3600.0
    mean_rec = st.downtime / st.recoveries if st.recoveries else 0.0
    r_nominal = st.stall_s if kind == REPLICA_GROUP else first_restart
    return PolicyResult(policy.name, ettr, lost_h, st.recoveries, mean_rec, tokens, st.events, prog.tau, save,
                        r_nominal)
