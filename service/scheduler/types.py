"""Inputs and outputs of the scheduler policy: frozen, stdlib-only dataclasses.

The control plane (``service/controller``) builds a :class:`ClusterSnapshot` from the database and
the cluster view; :func:`service.scheduler.policy.decide` turns it into a list of decisions
(:class:`Admit`, :class:`Grow`, :class:`Shrink`, :class:`Preempt`, :class:`Wait`). Nothing here
imports the database, Ray or FastAPI.

Ids: tenant and job ids are ``int`` or ``str`` (the database uses ints), node ids are ``str``. All
ids of one kind in a snapshot must share one type, because ties are broken by comparing ids.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, TypeAlias

from workers.states import JobState

Id: TypeAlias = int | str
NodeId: TypeAlias = str


def _copy(value: Mapping | None) -> dict:
    return dict(value or {})


@dataclass(frozen=True)
class TenantView:
    """A tenant: ``gpu_quota`` GPUs are guaranteed, ``weight`` sets its fair share of the rest.

    ``max_jobs`` caps the tenant's admitted (active) jobs; ``None`` means no cap.
    """

    id: Id
    name: str = ""
    gpu_quota: int = 0
    weight: float = 1.0
    max_jobs: int | None = None

    def __post_init__(self) -> None:
        if self.gpu_quota < 0:
            raise ValueError(f"tenant {self.id!r}: gpu_quota must be >= 0, got {self.gpu_quota}")
        if not (self.weight > 0 and math.isfinite(self.weight)):
            raise ValueError(f"tenant {self.id!r}: weight must be a positive number, got {self.weight}")
        if self.max_jobs is not None and self.max_jobs < 0:
            raise ValueError(f"tenant {self.id!r}: max_jobs must be >= 0, got {self.max_jobs}")


@dataclass(frozen=True)
class JobView:
    """A job as the scheduler sees it.

    - ``state``: a :class:`JobState` value. PENDING jobs are queued; ADMITTED/RUNNING/RECOVERING
      hold ``allocated``; PREEMPTED jobs still hold ``allocated`` while they checkpoint (those GPUs
      count as *being released*); finished jobs are ignored.
    - ``allocated``: GPUs held per node id (empty for a pending job).
    - ``max_gpus``: ``None`` means ``min_gpus`` (a fixed-size job).
    - ``elastic``: the job may be grown or shrunk at run time within ``min_gpus..max_gpus`` (a shrink
      or grow is a checkpoint and a re-plan). A non-elastic job with a range gets its size once, at
      admission.
    - ``preemptible``: the job may be preempted to give borrowed GPUs back. A non-preemptible job
      never borrows: it is admitted only within its tenant's quota.
    - ``throughput``: the planner's predicted tokens/s for GPU counts (e.g. ``{8: 1.0e5, 16: 1.9e5}``);
      ``None`` means linear scaling. When given, the job is only sized to counts in the curve (plus
      ``min_gpus`` and ``max_gpus``), so the planner decides which sizes are TP/PP-friendly.
    - ``started_at``: when it was admitted (ties among preemption victims: most recent first).
    - ``est_end`` (running jobs) and ``est_duration`` (pending jobs): optional run-time estimates, on
      the clock of ``ClusterSnapshot.now``, used only for backfill.
    """

    id: Id
    tenant_id: Id
    state: str = JobState.PENDING
    priority: int = 0
    min_gpus: int = 1
    max_gpus: int | None = None
    submitted_at: float = 0.0
    allocated: Mapping[NodeId, int] = field(default_factory=dict)
    preemptible: bool = True
    elastic: bool = True
    throughput: Mapping[int, float] | None = None
    started_at: float | None = None
    est_end: float | None = None
    est_duration: float | None = None

    def __post_init__(self) -> None:
        if self.min_gpus < 1:
            raise ValueError(f"job {self.id!r}: min_gpus must be >= 1, got {self.min_gpus}")
        if self.max_gpus is None:
            object.__setattr__(self, "max_gpus", self.min_gpus)
        elif self.max_gpus < self.min_gpus:
            raise ValueError(f"job {self.id!r}: max_gpus {self.max_gpus} < min_gpus {self.min_gpus}")
        if any(v < 0 for v in self.allocated.values()):
            raise ValueError(f"job {self.id!r}: negative allocation {dict(self.allocated)}")
        object.__setattr__(self, "allocated", {k: v for k, v in self.allocated.items() if v})
        if self.throughput is not None:
            bad = [n for n, v in self.throughput.items() if n < 0 or not math.isfinite(v) or v < 0]
            if bad:
                raise ValueError(f"job {self.id!r}: throughput curve has invalid points at {sorted(bad)}")
            object.__setattr__(self, "throughput", _copy(self.throughput))

    @property
    def held(self) -> int:
        """GPUs in ``allocated`` over all nodes."""
        return sum(self.allocated.values())


@dataclass(frozen=True)
class NodeView:
    """A node with ``gpus`` GPUs. ``free_gpus=None`` derives it from the jobs' allocations; a given
    value can only lower it (GPUs held by something the scheduler does not know about).
    ``draining``: an operator drains it (``POST /v1/cluster/nodes/{node}/drain``): no new work is
    placed on it (no GPU of it is free); the jobs still on it keep what they hold while they move off."""

    id: NodeId
    gpus: int
    free_gpus: int | None = None
    healthy: bool = True
    draining: bool = False

    def __post_init__(self) -> None:
        if self.gpus < 0:
            raise ValueError(f"node {self.id!r}: gpus must be >= 0, got {self.gpus}")


@dataclass(frozen=True)
class ClusterSnapshot:
    """Everything :func:`decide` looks at. ``now`` is used only to compare with run-time estimates."""

    tenants: tuple[TenantView, ...] | list[TenantView]
    jobs: tuple[JobView, ...] | list[JobView]
    nodes: tuple[NodeView, ...] | list[NodeView]
    now: float = 0.0


# --------------------------------------------------------------------------------------- decisions


@dataclass(frozen=True)
class Admit:
    """Start a pending job with ``gpus`` GPUs laid out as ``placement`` (node id -> GPUs)."""

    job_id: Id
    gpus: int
    placement: Mapping[NodeId, int]
    reason: str
    kind: ClassVar[str] = "admit"


@dataclass(frozen=True)
class Grow:
    """Re-plan a running elastic job onto more GPUs: ``placement`` is the whole new layout, ``added``
    the GPUs it gains (all free now)."""

    job_id: Id
    gpus: int
    placement: Mapping[NodeId, int]
    added: Mapping[NodeId, int]
    reason: str
    kind: ClassVar[str] = "grow"


@dataclass(frozen=True)
class Shrink:
    """Checkpoint a running elastic job and re-plan it onto ``placement`` (a subset of what it holds);
    ``released`` are the GPUs it gives back. Not a kill."""

    job_id: Id
    gpus: int
    placement: Mapping[NodeId, int]
    released: Mapping[NodeId, int]
    reason: str
    kind: ClassVar[str] = "shrink"


@dataclass(frozen=True)
class Preempt:
    """Checkpoint the job, stop it and requeue it (RUNNING -> PREEMPTED -> PENDING)."""

    job_id: Id
    reason: str
    kind: ClassVar[str] = "preempt"


@dataclass(frozen=True)
class Wait:
    """The pending job stays queued this round."""

    job_id: Id
    reason: str
    kind: ClassVar[str] = "wait"


Decision: TypeAlias = Admit | Grow | Shrink | Preempt | Wait
