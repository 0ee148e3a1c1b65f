"""Failure traces: when, where (which job slot), why, and how long the node is out.

A *slot* is one of the job's node positions; a failure of a slot hits whatever node fills it. Idle
nodes (spares, the nodes a plan leaves unused) do not fail in the trace: only failures that reach
the job are counted, as Llama 3 counted interruptions of its job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from service.failure_sim.causes import HOUR, LLAMA3_CAUSES, PLANNED, node_rates, planned_per_node_day

DAY = 86_400.0
#: spread of the log-normal repair times (their mean is the cause's ``repair_h``)
REPAIR_SIGMA = 1.0


@dataclass(frozen=True)
class Failure:
    t: float
    slot: int
    cause: str
    repair_s: float  # 0: the node is back at once (software); else out for this long
    planned: bool = False


@dataclass(frozen=True)
class Trace:
    failures: tuple[Failure, ...]
    slots: int
    horizon_s: float
    mttf_s: float  # expected job-level mean time to an unexpected failure

    @property
    def unexpected(self) -> int:
        return sum(1 for f in self.failures if not f.planned)

    @property
    def planned(self) -> int:
        return sum(1 for f in self.failures if f.planned)

    def by_cause(self) -> dict[str, int]:
        counts = {c.name: 0 for c in LLAMA3_CAUSES}
        for f in self.failures:
            if not f.planned:
                counts[f.cause] += 1
        return counts


def poisson_trace(slots: int, gpus_per_node: int, days: float, seed: int, rates: str = "llama3",
                  planned: bool = True) -> Trace:
    """Independent Poisson arrivals per cause over ``slots`` nodes for ``days``; log-normal repairs."""
    rng = np.random.default_rng(seed)
    horizon = days * DAY
    out: list[Failure] = []
    per_node = node_rates(gpus_per_node, rates)
    causes = [(c, r) for c, r in per_node]
    if planned:
        causes.append((PLANNED, planned_per_node_day()))
    total_rate = sum(r for c, r in causes if c is not PLANNED)
    for cause, rate in causes:
        n = int(rng.poisson(rate * slots * days))
        times = rng.uniform(0.0, horizon, n)
        where = rng.integers(0, slots, n)
        if cause.repair_h > 0:
            mu = math.log(cause.repair_h * HOUR) - REPAIR_SIGMA ** 2 / 2
            repairs = rng.lognormal(mu, REPAIR_SIGMA, n)
        else:
            repairs = np.zeros(n)
        is_planned = cause is PLANNED
        out.extend(Failure(float(t), int(s), cause.name, float(r), is_planned) for t, s, r in zip(times, where, repairs, strict=True))
    out.sort(key=lambda f: (f.t, f.slot, f.cause))
    mttf = DAY / (total_rate * slots) if total_rate > 0 else math.inf
    return Trace(tuple(out), slots, horizon, mttf)


def periodic_trace(slots: int, mttf_s: float, horizon_s: float, sweep_s: float, sweep_points: int = 64) -> Trace:
    """Deterministic failures for the self-check: gaps of ``mttf_s`` shifted by an even sweep over
    ``[-sweep_s/2, sweep_s/2)`` (so every phase of a checkpoint period of ``sweep_s`` is hit equally
    often), software causes only (no repair), slots in turn."""
    out: list[Failure] = []
    t, i = 0.0, 0
    while True:
        t += mttf_s + ((i % sweep_points) / sweep_points - 0.5) * sweep_s
        if t >= horizon_s:
            break
        out.append(Failure(t, i % slots, "software_bug", 0.0))
        i += 1
    return Trace(tuple(out), slots, horizon_s, mttf_s)
