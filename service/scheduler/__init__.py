"""The multi-tenant gang scheduler: a pure policy (``policy.decide``) and an offline simulator.

No database, Ray or FastAPI imports: the controller builds a ``ClusterSnapshot`` and applies the
decisions; ``workload_sim`` drives the same ``decide`` over a synthetic workload (not the failure
simulator of one job, ``service.failure_sim``).
"""

from service.scheduler.policy import decide
from service.scheduler.types import (
    Admit,
    ClusterSnapshot,
    Decision,
    Grow,
    JobState,
    JobView,
    NodeView,
    Preempt,
    Shrink,
    TenantView,
    Wait,
)

__all__ = [
    "Admit",
    "ClusterSnapshot",
    "Decision",
    "Grow",
    "JobState",
    "JobView",
    "NodeView",
    "Preempt",
    "Shrink",
    "TenantView",
    "Wait",
    "decide",
]
