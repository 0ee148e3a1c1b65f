"""The recovery cost model, from its one home :mod:`planner.recovery_cost` (the planner prices plans with it
too); the base phases come from this cluster's recorded recoveries (``--calibration cluster``) or the prior."""

from __future__ import annotations

from planner.recovery_cost import (
    BASELINE_RESTART_S,
    PHASES,
    PRIOR,
    PRIOR_PHASES,
    Calibration,
    CostModel,
    Phases,
    calibrate,
)

__all__ = ["BASELINE_RESTART_S", "PHASES", "PRIOR", "PRIOR_PHASES", "Calibration", "CostModel", "Phases",
           "calibrate"]
