"""Start, find and stop JobSupervisor actors (detached, named after the job attempt).

``start_supervisor`` creates ``orthoplex-job-{job_id}-a{attempt}`` in namespace ``orthoplex`` and
kicks off ``run()``; calling it again for the same attempt returns the existing actor (a restarted
control plane finds its supervisors by name with ``find_supervisor``). The supervisor is pinned to
the head node when the cluster has one, so losing a worker node never takes the job's brain with it.
"""

from __future__ import annotations

import time
from typing import Any

NAMESPACE = "orthoplex"


def supervisor_name(job_id: str, attempt: int) -> str:
    return f"orthoplex-job-{job_id}-a{int(attempt)}"


def _head_resource() -> dict[str, float]:
    import ray

    from workers.runtime.cluster.placement_groups import HEAD_RESOURCE

    for n in ray.nodes():
        if n.get("Alive") and HEAD_RESOURCE in n.get("Resources", {}):
            return {HEAD_RESOURCE: 0.001}
    return {}


def start_supervisor(job_id: str, attempt: int, spec: dict[str, Any], *,
                     enable_fault_injection: bool = False) -> Any:
    """Create (or get) the attempt's supervisor and start ``run()``; returns the ActorHandle.

    The spec is parsed here, once (a bad one fails fast, in the caller, with ``ValueError``); the
    supervisor receives the parsed :class:`~workers.runtime.contract.job_spec.JobSpec` and never
    parses it again. ``enable_fault_injection`` is the explicit test/demo hook that lets
    ``spec["faults"]`` fire; without it a spec with faults is refused.
    """
    import ray

    from workers.runtime.contract.job_spec import parse_job
    from workers.runtime.supervision.supervisor import JobSupervisor

    job = parse_job(spec)  # the one parse: fail fast, in the caller, on a bad spec
    existing = find_supervisor(job_id, attempt)
    if existing is not None:
        return existing
    cls = ray.remote(JobSupervisor)
    handle = cls.options(
        name=supervisor_name(job_id, attempt),
        namespace=NAMESPACE,
        lifetime="detached",
        num_cpus=0,
        max_concurrency=16,
        max_restarts=0,
        resources=_head_resource(),
    ).remote(str(job_id), int(attempt), job, enable_fault_injection)
    handle.run.remote()
    _wait_registered(job_id, attempt)
    return handle


def _wait_registered(job_id: str, attempt: int, timeout_s: float = 30.0) -> None:
    """Return once the GCS knows the actor by name. Creating an actor is asynchronous: a caller that
    dies right after ``.remote()`` (a controller killed after recording "started") could otherwise
    leave no actor at all, although it returned as if one existed."""
    deadline = time.monotonic() + timeout_s
    while find_supervisor(job_id, attempt) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"supervisor {supervisor_name(job_id, attempt)} not registered in {timeout_s:.0f}s")
        time.sleep(0.02)


def find_supervisor(job_id: str, attempt: int) -> Any | None:
    """The attempt's supervisor if it is alive, else ``None``."""
    import ray

    try:
        return ray.get_actor(supervisor_name(job_id, attempt), namespace=NAMESPACE)
    except ValueError:
        return None


def stop_supervisor(job_id: str, attempt: int, *, cancel_timeout_s: float = 30.0) -> bool:
    """Cancel the job if it still runs (its gang is torn down), then kill the supervisor actor."""
    import ray

    handle = find_supervisor(job_id, attempt)
    if handle is None:
        return False
    try:
        ray.get(handle.cancel.remote(), timeout=cancel_timeout_s)
        ray.get(handle.run.remote(), timeout=cancel_timeout_s)
    except Exception:  # already dead or stuck: the kill below still ends it
        pass
    ray.kill(handle, no_restart=True)
    return True
