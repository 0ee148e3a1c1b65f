"""JobSupervisor: the Ray actor that runs one job attempt (a thin shell around the state machine).

A detached, named Ray actor (``orthoplex-job-{job_id}-a{attempt}``, namespace ``orthoplex``; see
``launch``). ``run()`` drives the attempt's :class:`~workers.runtime.supervision.attempt_machine.AttemptMachine` to an
end in one thread while ``status()``, ``events()``, ``cancel()``, ``preempt()``, ``resize()`` and ``drain()``
answer from others (threaded actor). The control plane *pulls* events, so training goes on while
the service is down.

The supervisor builds the machine over the Ray cluster port (``cluster_port.RayCluster``); only when
started with ``enable_fault_injection`` (tests, the demo, the benchmarks) is that port wrapped in
``faults.FaultInjector``. The machine itself has no fault code.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from workers.runtime.cluster.port import ClusterPort
from workers.runtime.cluster.ray_port import RayCluster
from workers.runtime.cluster.reachability import RayPeerProbe
from workers.runtime.contract.events import EventLog
from workers.runtime.contract.job_spec import JobSpec
from workers.runtime.supervision.attempt_machine import ENDS, AttemptMachine
from workers.testbed.fault_injector import FaultInjector, FaultPlan, parse_faults


class JobSupervisor:
    def __init__(self, job_id: str, attempt: int, job: JobSpec, enable_fault_injection: bool = False):
        """``job``: the spec as ``launch.start_supervisor`` parsed it (parsed once, in the caller)."""
        self.job_id = str(job_id)
        self.attempt = int(attempt)
        self.job = job
        self.settings = self.job.runtime
        self.log = EventLog(self.job.events_out)
        faults = FaultPlan(parse_faults(self.job.faults), enabled=enable_fault_injection)
        port: ClusterPort = RayCluster(self.job.train, self.settings)
        if faults.pending:
            port = FaultInjector(RayCluster(self.job.train, self.settings), faults, self.log)
        self.machine = AttemptMachine(self.job, port, self.log, name=f"orthoplex-{self.job_id}-a{self.attempt}")
        self.machine.peer_probe = RayPeerProbe()  # a partition from some peers only: leave a node out
        self._run_lock = threading.Lock()
        self._summary: dict[str, Any] | None = None
        self._started_at = time.time()
        self._run_called = False

    # ------------------------------------------------------------------ public API
    def run(self) -> dict[str, Any]:
        """Drive the job to an end; idempotent (a second call waits and returns the same summary)."""
        self._run_called = True
        with self._run_lock:
            if self._summary is None:
                self.machine.run()
                self._summary = self._final()
                if self.settings.linger_s > 0:
                    threading.Timer(self.settings.linger_s, _exit_self).start()
            return dict(self._summary)

    def status(self) -> dict[str, Any]:
        m = self.machine
        with m.lock:
            gang = m.gang
            return {
                "job_id": self.job_id,
                "attempt": self.attempt,
                # False until run() arrives: the run() a controller sent right after creating the
                # actor is lost if that controller dies before the actor is alive (the call waits in
                # the dead caller's queue), so a reattaching controller must send it again
                "run_called": self._run_called,
                "state": str(m.state),
                "phase": str(m.phase),
                "next_step": m.next_step,
                "steps": self.job.steps,
                "loss": m.last_loss,
                "layout": gang.layout.short() if gang else None,
                "world_size": gang.world_size if gang else 0,
                "nodes": gang.nodes if gang else [],
                "failures": len(m.failures),
                "recoveries": len(m.recoveries),
                "last_checkpoint_step": m.last_ckpt_step,
                "last_event_seq": self.log.last_seq,
                "cadence": m.cadence.to_dict(),
                "draining": sorted(m.replanner.drained),
            }

    def events(self, since: int = 0) -> list[dict[str, Any]]:
        return self.log.since(since)

    def cancel(self) -> bool:
        self.machine.cancel_requested = True
        return True

    def preempt(self) -> bool:
        self.machine.preempt_requested = True
        return True

    def resize(self, gpus: int, placement: dict[str, int] | None = None) -> dict[str, Any]:
        """Re-plan onto at most ``gpus`` GPUs (on ``placement``: node id -> GPUs, when given) at the next
        step boundary (``AttemptMachine.request_resize``)."""
        return self.machine.request_resize(int(gpus), placement)

    def drain(self, nodes: dict[str, float]) -> dict[str, Any]:
        """The nodes draining now (node id -> seconds to the notice's deadline; the whole set: a node
        left out is undrained): the job moves off them at its next step boundary and keeps out of them
        (``AttemptMachine.request_drain``)."""
        return self.machine.request_drain({str(n): float(d) for n, d in nodes.items()})

    # ------------------------------------------------------------------ summary
    def _final(self) -> dict[str, Any]:
        m = self.machine
        return {
            "job_id": self.job_id,
            "attempt": self.attempt,
            "state": str(ENDS[m.phase]),
            "error": m.error,
            "steps_done": m.next_step,
            "final_loss": m.last_loss,
            "losses": {str(k): v for k, v in sorted(m.losses.items())},
            "plans": [{"short": p.layout.short(), "layout": p.layout.to_dict(), "num_gpus": p.num_gpus, "ts": ts}
                      for p, ts in m.replanner.plans],
            "failures": list(m.failures),
            "recoveries": list(m.recoveries),
            "last_checkpoint_step": m.last_ckpt_step,
            "wall_s": round(time.time() - self._started_at, 3),
            # replica groups: per group its node, actor pids, committed and aborted steps, healed_from
            "replicas": m.replicas.summary() if m.replicas is not None else None,
            "step_attempts": {str(k): v for k, v in sorted(m.step_attempts.items())},
        }


def _exit_self() -> None:
    """A finished detached supervisor that nobody collected goes away on its own (``linger_s``)."""
    import ray

    ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
