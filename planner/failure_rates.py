"""Failure causes, their rates and repair times.

Counts are Llama 3's (Dubey et al. 2024, "The Llama 3 Herd of Models", §3.3.4, Table 5): 419
unexpected interruptions in a 54-day snapshot of pre-training on 16,384 H100 GPUs (2,048 nodes of 8),
plus 47 planned ones. A cause is counted per GPU-day when it lives in one GPU (the GPU itself, its
memories, its system processor, its thermal interface, silent data corruption), per node-day when
it lives in the host, its network or its software (one bad NIC or one crashing rank stops the whole
node's ranks either way). Rates are those counts divided by the exposure of that snapshot.

Repair times are assumptions (no source publishes them per cause): see docs/goodput.md.
"""

from __future__ import annotations

from dataclasses import dataclass

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
