"""Goodput-aware plans: rank layouts by expected *effective* tokens/s = healthy tokens/s x ETTR.

For each layout the search found, every recovery option is priced in closed form against the job's
failure rates (:mod:`planner.failure_rates`) and this cluster's recovery phases
(:mod:`planner.recovery_cost`), and the one that maximises effective tokens/s is chosen:

- ``restart``: the whole job restarts from storage with the published restart time (600 s);
- ``replan_storage`` / ``replan_memory``: re-plan onto the nodes left (hot spares fill in) and load the
  newest storage checkpoint / in-memory snapshot;
- ``replica_group`` with ``G`` groups: DP split into ``G`` groups (HSDP ``dp_replicate = G`` for a ZeRO
  layout, priced again for memory and time; every DP replica for ZeRO-0); a failure stalls the
  survivors while the communicators re-form and the lost group rejoins from a peer.

Fraction of wall time lost, per option (``M`` job mean time to an unexpected failure, ``P`` planned
maintenance events per second, ``C`` the blocking save, ``tau`` its interval):

    1 - ETTR = C / (tau + C) + (R + L) / M + P x planned cost

with ``R`` the recovery's stall, ``L`` the work lost (``tau / 2`` after a rollback to the last save, half
a step for replica groups plus the lost group's share of the rejoin). ``tau`` is Daly's interval
``sqrt(2 C (M + R))`` in whole steps (capped at the job's duration). Hot spares (``warm_spares``) are
the nodes that cover the nodes in repair at once (Little's law: failures per second x mean repair) with
99% probability, minus the nodes the plan leaves idle; ETTR assumes them. The failure simulator
(``orthoplex simulate``, ``service/failure_sim``) plays the same costs event by event; the two agree
within a point at Llama 3 scale (tests/planner/test_goodput.py).

Pure Python: no torch, no ray.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from planner import constraints as C
from planner.failure_rates import FailureRates
from planner.flops import total_params
from planner.grid import gpu_histogram
from planner.memory import memory_limit_gb, memory_total_gb
from planner.recovery_cost import BASELINE_RESTART_S, CostModel
from planner.recovery_names import REPLAN_MEMORY, REPLAN_STORAGE, REPLICA_GROUP, RESTART, SOURCES
from planner.result import Plan, PlanResult
from planner.search import build_estimate
from planner.spec import PlanSpec
from planner.timing import hardware_for

DAY = 86_400.0
#: the probability the hot spares run short that the spare count allows
SPARE_SHORTFALL = 0.01
#: the most replica-group counts priced per layout (the divisors of DP nearest the extremes are kept)
MAX_GROUP_OPTIONS = 8


@dataclass(frozen=True)
class Option:
    """One recovery option for one layout, priced."""

    policy: str
    groups: int
    plan: Plan  # the layout it runs (replica groups may change dp_replicate)
    ettr: float
    restart_s: float
    save_s: float
    interval_steps: int
    lost_s: float
    warm_spares: int
    mttf_s: float
    why_not: str = ""  # "" when it can run; else why it cannot

    @property
    def effective(self) -> float:
        return self.plan.estimate.tokens_per_s * self.ettr if not self.why_not else 0.0

    @property
    def name(self) -> str:
        return f"{self.policy} x{self.groups}" if self.policy == REPLICA_GROUP else self.policy

    def recovery(self, reason: str) -> dict[str, Any]:
        step = self.plan.estimate.step_time_s
        memory = SOURCES[self.policy] == "memory"
        return {
            "policy": self.policy,
            "groups": self.groups,
            "snapshot_every": self.interval_steps if memory else 0,
            "checkpoint_every_steps": None if memory else self.interval_steps,
            "checkpoint_interval_s": round(self.interval_steps * step, 3),
            "warm_spares": self.warm_spares,
            "source": SOURCES[self.policy],
            "restart_s": round(self.restart_s, 3),
            "save_s": round(self.save_s, 4),
            "mttf_s": round(self.mttf_s, 1) if math.isfinite(self.mttf_s) else None,
            "ettr": round(self.ettr, 5),
            "reason": reason,
        }

    def summary(self) -> dict[str, Any]:
        return {"policy": self.policy, "groups": self.groups, "ettr": round(self.ettr, 5),
                "tokens_per_s": round(self.plan.estimate.tokens_per_s, 1),
                "effective_tokens_per_s": round(self.effective, 1)}


def spares_needed(rates: FailureRates, nodes: int, idle_nodes: int) -> int:
    """Hot spare nodes so that the nodes in repair at once exceed spares + idle with probability below
    :data:`SPARE_SHORTFALL` (in repair at once: Poisson with mean failures/s x mean repair)."""
    mean = rates.unexpected_per_node_day * nodes / DAY * rates.mean_repair_s
    if mean <= 0:
        return 0
    k, term = 0, math.exp(-mean)
    cdf = term
    while 1.0 - cdf > SPARE_SHORTFALL and k < 100_000:
        k += 1
        term *= mean / k
        cdf += term
    return max(0, k - idle_nodes)


def _interval_steps(save_s: float, mttf_s: float, restart_s: float, step_s: float, horizon_s: float) -> int:
    """Daly's interval in whole steps (at least one), capped at the job's duration."""
    if save_s <= 0 or step_s <= 0:
        return 1
    tau = math.sqrt(2.0 * save_s * (mttf_s + restart_s)) if math.isfinite(mttf_s) else horizon_s
    return max(1, round(min(tau, horizon_s) / step_s))


def _price(policy: str, groups: int, plan: Plan, cost: CostModel, rates: FailureRates, nodes: int,
           spares: int, horizon_s: float) -> Option:
    step = plan.estimate.step_time_s
    m = rates.job_mttf_s(nodes)
    planned_rate = rates.planned_per_node_day * nodes / DAY
    if policy == RESTART:
        r, save = BASELINE_RESTART_S, cost.save_storage_s()
        planned_cost = save + r
    elif policy in (REPLAN_STORAGE, REPLAN_MEMORY):
        ph = cost.phases(SOURCES[policy])
        r = ph.total
        save = cost.save_storage_s() if policy == REPLAN_STORAGE else cost.snapshot_s()
        planned_cost = save + ph.planned()
    else:
        r, save = cost.replica_stall_s(), cost.snapshot_s()
        planned_cost = 0.0
    n = _interval_steps(save, m, r, step, horizon_s)
    tau = n * step
    if policy == REPLICA_GROUP:
        share = 1.0 / max(1, min(groups, nodes))  # the throughput a node failure takes out until the rejoin
        join = cost.replica_join_s()
        lost = step / 2 + join * share
        planned_cost = join * share
    else:
        lost = tau / 2
    frac = save / (tau + save) + ((r + lost) / m if math.isfinite(m) else 0.0) + planned_rate * planned_cost
    return Option(policy, groups, plan, max(0.0, 1.0 - frac), r, save, n, lost, spares, m)


def _group_counts(lay_dp: int) -> list[int]:
    divs = [d for d in range(2, lay_dp + 1) if lay_dp % d == 0]
    if len(divs) <= MAX_GROUP_OPTIONS:
        return divs
    half = MAX_GROUP_OPTIONS // 2
    return divs[:half] + divs[-half:]


def _replica_plans(spec: PlanSpec, plan: Plan) -> list[tuple[int, Plan | None, str]]:
    """(groups, the plan with that many replica groups or None, why not) for every group count priced."""
    lay = plan.layout
    if lay.dp < 2:
        return [(1, None, "needs dp >= 2 (one model replica cannot survive losing it)")]
    if lay.zero == 0:  # every DP rank holds the whole state: each replica is a group as it is
        return [(lay.dp, plan, "")]
    ids = {str(i) for i in plan.nodes_used}
    nodes = [n for n in spec.cluster.nodes if str(n.id) in ids] or list(spec.cluster.nodes)
    hw = hardware_for(spec, min(n.speed for n in nodes))
    gpus = gpu_histogram([n.gpus for n in nodes])
    limit = memory_limit_gb(spec)
    out: list[tuple[int, Plan | None, str]] = []
    for g in _group_counts(lay.dp):
        if g == lay.dp_replicate:
            out.append((g, plan, ""))
            continue
        cand = dataclasses.replace(lay, dp_replicate=g)
        bad = C.check_all(spec, cand)
        if bad:
            out.append((g, None, bad[1]))
            continue
        mem = memory_total_gb(spec, cand)
        if mem > limit:
            out.append((g, None, f"{g} groups need {mem:.1f} GiB per GPU > {limit:.1f} GiB usable "
                                 "(each group holds the whole model state)"))
            continue
        est = build_estimate(spec, hw, cand, gpus)
        out.append((g, dataclasses.replace(plan, layout=cand, estimate=est), ""))
    return out


def options_for(spec: PlanSpec, plan: Plan) -> list[Option]:
    """Every recovery option for ``plan``, priced (best first; those that cannot run last)."""
    rates = spec.failure_rates
    assert rates is not None and spec.duration_days is not None
    gpn = spec.cluster.gpus_per_node
    nodes = max(1, math.ceil(plan.num_gpus / gpn))
    idle = max(0, len(spec.cluster.nodes) - len(plan.nodes_used or range(nodes)))
    spares = spares_needed(rates, nodes, idle)
    horizon = spec.duration_days * DAY
    params = float(total_params(spec.model))

    def cost_for(p: Plan) -> CostModel:
        return CostModel(p.num_gpus, gpn, params, p.estimate.step_time_s, spec.calibration.phases)

    base_cost = cost_for(plan)
    out = [_price(pol, 1, plan, base_cost, rates, nodes, spares, horizon)
           for pol in (RESTART, REPLAN_STORAGE, REPLAN_MEMORY)]
    for g, p, why in _replica_plans(spec, plan):
        if p is None:
            out.append(Option(REPLICA_GROUP, g, plan, 0.0, 0.0, 0.0, 0, 0.0, spares, math.inf, why_not=why))
        else:
            out.append(_price(REPLICA_GROUP, g, p, cost_for(p), rates, nodes, spares, horizon))
    out.sort(key=lambda o: (bool(o.why_not), -o.effective))
    return out


def _lost_because(o: Option, best: Option) -> str:
    if o.why_not:
        return o.why_not
    if o.plan.estimate.tokens_per_s < best.plan.estimate.tokens_per_s * (1 - 1e-9) and o.ettr >= best.ettr:
        return (f"{o.plan.estimate.tokens_per_s:,.0f} healthy tokens/s < {best.plan.estimate.tokens_per_s:,.0f} "
                f"with {best.name}")
    parts = [f"effective {o.effective:,.0f} < {best.effective:,.0f} tokens/s", f"ETTR {o.ettr:.2%} vs {best.ettr:.2%}"]
    m = o.mttf_s
    if math.isfinite(m):
        parts.append(f"{o.restart_s + o.lost_s:,.1f} s lost per failure (vs {best.restart_s + best.lost_s:,.1f} s)")
    if o.save_s > 0:
        parts.append(f"saves {o.save_s / (o.interval_steps * o.plan.estimate.step_time_s + o.save_s):.2%} of the time")
    return "; ".join(parts)


def _chosen_reason(best: Option) -> str:
    what = {RESTART: "restart from storage", REPLAN_STORAGE: "re-plan and load from storage",
            REPLAN_MEMORY: "re-plan and load from peers' memory",
            REPLICA_GROUP: f"{best.groups} replica groups (survivors step on)"}[best.policy]
    m = best.mttf_s
    mttf = f"job MTTF {m / 3600:.1f} h" if math.isfinite(m) else "no failures expected"
    return (f"{what}: highest effective tokens/s ({best.effective:,.0f}); {mttf}, "
            f"{best.restart_s:,.1f} s stall + {best.lost_s:,.1f} s lost work per failure")


def apply(spec: PlanSpec, result: PlanResult, top_k: int) -> PlanResult:
    """``result``'s plans, each with its best recovery option, ranked by effective tokens/s."""
    rates = spec.failure_rates
    assert rates is not None
    priced: list[tuple[Plan, Option, list[Option]]] = []
    for plan in result.plans:
        opts = options_for(spec, plan)
        best = opts[0]
        if best.why_not:
            continue
        runners = [{**o.summary(), "lost_because": _lost_because(o, best)} for o in opts[1:]]
        chosen = dataclasses.replace(best.plan, ettr=round(best.ettr, 6),
                                     effective_tokens_per_s=round(best.effective, 3),
                                     recovery=best.recovery(_chosen_reason(best)), recovery_options=tuple(runners))
        priced.append((chosen, best, opts))
    priced.sort(key=lambda t: -t[1].effective)
    plans = tuple(p for p, _, _ in priced[:top_k])
    ranking = []
    if priced:
        top = priced[0][1]
        for p, o, _ in priced:
            row = {"layout": p.layout.short(), "tokens_per_s": round(p.estimate.tokens_per_s, 1),
                   "ettr": round(o.ettr, 5), "effective_tokens_per_s": round(o.effective, 1),
                   "recovery": o.name}
            if o is not top:
                row["lost_because"] = (f"effective {o.effective:,.0f} < {top.effective:,.0f} tokens/s "
                                       f"(healthy {p.estimate.tokens_per_s:,.0f} x ETTR {o.ettr:.2%})")
            ranking.append(row)
    goodput = {"duration_days": spec.duration_days, "failure_rates": rates.to_dict(),
               "recovery_phases": spec.calibration.to_dict(), "ranking": ranking}
    return dataclasses.replace(result, plans=plans, goodput=goodput)
