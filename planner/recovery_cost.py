"""Recovery cost by phase, calibrated from what the runtime measures here and scaled to large clusters.

``MEASURED`` is the Orthoplex runtime's recovery after a node crash as ``orthoplex bench recovery``
measured it on this machine (bench/results/recovery.json: tiny model, 2 nodes x 2 declared GPUs).
A phase that does not depend on cluster size keeps its measured value; the others are scaled by the
assumptions below (each stated in docs/goodput.md):

- detect: heartbeat timeout, independent of size: measured.
- plan: ``PLAN_S`` (a cached ``planner.replan`` per shape; the first call per shape is made ahead
  of need, see throughput.py).
- place: measured + ``PLACE_S_PER_NODE`` per node (placement-group bundles reserved one by one).
- start: measured actor start (in parallel on every node) + communicator init
  ``COMM_INIT_S_PER_DOUBLING x log2(GPUs)``.
- load from storage: ``CHECKPOINT_BYTES_PER_PARAM x params`` over the aggregate read bandwidth
  ``min(GPUs x per-GPU read, STORAGE_GBPS)``; doubled when the model-parallel shape changes
  (resharding), never below the measured load.
- load from peers' memory: each GPU's shard over its NIC, never below the measured load.
- first step: one step of the planned layout (planner estimate).
- save to storage (blocking): the checkpoint over the aggregate write bandwidth; in-memory snapshot
  (blocking part): each GPU's shard over PCIe to host memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.replanner import CHECKPOINT_BYTES_PER_PARAM

#: bench/results/recovery.json, row "orthoplex runtime" (seconds)
MEASURED: dict[str, float] = {"detect": 2.5231, "plan": 0.021, "place": 0.6634, "start": 3.9685, "load": 0.5281,
                              "first_step": 0.1139}
PHASES = ("detect", "plan", "place", "start", "load", "first_step")
PLAN_S = 1.0
PLACE_S_PER_NODE = 0.001
COMM_INIT_S_PER_DOUBLING = 2.0
PER_GPU_READ_GBPS = 2.0  # planner default checkpoint_read_GBps
#: Llama 3's Tectonic storage: 2 TB/s sustained (Llama 3 paper, §3.3.1)
STORAGE_GBPS = 2000.0
NIC_GBPS = 50.0  # 400 Gb/s per GPU
PCIE_GBPS = 25.0  # device to pinned host memory
#: Published restart of a whole job from storage at large scale: FT-HSDP's 10-minute stall.
BASELINE_RESTART_S = 600.0


@dataclass(frozen=True)
class Phases:
    detect: float
    plan: float
    place: float
    start: float
    load: float
    first_step: float

    @property
    def total(self) -> float:
        return self.detect + self.plan + self.place + self.start + self.load + self.first_step

    def planned(self) -> float:
        """A planned switch: no failure to detect."""
        return self.total - self.detect

    def as_dict(self) -> dict[str, float]:
        return {p: round(getattr(self, p), 3) for p in PHASES}


@dataclass(frozen=True)
class CostModel:
    """Sizes that set the costs: GPUs, nodes, parameters, the step time of the plan."""

    gpus: int
    gpus_per_node: int
    params: float
    step_s: float

    @property
    def checkpoint_bytes(self) -> float:
        return CHECKPOINT_BYTES_PER_PARAM * self.params

    def storage_s(self, gpus: int | None = None) -> float:
        g = gpus or self.gpus
        return self.checkpoint_bytes / (min(g * PER_GPU_READ_GBPS, STORAGE_GBPS) * 1e9)

    def save_storage_s(self) -> float:
        """Blocking save of a full checkpoint to storage."""
        return max(MEASURED["load"], self.storage_s())

    def snapshot_s(self) -> float:
        """Blocking part of an in-memory snapshot: each GPU's shard to host memory."""
        return self.checkpoint_bytes / self.gpus / (PCIE_GBPS * 1e9)

    def comm_init_s(self, gpus: int | None = None) -> float:
        return COMM_INIT_S_PER_DOUBLING * math.log2(max(2, gpus or self.gpus))

    def phases(self, source: str, reshard: bool = False, gpus: int | None = None) -> Phases:
        """Recovery phases when restarting on ``gpus`` GPUs from ``source`` ("storage" or "memory")."""
        g = gpus or self.gpus
        nodes = max(1, g // self.gpus_per_node)
        if source == "storage":
            load = max(MEASURED["load"], self.storage_s(g)) * (2.0 if reshard else 1.0)
        else:
            load = max(MEASURED["load"], self.checkpoint_bytes / g / (NIC_GBPS * 1e9) * (2.0 if reshard else 1.0))
        return Phases(detect=MEASURED["detect"], plan=PLAN_S, place=MEASURED["place"] + PLACE_S_PER_NODE * nodes,
                      start=MEASURED["start"] + self.comm_init_s(g), load=load,
                      first_step=max(MEASURED["first_step"], self.step_s))

    def replica_stall_s(self) -> float:
        """Survivors' stall when one replica group dies: detect, abort the collectives, re-form the
        communicators without it (no restart, no load)."""
        return MEASURED["detect"] + self.comm_init_s()

    def replica_join_s(self) -> float:
        """A replacement group joins: placed, started, state copied from a peer group."""
        p = self.phases("memory")
        return p.place + p.start + p.load
