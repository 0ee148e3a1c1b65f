"""One simulation: the job planned on the cluster, one failure trace, every policy played on it."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from planner.recovery_names import REPLICA_GROUP, RESTART
from service.failure_sim import closed_form
from service.failure_sim.causes import RATE_SETS
from service.failure_sim.events import PolicyResult, play
from service.failure_sim.policies import KINDS, Policy, policies_for
from service.failure_sim.recovery import BASELINE_RESTART_S, PRIOR, Calibration, CostModel
from service.failure_sim.throughput import DEFAULT_MODEL, JobThroughput
from service.failure_sim.trace import Trace, poisson_trace

MAX_GPUS = 1 << 20
MAX_DAYS = 3650.0
PLOT_SIZES: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


class ConfigError(ValueError):
    """Bad simulation input; ``field`` names the option."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


@dataclass(frozen=True)
class Config:
    gpus: int = 16_384
    gpus_per_node: int = 8
    days: float = 54.0
    seed: int = 0
    policies: tuple[str, ...] = KINDS
    spares: int = 16
    rates: str = "llama3"
    restart_s: float = BASELINE_RESTART_S
    stall_s: float | None = None
    save_s: float | None = None
    model: str = DEFAULT_MODEL
    layout: str | None = None  # the job's layout (default: the planner's fastest on the cluster)
    groups: int | None = None  # replica groups (default: every DP replica)
    calibration: Calibration = PRIOR  # base recovery phases: the prior or this cluster's recorded ones

    def validate(self) -> None:
        if not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 1 or self.gpus_per_node > 64:
            raise ConfigError("gpus_per_node", f"must be an integer in 1..64, got {self.gpus_per_node!r}")
        if not isinstance(self.gpus, int) or self.gpus < 1 or self.gpus > MAX_GPUS:
            raise ConfigError("gpus", f"must be an integer in 1..{MAX_GPUS}, got {self.gpus!r}")
        if self.gpus % self.gpus_per_node:
            raise ConfigError("gpus", f"{self.gpus} is not divisible by gpus_per_node={self.gpus_per_node}")
        if not (0 < self.days <= MAX_DAYS):
            raise ConfigError("days", f"must be > 0 and <= {MAX_DAYS:g}, got {self.days!r}")
        if self.seed < 0:
            raise ConfigError("seed", f"must be >= 0, got {self.seed}")
        if not self.policies:
            raise ConfigError("policy", "give at least one policy")
        for p in self.policies:
            if p not in KINDS:
                raise ConfigError("policy", f"unknown policy {p!r}; choose from {', '.join(KINDS)}")
        if self.spares < 0:
            raise ConfigError("spares", f"must be >= 0, got {self.spares}")
        if self.rates not in RATE_SETS:
            raise ConfigError("rates", f"unknown rate set {self.rates!r}; choose from {', '.join(RATE_SETS)}")
        if self.groups is not None and (not isinstance(self.groups, int) or self.groups < 1):
            raise ConfigError("groups", f"must be an integer >= 1, got {self.groups!r}")
        for name in ("restart_s", "stall_s", "save_s"):
            v = getattr(self, name)
            if v is not None and not (0 <= v < 1e7):
                raise ConfigError(name, f"must be >= 0 seconds, got {v!r}")


@dataclass
class Simulation:
    config: Config
    trace: Trace
    throughput: JobThroughput
    cost: CostModel
    results: list[PolicyResult]
    closed: dict[str, float]
    wall_s: float
    extras: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        """Exactly the documented keys."""
        return {
            "interruptions": {"unexpected": self.trace.unexpected, "planned": self.trace.planned,
                              "by_cause": self.trace.by_cause()},
            "policies": {r.name: r.as_dict() for r in self.results},
            "closed_form": {k: round(v, 5) for k, v in self.closed.items()},
            "wall_s": round(self.wall_s, 3),
        }

    @property
    def events(self) -> int:
        return sum(r.events for r in self.results)


def closed_form_for(result: PolicyResult, kind: str, mttf_s: float, step_s: float) -> float:
    """The closed form with this policy's restart time, save cost and Young's interval (at least a step)."""
    tau = max(step_s, closed_form.young(result.save_s, mttf_s)) if result.save_s > 0 else step_s
    lost = step_s / 2 if kind == REPLICA_GROUP else None
    return closed_form.ettr(result.restart_s, result.save_s, tau, mttf_s, lost)


def simulate(config: Config, on_policy: Callable[[str], None] | None = None) -> Simulation:
    """Plan the job, draw the trace and play every policy on it."""
    config.validate()
    t0 = time.perf_counter()
    try:
        thr = JobThroughput(config.gpus, config.gpus_per_node, config.model, fixed_layout=config.layout,
                            groups=config.groups)
    except ValueError as exc:
        name, _, msg = str(exc).partition(": ")
        raise ConfigError(name if name in ("layout", "gpus") else "gpus", msg or str(exc)) from None
    if config.groups is not None and thr.job_gpus % config.groups:
        raise ConfigError("groups", f"{config.groups} does not divide the job's {thr.job_gpus} GPUs")
    idle = config.gpus // config.gpus_per_node - thr.job_nodes
    trace = poisson_trace(thr.job_nodes, config.gpus_per_node, config.days, config.seed, config.rates)
    cost = CostModel(thr.job_gpus, config.gpus_per_node, float(thr.params), thr.step_s, config.calibration.phases)
    stall = cost.replica_stall_s() if config.stall_s is None else config.stall_s
    results: list[PolicyResult] = []
    closed: dict[str, float] = {}
    for policy in policies_for(config.policies, config.spares):
        res = play(policy, trace, thr, cost, idle_nodes=idle, restart_s=config.restart_s, stall_s=stall,
                   save_s=_save_override(config, policy))
        results.append(res)
        closed[res.name] = closed_form_for(res, policy.kind, trace.mttf_s, thr.step_s)
        if on_policy:
            on_policy(res.name)
    extras = {"layout": thr.layout, "job_gpus": thr.job_gpus, "idle_nodes": idle, "mttf_s": trace.mttf_s,
              "step_s": thr.step_s, "tokens_per_s": thr.tokens_per_s, "stall_s": stall,
              "phases_storage": cost.phases("storage").as_dict(), "phases_memory": cost.phases("memory").as_dict(),
              "calibration": config.calibration.to_dict(),
              "planner_calls": thr.planner_calls, "planner_s": thr.planner_s,
              "young_storage_s": closed_form.young(cost.save_storage_s(), trace.mttf_s),
              "daly_storage_s": closed_form.daly(cost.save_storage_s(), trace.mttf_s, config.restart_s)}
    return Simulation(config, trace, thr, cost, results, closed, time.perf_counter() - t0, extras)


def _save_override(config: Config, policy: Policy) -> float | None:
    """``save_s`` overrides the blocking save of the storage policies (snapshots keep their model)."""
    return config.save_s if policy.source == "storage" and policy.kind != REPLICA_GROUP else None


def sweep(config: Config, sizes: Sequence[int] = PLOT_SIZES,
          on_point: Callable[[int], None] | None = None) -> dict[int, dict[str, float]]:
    """ETTR per policy for each cluster size (same days, seed and policies as ``config``)."""
    out: dict[int, dict[str, float]] = {}
    for n in sizes:
        sim = simulate(Config(**{**config.__dict__, "gpus": n}))
        out[n] = {r.name: r.ettr for r in sim.results}
        if on_point:
            on_point(n)
    return out


def self_check(gpus: int = 1024, gpus_per_node: int = 8, mttf_s: float = 6 * 3600.0, restart_s: float = 600.0,
               save_s: float = 60.0, days: float = 200.0) -> tuple[float, float]:
    """(simulated ETTR, closed-form ETTR) for the restart policy on deterministic inputs: failures every
    ``mttf_s`` (swept evenly over one checkpoint period), fixed restart and save times, no repairs."""
    from service.failure_sim.trace import periodic_trace

    thr = JobThroughput(gpus, gpus_per_node)
    cost = CostModel(thr.job_gpus, gpus_per_node, float(thr.params), thr.step_s)  # the prior phases
    tau = max(1, round(closed_form.young(save_s, mttf_s) / thr.step_s)) * thr.step_s
    trace = periodic_trace(thr.job_nodes, mttf_s, days * 86_400.0, sweep_s=tau + save_s)
    res = play(Policy(RESTART), trace, thr, cost, restart_s=restart_s, stall_s=0.0, save_s=save_s)
    return res.ettr, closed_form.ettr(restart_s, save_s, res.interval_s, mttf_s)
