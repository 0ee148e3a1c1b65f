"""Recovery cost by phase, from this cluster's recorded recoveries, scaled to the job's size.

The *base* phases (detect, plan, place, start, load, first_step) are what the runtime's recoveries on this
cluster cost: every ``recovery`` event in the service's event store carries them
(``workers/runtime/contract/events.py``, ``Recovered``). :func:`calibrate` combines the recorded ones
with :data:`PRIOR_PHASES`, the published value used when none are recorded: the median of the prior and
every recorded value per phase (the prior counts as one recovery, so two recorded recoveries outvote it).
A phase that does not depend on cluster size keeps its base value; the others are scaled by the
assumptions below (each stated in docs/goodput.md):

- detect: heartbeat timeout, independent of size: the base value.
- plan: ``PLAN_S`` (a cached ``planner.replan`` per shape; the first call per shape is made ahead
  of need, see throughput.py).
- place: measured + ``PLACE_S_PER_NODE`` per node (placement-group bundles reserved one by one).
- start: measured actor start (in parallel on every node) + communicator init
  ``COMM_INIT_S_PER_DOUBLING x log2(GPUs)``.
- load from storage: ``CHECKPOINT_BYTES_PER_PARAM x params`` over the aggregate read bandwidth
  ``min(GPUs x per-GPU read, STORAGE_GBPS)``; doubled when the model-parallel shape changes
  (resharding), never below the base load.
- load from peers' memory: each GPU's shard over its NIC, never below the base load.
- first step: one step of the planned layout (planner estimate).
- save to storage (blocking): the checkpoint over the aggregate write bandwidth; in-memory snapshot
  (blocking part): each GPU's shard over PCIe to host memory.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: bf16 weights + fp32 master + Adam m, v (the re-planner's checkpoint size too)
CHECKPOINT_BYTES_PER_PARAM = 14.0
PHASES = ("detect", "plan", "place", "start", "load", "first_step")
#: where :data:`PRIOR_PHASES` comes from (tests/planner/test_goodput.py reads it back from that file)
PRIOR_SOURCE = 'bench/results/recovery.json, rows[system="orthoplex runtime"].phases'
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

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any]) -> Phases:
        return cls(**{p: float(d[p]) for p in PHASES})


#: the published recovery of the Orthoplex runtime after a node crash (``orthoplex bench recovery``: tiny
#: model, 2 nodes x 2 declared GPUs), seconds: the prior when this cluster has recorded none
PRIOR_PHASES = Phases(detect=2.5231, plan=0.021, place=0.6634, start=3.9685, load=0.5281, first_step=0.1139)


@dataclass(frozen=True)
class Calibration:
    """Base phases and where they come from."""

    phases: Phases = PRIOR_PHASES
    recorded: int = 0
    source: str = f"prior: {PRIOR_SOURCE}"

    def to_dict(self) -> dict[str, Any]:
        return {"phases": self.phases.as_dict(), "recorded": self.recorded, "source": self.source}


PRIOR = Calibration()


def calibrate(recorded: Iterable[Mapping[str, Any]], where: str = "this cluster's event store") -> Calibration:
    """Base phases from recorded recoveries (each a mapping of phase -> seconds, as a ``recovery`` event's
    ``phases``): per phase, the median of the prior and every recorded value. A record missing a phase
    or holding a negative or non-finite value is skipped."""
    rows: list[dict[str, float]] = []
    for rec in recorded:
        try:
            row = {p: float(rec[p]) for p in PHASES}
        except (KeyError, TypeError, ValueError):
            continue
        if all(math.isfinite(v) and v >= 0 for v in row.values()):
            rows.append(row)
    if not rows:
        return PRIOR
    out = {p: _median([getattr(PRIOR_PHASES, p), *(r[p] for r in rows)]) for p in PHASES}
    return Calibration(Phases(**out), len(rows), f"{where}: {len(rows)} recorded recoveries (median with the prior)")


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


@dataclass(frozen=True)
class CostModel:
    """Sizes that set the costs (GPUs, nodes, parameters, the step time of the plan) and the base phases."""

    gpus: int
    gpus_per_node: int
    params: float
    step_s: float
    base: Phases = field(default=PRIOR_PHASES)

    @property
    def checkpoint_bytes(self) -> float:
        return CHECKPOINT_BYTES_PER_PARAM * self.params

    def storage_s(self, gpus: int | None = None) -> float:
        g = gpus or self.gpus
        return self.checkpoint_bytes / (min(g * PER_GPU_READ_GBPS, STORAGE_GBPS) * 1e9)

    def save_storage_s(self) -> float:
        """Blocking save of a full checkpoint to storage."""
        return max(self.base.load, self.storage_s())

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
            load = max(self.base.load, self.storage_s(g)) * (2.0 if reshard else 1.0)
        else:
            load = max(self.base.load, self.checkpoint_bytes / g / (NIC_GBPS * 1e9) * (2.0 if reshard else 1.0))
        return Phases(detect=self.base.detect, plan=PLAN_S, place=self.base.place + PLACE_S_PER_NODE * nodes,
                      start=self.base.start + self.comm_init_s(g), load=load,
                      first_step=max(self.base.first_step, self.step_s))

    def replica_stall_s(self) -> float:
        """Survivors' stall when one replica group dies: detect, abort the collectives, re-form the
        communicators without it (no restart, no load)."""
        return self.base.detect + self.comm_init_s()

    def replica_join_s(self) -> float:
        """A replacement group joins: placed, started, state copied from a peer group."""
        p = self.phases("memory")
        return p.place + p.start + p.load
