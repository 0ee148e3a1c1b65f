"""The planner's entry points."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from planner.layout import Layout
from planner.result import Plan, PlanResult, Rejection, Replan
from planner.search import evaluate as _evaluate
from planner.search import search
from planner.spec import PlanSpec, SpecError, parse_spec

#: layouts searched for the goodput ranking at least (the healthy-speed top 5)
GOODPUT_CANDIDATES = 5


def plan(spec: Mapping[str, Any] | PlanSpec, top_k: int = 5, *, engine_only: bool | None = None) -> PlanResult:
    """Search every layout for ``spec`` and return the ``top_k`` best (one per TP/PP/CP/DP shape).

    With ``duration_days`` in the spec the layouts are ranked by expected effective tokens/s (healthy
    tokens/s x ETTR under the spec's ``failure_rates``) and each carries its recovery settings
    (:mod:`planner.goodput`).

    ``spec`` is a dict shaped like a ``published_cases.json`` record (or a parsed
    :class:`PlanSpec`). Raises :class:`SpecError` (naming the field) on bad input.
    """
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise SpecError("top_k", f"must be an integer >= 1, got {top_k!r}")
    parsed = parse_spec(spec, engine_only=engine_only)
    if parsed.duration_days is None:
        return search(parsed, top_k)
    from planner import goodput

    # goodput-aware: rank at least GOODPUT_CANDIDATES layouts by effective tokens/s, return top_k
    return goodput.apply(parsed, search(parsed, max(top_k, GOODPUT_CANDIDATES)), top_k)


def evaluate(spec: Mapping[str, Any] | PlanSpec, layout: Layout | str | Mapping[str, Any]) -> Plan | Rejection:
    """Cost one layout: a :class:`Plan` when it is valid and fits, else a :class:`Rejection` with the reason."""
    if isinstance(layout, str):
        layout = Layout.parse(layout)
    elif isinstance(layout, Mapping):
        layout = Layout.from_dict(dict(layout))
    return _evaluate(parse_spec(spec), layout)


def replan(previous_plan: Plan | Mapping[str, Any], checkpoint_layout: Layout | Mapping[str, Any] | str | None,
           cluster_change: Mapping[str, Any], spec: Mapping[str, Any] | PlanSpec) -> Replan:
    """Re-plan after the cluster changed; see :mod:`planner.replanner`."""
    from planner.replanner import replan as _replan

    return _replan(previous_plan, checkpoint_layout, cluster_change, spec)
