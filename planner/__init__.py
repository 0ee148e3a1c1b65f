"""Orthoplex planner: pure Python, imports in milliseconds.

Public API: :func:`plan`, :func:`replan`, :func:`evaluate`, :class:`Plan`, :class:`PlanResult`,
:class:`Replan`, :class:`Layout`, :class:`SpecError`. Submodules load on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from planner.api import evaluate, plan, replan
    from planner.layout import Layout, LayoutError
    from planner.result import Estimate, Plan, PlanResult, RankSlot, Rejection, Replan
    from planner.spec import PlanSpec, SpecError, parse_spec

_EXPORTS = {
    "plan": "planner.api",
    "replan": "planner.api",
    "evaluate": "planner.api",
    "Layout": "planner.layout",
    "LayoutError": "planner.layout",
    "Plan": "planner.result",
    "PlanResult": "planner.result",
    "Estimate": "planner.result",
    "RankSlot": "planner.result",
    "Rejection": "planner.result",
    "Replan": "planner.result",
    "PlanSpec": "planner.spec",
    "SpecError": "planner.spec",
    "parse_spec": "planner.spec",
}

__all__ = [
    "Estimate", "Layout", "LayoutError", "Plan", "PlanResult", "PlanSpec", "RankSlot", "Rejection", "Replan",
    "SpecError", "evaluate", "parse_spec", "plan", "replan",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'planner' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
