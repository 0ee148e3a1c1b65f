"""Failure causes, their rates and repair times: the one home of the named failure-rate tables.

The planner (goodput-aware plans, :mod:`planner.goodput`) and the failure simulator
(``service.failure_sim``) both read them. A table is named (``llama3``, ``rsc``) or, for ``cluster``,
given as numbers the service measured (node losses per node-day in its event store):
:func:`resolve` turns either into a :class:`FailureRates`.

Counts are Llama 3's (Dubey et al. 2024, "The Llama 3 Herd of Models", §3.3.4, Table 5): 419
unexpected interruptions in a 54-day snapshot of pre-training on 16,384 H100 GPUs (2,048 nodes of 8),
plus 47 planned ones. A cause is counted per GPU-day when it lives in one GPU (the GPU itself, its
memories, its system processor, its thermal interface, silent data corruption), per node-day when
it lives in the host, its network or its software (one bad NIC or one crashing rank stops the whole
node's ranks either way). Rates are those counts divided by the exposure of that snapshot.

Repair times are assumptions (no source publishes them per cause): see docs/goodput.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

LLAMA3_GPUS = 16_384
LLAMA3_GPUS_PER_NODE = 8
LLAMA3_DAYS = 54.0
LLAMA3_PLANNED = 47
#: Meta RSC ("Revisiting Reliability in Large-Scale Machine Learning Research Clusters",
#: arXiv 2410.21680): 6.5 job-interrupting failures per 1000 node-days (RSC-1).
RSC_FAILURES_PER_NODE_DAY = 6.5 / 1000.0
HOUR = 3600.0


@dataclass(frozen=True)
class Cause:
    """One failure cause: its Llama 3 count, unit of exposure and the mean repair time of the node."""

    name: str
    count: int
    per: str  # "gpu" or "node"
    repair_h: float  # mean hours the node is out; 0 = the job restarts on the same node

    def rate_per_unit_day(self) -> float:
        units = LLAMA3_GPUS if self.per == "gpu" else LLAMA3_GPUS // LLAMA3_GPUS_PER_NODE
        return self.count / (units * LLAMA3_DAYS)


# name, Llama 3 count, unit, mean repair hours (assumption)
LLAMA3_CAUSES: tuple[Cause, ...] = (
    Cause("faulty_gpu", 148, "gpu", 12.0),
    Cause("hbm3", 72, "gpu", 12.0),
    Cause("software_bug", 54, "node", 0.0),
    Cause("network_switch_cable", 35, "node", 4.0),
    Cause("host_maintenance", 32, "node", 4.0),
    Cause("sram", 19, "gpu", 12.0),
    Cause("gpu_system_processor", 17, "gpu", 12.0),
    Cause("nic", 7, "node", 6.0),
    Cause("nccl_watchdog", 7, "node", 0.0),
    Cause("silent_data_corruption", 6, "gpu", 12.0),
    Cause("thermal", 6, "gpu", 12.0),
    Cause("ssd", 3, "node", 6.0),
    Cause("power_supply", 3, "node", 6.0),
    Cause("chassis", 2, "node", 24.0),
    Cause("io_board", 2, "node", 24.0),
    Cause("dependency", 2, "node", 0.0),
    Cause("system_memory", 2, "node", 6.0),
    Cause("cpu", 2, "node", 24.0),
)
PLANNED = Cause("planned_maintenance", LLAMA3_PLANNED, "node", 2.0)
RATE_SETS = ("llama3", "rsc")
#: what a planner spec's ``failure_rates`` may name (``cluster`` arrives as numbers, see :func:`resolve`)
FAILURE_RATE_NAMES = (*RATE_SETS, "cluster")


def unexpected_per_node_day(gpus_per_node: int) -> float:
    """Expected unexpected failures per node-day at Llama 3's rates for a node of ``gpus_per_node``."""
    return sum(c.rate_per_unit_day() * (gpus_per_node if c.per == "gpu" else 1) for c in LLAMA3_CAUSES)


def rate_scale(rates: str, gpus_per_node: int) -> float:
    """Factor on every unexpected cause: 1 for ``llama3``; for ``rsc`` the factor that makes the total
    6.5 per 1000 node-days with Llama 3's mix of causes."""
    if rates == "llama3":
        return 1.0
    if rates == "rsc":
        return RSC_FAILURES_PER_NODE_DAY / unexpected_per_node_day(gpus_per_node)
    raise ValueError(f"rates: unknown rate set {rates!r}; choose from {', '.join(RATE_SETS)}")


def node_rates(gpus_per_node: int, rates: str = "llama3") -> list[tuple[Cause, float]]:
    """(cause, failures per node-day) for every unexpected cause."""
    scale = rate_scale(rates, gpus_per_node)
    return [(c, c.rate_per_unit_day() * (gpus_per_node if c.per == "gpu" else 1) * scale) for c in LLAMA3_CAUSES]


def planned_per_node_day() -> float:
    return PLANNED.rate_per_unit_day()


def mean_repair_s(gpus_per_node: int, rates: str = "llama3") -> float:
    """Mean time a failed node is out, weighted by the causes' rates (0 for a software cause)."""
    pairs = node_rates(gpus_per_node, rates)
    total = sum(r for _, r in pairs)
    return sum(c.repair_h * HOUR * r for c, r in pairs) / total if total > 0 else 0.0


@dataclass(frozen=True)
class FailureRates:
    """Per node-day rates a plan is priced with; ``source`` says where they come from."""

    name: str  # llama3 | rsc | cluster
    unexpected_per_node_day: float
    planned_per_node_day: float
    mean_repair_s: float
    source: str

    def job_mttf_s(self, nodes: int) -> float:
        """Mean time between unexpected failures of a job on ``nodes`` nodes."""
        rate = self.unexpected_per_node_day * max(1, nodes)
        return 86_400.0 / rate if rate > 0 else math.inf

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "unexpected_per_node_day": self.unexpected_per_node_day,
                "planned_per_node_day": self.planned_per_node_day, "mean_repair_s": self.mean_repair_s,
                "source": self.source}


def named(rates: str, gpus_per_node: int) -> FailureRates:
    """The rates of a named table for nodes of ``gpus_per_node`` GPUs."""
    scale = rate_scale(rates, gpus_per_node)  # raises on an unknown name
    src = ("Llama 3 paper §3.3.4 Table 5 (419 interruptions, 54 days, 16,384 H100)" if rates == "llama3" else
           "Meta RSC-1, arXiv 2410.21680: 6.5 failures per 1000 node-days, Llama 3's mix of causes")
    return FailureRates(rates, unexpected_per_node_day(gpus_per_node) * scale, planned_per_node_day(),
                        mean_repair_s(gpus_per_node, rates), src)


def resolve(value: str | Mapping[str, Any], gpus_per_node: int) -> FailureRates:
    """``value``: a table's name, or the numbers of ``cluster`` (``{"name": "cluster",
    "node_failures_per_node_day": x, "node_days": n}``; repairs and planned maintenance keep Llama 3's)."""
    if isinstance(value, str):
        if value == "cluster":
            raise ValueError("failure_rates: 'cluster' must be resolved into numbers by the service "
                             "(node losses per node-day in its event store) before planning")
        if value not in RATE_SETS:
            raise ValueError(f"failure_rates: unknown table {value!r}; choose from {', '.join(FAILURE_RATE_NAMES)}")
        return named(value, gpus_per_node)
    rate = value.get("node_failures_per_node_day")
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not math.isfinite(rate) or rate < 0:
        raise ValueError(f"failure_rates.node_failures_per_node_day: must be a number >= 0, got {rate!r}")
    days = value.get("node_days", 0)
    losses = value.get("node_losses", round(float(rate) * float(days or 0)))
    return FailureRates("cluster", float(rate), planned_per_node_day(), mean_repair_s(gpus_per_node),
                        f"this cluster's event store: {losses} node losses in {float(days or 0):,.1f} node-days")
