"""The request and response types of the REST API: the API's own pydantic models, re-exported
from the modules the server validates and answers with (``service.api.schemas``, and the data and
artifact routes), so the client and the server cannot drift. :class:`Job` adds only a readable
``repr`` to the server's :class:`JobPublic`."""

from __future__ import annotations

from service.api.routes.artifacts import ArtifactFile, Artifacts
from service.api.routes.data import DataFile, DataList
from service.api.schemas import (
    CheckpointSpec,
    ClusterOut,
    DataSpec,
    EventPublic,
    ExportSpec,
    HFModel,
    JobList,
    JobPublic,
    JobSpec,
    JobStateName,
    LayoutHint,
    MetricPublic,
    ModelShape,
    NodeDrainIn,
    NodeDrainOut,
    PlanOut,
    RecoverySpec,
    SnapshotsSpec,
    TenantCreate,
    TenantList,
    TenantPublic,
    TenantUpdate,
    TokenCreate,
    TokenCreated,
    TrackingSpec,
)
from workers.states import TERMINAL, JobState

__all__ = [
    "TERMINAL",
    "ArtifactFile",
    "Artifacts",
    "CheckpointSpec",
    "ClusterOut",
    "DataFile",
    "DataList",
    "DataSpec",
    "Event",
    "EventPublic",
    "ExportSpec",
    "HFModel",
    "Job",
    "JobList",
    "JobPublic",
    "JobSpec",
    "JobState",
    "JobStateName",
    "LayoutHint",
    "Metric",
    "MetricPublic",
    "ModelShape",
    "NodeDrainIn",
    "NodeDrainOut",
    "PlanOut",
    "RecoverySpec",
    "SnapshotsSpec",
    "TenantCreate",
    "TenantList",
    "TenantPublic",
    "TenantUpdate",
    "TokenCreate",
    "TokenCreated",
    "TrackingSpec",
]

#: short names for the SDK's users
Event = EventPublic
Metric = MetricPublic


class Job(JobPublic):
    """A job as the API returns it (:class:`JobPublic`), with a one-line ``repr``."""

    @property
    def ended(self) -> bool:
        """True once the job is SUCCEEDED, FAILED or CANCELLED."""
        return self.state in TERMINAL

    def __repr__(self) -> str:
        parts = [f"id={self.id}", f"name={self.name!r}", f"state={self.state}"]
        steps = self.spec.get("steps")
        if self.final_step is not None or self.ended:
            parts.append(f"step={self.final_step or 0}/{steps}")
        else:
            parts.append(f"steps={steps}")
        parts.append(f"gpus={self.gpus_allocated} ({self.min_gpus}..{self.max_gpus})")
        if self.final_loss is not None:
            parts.append(f"final_loss={self.final_loss:.4f}")
        if self.cancel_requested and not self.ended:
            parts.append("cancel_requested")
        if self.reason:
            parts.append(f"reason={self.reason[:80]!r}")
        return f"Job({', '.join(parts)})"

    __str__ = __repr__

    def _repr_pretty_(self, p: object, cycle: bool) -> None:  # IPython / Jupyter
        p.text(repr(self))  # type: ignore[attr-defined]
