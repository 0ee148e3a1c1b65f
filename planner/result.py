"""What the planner returns: frozen, versioned, JSON-serialisable plans."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from planner.layout import Layout

PLAN_VERSION = 1


class RankSlot(NamedTuple):
    """Where one rank runs (a named tuple: immutable, cheap to build for 16k ranks)."""

    rank: int
    node: int | str  # index of the node (0..n-1) or the node id given in the spec
    local_gpu: int


class SpanningGroup(NamedTuple):
    dim: str  # "tp" | "cp" | "dp" | "pp"
    ranks: tuple[int, ...]
    nodes: tuple[int | str, ...]


@dataclass(frozen=True, slots=True)
class Estimate:
    step_time_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    mfu: float
    hfu: float
    memory_gb_per_gpu: float
    bubble_fraction: float
    time_breakdown_s: dict[str, float] = field(default_factory=dict)
    hidden_comm_s: dict[str, float] = field(default_factory=dict)
    memory_breakdown_gb: dict[str, float] = field(default_factory=dict)
    flops_convention: str = "megatron-general (6·(L·P_layer + V·h) + 12·L·s·h per token, not halved)"

    def to_dict(self) -> dict[str, Any]:
        return {
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "memory_gb_per_gpu": self.memory_gb_per_gpu,
            "bubble_fraction": self.bubble_fraction,
            "time_breakdown_s": dict(self.time_breakdown_s),
            "hidden_comm_s": dict(self.hidden_comm_s),
            "memory_breakdown_gb": dict(self.memory_breakdown_gb),
            "flops_convention": self.flops_convention,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Estimate:
        return cls(**{k: (dict(v) if isinstance(v, Mapping) else v) for k, v in d.items()})


@dataclass(frozen=True, slots=True)
class Plan:
    layout: Layout
    estimate: Estimate
    global_batch: int
    num_gpus: int
    rank_grid: tuple[RankSlot, ...] = ()
    spanning_groups: tuple[SpanningGroup, ...] = ()
    spanning_counts: dict[str, int] = field(default_factory=dict)
    nodes_used: tuple[int | str, ...] = ()
    version: int = PLAN_VERSION
    # goodput-aware plans (planner.goodput; set when the spec gives duration_days): the expected share
    # of wall time that trains (ETTR), healthy tokens/s x ETTR, the chosen recovery settings and the
    # other recovery options with the reason each lost
    ettr: float | None = None
    effective_tokens_per_s: float | None = None
    recovery: dict[str, Any] | None = None
    recovery_options: tuple[dict[str, Any], ...] = ()

    def goodput_dict(self) -> dict[str, Any]:
        """The goodput keys (empty when the plan was not priced for failures)."""
        if self.ettr is None:
            return {}
        return {"ettr": self.ettr, "effective_tokens_per_s": self.effective_tokens_per_s,
                "recovery": dict(self.recovery or {}), "recovery_options": [dict(o) for o in self.recovery_options]}

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.goodput_dict(),
            "version": self.version,
            "layout": self.layout.to_dict(),
            "estimate": self.estimate.to_dict(),
            "global_batch": self.global_batch,
            "num_gpus": self.num_gpus,
            "rank_grid": [{"rank": r.rank, "node": r.node, "local_gpu": r.local_gpu} for r in self.rank_grid],
            "spanning_groups": [{"dim": g.dim, "ranks": list(g.ranks), "nodes": list(g.nodes)}
                                for g in self.spanning_groups],
            "spanning_counts": dict(self.spanning_counts),
            "nodes_used": list(self.nodes_used),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Plan:
        version = int(d.get("version", PLAN_VERSION))
        if version > PLAN_VERSION:
            raise ValueError(f"plan version {version} is newer than this planner ({PLAN_VERSION})")
        return cls(
            layout=Layout.from_dict(dict(d["layout"])),
            estimate=Estimate.from_dict(d["estimate"]),
            global_batch=int(d["global_batch"]),
            num_gpus=int(d["num_gpus"]),
            rank_grid=tuple(RankSlot(int(r["rank"]), r["node"], int(r["local_gpu"])) for r in d.get("rank_grid", ())),
            spanning_groups=tuple(SpanningGroup(g["dim"], tuple(g["ranks"]), tuple(g["nodes"]))
                                  for g in d.get("spanning_groups", ())),
            spanning_counts=dict(d.get("spanning_counts", {})),
            nodes_used=tuple(d.get("nodes_used", ())),
            version=version,
            ettr=d.get("ettr"),
            effective_tokens_per_s=d.get("effective_tokens_per_s"),
            recovery=dict(d["recovery"]) if d.get("recovery") else None,
            recovery_options=tuple(dict(o) for o in d.get("recovery_options", ())),
        )

    def summary(self) -> dict[str, Any]:
        """The flat shape of ``orthoplex plan --json``."""
        lay = self.layout
        return {
            "tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "dp": lay.dp, "vpp": lay.vpp,
            "micro_batch": lay.micro_batch, "num_micro_batches": lay.num_micro_batches,
            "sp": lay.sp, "zero": lay.zero, "recompute": lay.recompute,
            "estimate": {**self.estimate.to_dict(), "schedule": lay.schedule, "cp_method": lay.cp_method},
            **({"dp_replicate": lay.dp_replicate} if lay.dp_replicate > 1 else {}),
            **self.goodput_dict(),
        }


@dataclass(frozen=True, slots=True)
class Rejection:
    layout: dict[str, Any]  # may be partial (a whole factorization rejected at once)
    reason: str
    kind: str = ""  # short category used for counting

    def to_dict(self) -> dict[str, Any]:
        return {"layout": dict(self.layout), "reason": self.reason}


@dataclass(frozen=True, slots=True)
class PlanResult:
    plans: tuple[Plan, ...]
    rejected: tuple[Rejection, ...]
    searched: int
    evaluated: int
    search_time_s: float
    rejected_counts: dict[str, int] = field(default_factory=dict)
    version: int = PLAN_VERSION
    goodput: dict[str, Any] | None = None  # planner.goodput: inputs, the layouts' ranking and why each lost

    def to_dict(self) -> dict[str, Any]:
        return {
            **({"goodput": self.goodput} if self.goodput is not None else {}),
            "version": self.version,
            "plans": [p.to_dict() for p in self.plans],
            "rejected": [r.to_dict() for r in self.rejected],
            "rejected_counts": dict(self.rejected_counts),
            "searched": self.searched,
            "evaluated": self.evaluated,
            "search_time_s": self.search_time_s,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PlanResult:
        return cls(
            plans=tuple(Plan.from_dict(p) for p in d["plans"]),
            rejected=tuple(Rejection(dict(r["layout"]), r["reason"]) for r in d.get("rejected", ())),
            searched=int(d["searched"]),
            evaluated=int(d.get("evaluated", 0)),
            search_time_s=float(d["search_time_s"]),
            rejected_counts=dict(d.get("rejected_counts", {})),
            version=int(d.get("version", PLAN_VERSION)),
            goodput=dict(d["goodput"]) if d.get("goodput") else None,
        )

    def cli_dict(self) -> dict[str, Any]:
        """Exactly the ``orthoplex plan --json`` shape."""
        return {
            **({"goodput": self.goodput} if self.goodput is not None else {}),
            "plans": [p.summary() for p in self.plans],
            "rejected": [r.to_dict() for r in self.rejected],
            "searched": self.searched,
            "search_time_s": self.search_time_s,
        }


@dataclass(frozen=True, slots=True)
class Replan:
    plan: Plan
    decision: str  # "replan" | "shrink_dp" | "keep"
    reason: str
    old_tokens_per_s: float  # the previous layout on the changed cluster (0 when it cannot run)
    new_tokens_per_s: float  # the chosen plan
    switch_cost_s: float
    options: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": self.plan.to_dict(),
            "decision": self.decision,
            "reason": self.reason,
            "old_tokens_per_s": self.old_tokens_per_s,
            "new_tokens_per_s": self.new_tokens_per_s,
            "switch_cost_s": self.switch_cost_s,
            "options": {k: dict(v) for k, v in self.options.items()},
        }
