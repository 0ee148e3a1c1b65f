"""Re-export of :mod:`planner.recovery_names` (the names' one home) for the runtime's older imports."""

from __future__ import annotations

from planner.recovery_names import (
    POLICY_NAMES,
    REPLAN_MEMORY,
    REPLAN_STORAGE,
    REPLICA_GROUP,
    RESTART,
    RUNTIME_POLICIES,
    SOURCES,
    check_name,
)

__all__ = ["POLICY_NAMES", "REPLAN_MEMORY", "REPLAN_STORAGE", "REPLICA_GROUP", "RESTART", "RUNTIME_POLICIES",
           "SOURCES", "check_name"]
