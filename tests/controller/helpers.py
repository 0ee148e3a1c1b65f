"""Helpers of the controller and e2e tests: seed rows, read the job store, run controller processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from service.db.models import Attempt, Checkpoint, Event, Job, Metric, Tenant

REPO = Path(__file__).resolve().parents[2]

#: runtime settings that keep a tiny job quick on a loaded 2-core machine
FAST_RUNTIME: dict[str, Any] = {
    "placement_timeout_s": 20.0,
    "placement_retry_s": 1.0,
    "hang_timeout_s": 60.0,
    "heartbeat_s": 1.0,
    "heartbeat_timeout_s": 30.0,
    "node_confirm_s": 3.0,
    "start_timeout_s": 240.0,
}


#: the controller's spec overrides in the service tests: FAST_RUNTIME and one warm rank per node. The
#: product's default is ``auto`` (a node's worth: what the recovery benchmark measures); these tests
#: check structure, and on CI's 2 cores every warm rank is a torch import
SERVICE_RUNTIME: dict[str, Any] = {**FAST_RUNTIME, "warm_ranks_per_node": 1}


def tiny_spec(steps: int, *, every: int = 2, **extra: Any) -> dict[str, Any]:
    """A declarative spec of the tiny model that checkpoints every ``every`` steps. One gang that
    re-plans (``recovery: replan``) unless ``extra`` names another recovery: the controller's tests
    follow a gang's placement, resizes and moves, and ``auto`` would make a tiny job on 2+ GPUs
    replica groups (their control-plane side: tests/controller/test_recovery_groups.py)."""
    spec: dict[str, Any] = {
        "model": "tiny",
        "steps": steps,
        "global_batch": 4,
        "seed": 7,
        "checkpoint": {"min_every_steps": every, "max_every_steps": every},
        "recovery": {"policy": "replan"},
    }
    spec.update(extra)
    if spec["recovery"] is None:  # recovery=None: no recovery options (the service's defaults, auto)
        del spec["recovery"]
    return spec


def wait_for(cond: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.25) -> Any:
    """Poll ``cond`` until it returns something truthy; fail with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)


def add_tenant(engine: sa.Engine, name: str, quota: int = 4, weight: float = 1.0) -> int:
    with engine.begin() as conn:
        return int(
            conn.execute(
                sa.insert(Tenant).values(name=name, gpu_quota=quota, weight=weight).returning(Tenant.id)
            ).scalar_one()
        )


def add_job(
    engine: sa.Engine,
    tenant_id: int,
    name: str,
    spec: dict[str, Any],
    gpus: int,
    priority: int = 0,
    *,
    max_gpus: int | None = None,
) -> int:
    """A PENDING job as the API stores it (with its ``submitted`` event); ``gpus..max_gpus``."""
    with engine.begin() as conn:
        job_id = int(
            conn.execute(
                sa.insert(Job)
                .values(
                    tenant_id=tenant_id,
                    name=name,
                    spec=spec,
                    state="PENDING",
                    reason="submitted",
                    priority=priority,
                    min_gpus=gpus,
                    max_gpus=max_gpus or gpus,
                    event_seq=1,
                )
                .returning(Job.id)
            ).scalar_one()
        )
        conn.execute(
            sa.insert(Event).values(job_id=job_id, source="control", seq=1, type="submitted", payload={})
        )
    return job_id


def job(engine: sa.Engine, job_id: int) -> Any:
    with engine.connect() as conn:
        return conn.execute(sa.select(Job.__table__).where(Job.id == job_id)).one()


def state(engine: sa.Engine, job_id: int) -> str:
    """The job's state; a FAILED job fails the test at once (no test here expects one)."""
    row = job(engine, job_id)
    assert row.state != "FAILED", f"job {job_id} FAILED: {row.reason}"
    return str(row.state)


def attempts(engine: sa.Engine, job_id: int) -> list[Any]:
    with engine.connect() as conn:
        q = sa.select(Attempt.__table__).where(Attempt.job_id == job_id).order_by(Attempt.epoch)
        return list(conn.execute(q))


def events(
    engine: sa.Engine, job_id: int, *, source: str | None = None, type_: str | None = None
) -> list[Any]:
    q = sa.select(Event.__table__).where(Event.job_id == job_id)
    if source is not None:
        q = q.where(Event.source == source)
    if type_ is not None:
        q = q.where(Event.type == type_)
    with engine.connect() as conn:
        return list(conn.execute(q.order_by(Event.id)))


def transitions_to(engine: sa.Engine, job_id: int, new: str) -> list[Any]:
    return [
        e
        for e in events(engine, job_id, source="control")
        if e.type in ("transition", "attempt_started") and e.payload.get("to") == new
    ]


def metrics(engine: sa.Engine, job_id: int) -> list[Any]:
    with engine.connect() as conn:
        q = sa.select(Metric.__table__).where(Metric.job_id == job_id).order_by(Metric.step, Metric.epoch)
        return list(conn.execute(q))


def checkpoints(engine: sa.Engine, job_id: int) -> list[Any]:
    with engine.connect() as conn:
        q = sa.select(Checkpoint.__table__).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step)
        return list(conn.execute(q))


def live_supervisors(job_id: int, up_to_attempt: int = 6) -> list[int]:
    """Attempt numbers of this job whose supervisor actor exists right now."""
    from workers.runtime.supervision.launch import find_supervisor

    return [a for a in range(1, up_to_attempt + 1) if find_supervisor(job_id, a) is not None]


class ControllerProcess:
    """``python -m service.controller`` in its own process (a service replica's controller)."""

    def __init__(
        self,
        db_url: str,
        ray_address: str,
        storage: Path,
        log_path: Path,
        *,
        holder: str,
        crash_at: str | None = None,
        tick_s: float = 0.5,
        lease_ttl_s: float = 3.0,
        spec_overrides: dict[str, Any] | None = None,
    ) -> None:
        import json

        env = dict(os.environ)
        env.update(
            {
                "ORTHOPLEX_DATABASE_URL": db_url,
                "ORTHOPLEX_RAY_ADDRESS": ray_address,
                "ORTHOPLEX_STORAGE_PATH": str(storage),
                "ORTHOPLEX_CONTROLLER_TICK_S": str(tick_s),
                "ORTHOPLEX_CONTROLLER_LEASE_TTL_S": str(lease_ttl_s),
                "ORTHOPLEX_CONTROLLER_HOLDER": holder,
                "ORTHOPLEX_CONTROLLER_SPEC_OVERRIDES": json.dumps(
                    spec_overrides or {"runtime": SERVICE_RUNTIME}
                ),
                "ORTHOPLEX_LOG_FORMAT": "console",
            }
        )
        env.pop("ORTHOPLEX_CONTROLLER_CRASH_AT", None)
        if crash_at:
            env["ORTHOPLEX_CONTROLLER_CRASH_AT"] = crash_at
        self.holder = holder
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service.controller"],
            cwd=REPO,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill9(self) -> None:
        if self.alive:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.wait()

    def wait(self, timeout_s: float = 60) -> int:
        rc = self.proc.wait(timeout=timeout_s)
        self._log.close()
        return rc

    def stop(self) -> None:
        if self.alive:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.wait()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


class GpuHog:
    """A placement group holding idle GPUs on chosen nodes: "other tenants' work" on the cluster,
    to make GPUs scarce (``leave_free`` of the free GPUs on ``nodes`` stay free).
    """

    def __init__(self, nodes: list[str], leave_free: int) -> None:
        import ray
        from ray.util import placement_group

        from workers.runtime.cluster.placement_groups import NODE_ID_LABEL

        free = {n.node_id: n.gpus_free for n in _view().alive_nodes if n.node_id in nodes}
        count = max(0, sum(free.values()) - leave_free)
        self.pg = None
        if count:
            selector = {NODE_ID_LABEL: f"in({','.join(sorted(free))})"}
            self.pg = placement_group(
                [{"GPU": 1.0} for _ in range(count)],
                strategy="PACK",
                name="test-gpu-hog",
                bundle_label_selector=[dict(selector) for _ in range(count)],
            )
            ray.get(self.pg.ready(), timeout=60)
        self.count = count

    def release(self) -> None:
        from ray.util import remove_placement_group

        if self.pg is not None:
            remove_placement_group(self.pg)
            self.pg = None


def gpus_held_on(node_id: str) -> int:
    """GPUs that placement groups hold on ``node_id`` (what its death sends looking for a new home)."""
    return sum(a.gpus for n in _view().alive_nodes if n.node_id == node_id for a in n.allocations)


def _view() -> Any:
    from service.controller.cluster import cluster_view

    return cluster_view()
