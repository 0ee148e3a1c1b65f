"""What every step of the controller shares: the database, the lease, the supervisors, the knobs.

:meth:`Ctx.txn` is the only way the controller writes: one transaction that first checks, inside
itself, that this replica still holds the controller lease (:meth:`LeaderLease.guard`), then lets
the caller make its compare-and-set writes (``service.db.transitions`` with ``commit=False``), then
commits. A replica that lost the lease raises :class:`~service.controller.lease.LeaseLost` before
writing anything.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from service.controller.lease import LeaderLease
from service.controller.supervisors import AttemptKey, Supervisors
from service.db.session import make_sessionmaker
from workers import object_store


@dataclass
class ControllerConfig:
    """Knobs of the controller (defaults suit production; tests shorten the times)."""

    tick_s: float = 1.0
    lease_ttl_s: float = 10.0
    max_attempts: int = 3
    call_timeout_s: float = 10.0
    #: after ``cancel()``, how long to wait for the supervisor's own ``cancelled`` before forcing it
    cancel_grace_s: float = 30.0
    #: whether the scheduler may grow and shrink running elastic jobs (supervisors re-plan onto the
    #: new GPU count with ``resize``); off: a ``min..max`` job is sized once, at admission
    runtime_resizes: bool = True
    storage_path: Path | str = Path("/tmp/orthoplex-storage")  # a str: an object-store URL (s3://...)
    #: read-only data roots by name, and the bounds of one job's data (``workers.data_area``)
    shared_data_roots: dict[str, Path] = field(default_factory=dict)
    data_max_files: int = 10_000
    data_max_bytes: int = 16 << 30
    #: MLflow tracking URI of jobs that name none (``ORTHOPLEX_MLFLOW_TRACKING_URI``; None: TensorBoard only)
    mlflow_tracking_uri: str | None = None
    #: extra keys merged into every supervisor spec (e.g. a fault-injection hook in tests/demos)
    spec_overrides: dict[str, object] = field(default_factory=dict)


@dataclass
class Ctx:
    engine: sa.Engine
    lease: LeaderLease
    sups: Supervisors
    config: ControllerConfig
    sessions: sessionmaker[Session] = field(init=False)
    #: last runtime seq stored per attempt (loaded from the DB on first use)
    cursors: dict[AttemptKey, int] = field(default_factory=dict)
    #: attempts this controller already asked to preempt / cancel (asked again after a restart)
    preempting: set[AttemptKey] = field(default_factory=set)
    cancelling: dict[AttemptKey, float] = field(default_factory=dict)
    #: the draining nodes each attempt's supervisor was told (``drains``): told again when they change
    drains_told: dict[AttemptKey, frozenset[str]] = field(default_factory=dict)
    #: the last decision recorded per job (kind, gpus, reason): a decision is stored when it changes
    decided: dict[int, tuple[str, int | None, str]] = field(default_factory=dict)
    #: the GPU profile the runtime and the goodput curves plan on (``ORTHOPLEX_GPU_TYPE``, ``_GPUS_PER_NODE``)
    gpu_type: str = "CPU"
    gpus_per_node: int = 4
    #: the planner's goodput curve per elastic job (``None``: none, linear), computed once per job
    curves: dict[int, dict[int, float] | None] = field(default_factory=dict)
    #: each live job's recovery on its best plan at max_gpus (``service.recovery.job_recovery``, a
    #: ``RecoveryChoice.to_dict()``), computed once per job: the scheduler's whole groups, the attempts' choice
    recoveries: dict[int, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.sessions = make_sessionmaker(self.engine)

    @contextmanager
    def txn(self) -> Iterator[Session]:
        """A lease-guarded transaction: commits on success, rolls back on any error."""
        with self.sessions() as session:
            try:
                self.lease.guard(session)
                yield session
                session.commit()
            except BaseException:
                session.rollback()
                raise

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A read-only session (no lease needed)."""
        with self.sessions() as session:
            yield session

    def job_storage(self, job_id: int) -> Path | str:
        """Where a job's checkpoints live: shared by all its attempts, so a new one resumes (a URL
        when the storage path is an object store)."""
        return object_store.under(self.config.storage_path, "jobs", str(job_id))
