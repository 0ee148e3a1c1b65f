"""The failure causes and their rates, from their one home :mod:`planner.failure_rates` (the planner prices
plans with them too)."""

from __future__ import annotations

from planner.failure_rates import (
    HOUR,
    LLAMA3_CAUSES,
    LLAMA3_DAYS,
    LLAMA3_GPUS,
    LLAMA3_GPUS_PER_NODE,
    PLANNED,
    RATE_SETS,
    RSC_FAILURES_PER_NODE_DAY,
    Cause,
    node_rates,
    planned_per_node_day,
    rate_scale,
    unexpected_per_node_day,
)

__all__ = ["HOUR", "LLAMA3_CAUSES", "LLAMA3_DAYS", "LLAMA3_GPUS", "LLAMA3_GPUS_PER_NODE", "PLANNED", "RATE_SETS",
           "RSC_FAILURES_PER_NODE_DAY", "Cause", "node_rates", "planned_per_node_day", "rate_scale",
           "unexpected_per_node_day"]
