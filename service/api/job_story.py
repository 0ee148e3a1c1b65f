"""What the dashboard's job page shows, derived from a job's recorded events (pure functions).

- :func:`recovery_ledger`: one row per ``recovery`` event: its cause, the step it failed at, the
  layout before and after, the re-plan decision, and the phases (detect, plan, place, start, load,
  first_step) in seconds.
- :func:`rank_grid`: the plan in force (the last ``ranks_mapped`` event): one cell per rank with its
  node and its (tp, pp, cp, dp) coordinates, and the nodes the job lost or excluded.
- :func:`markers`: plan changes and recoveries on the step axis of the loss curve.

Events are dicts shaped like ``EventPublic`` (``id``, ``type``, ``payload``, ``ts``), oldest first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from planner.layout import Layout

PHASES = ("detect", "plan", "place", "start", "load", "first_step")
FAILURES = ("node_lost", "rank_failed", "hang", "straggler", "node_excluded", "peer_unreachable")
#: event types the page's timeline shows (``step`` events are the curve, not the timeline)
MARKER_TYPES = ("plan", "replan", "resumed", "recovery", *FAILURES)


def _short(layout: Any) -> str | None:
    if not isinstance(layout, dict):
        return None
    try:
        return Layout.from_dict(layout).short()
    except Exception:
        return None


def recovery_ledger(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per recovery, oldest first (see the module docstring)."""
    rows: list[dict[str, Any]] = []
    in_force: str | None = None
    failure: dict[str, Any] | None = None
    replan: dict[str, Any] | None = None
    resumed: dict[str, Any] | None = None
    for ev in events:
        t, p = ev.get("type"), ev.get("payload") or {}
        if t == "plan":
            in_force = p.get("short") or _short(p.get("layout")) or in_force
        elif t in FAILURES:
            if failure is None:
                failure = {"type": t, "step": p.get("step"), "reason": p.get("reason", ""),
                           "nodes": p.get("nodes") or ([p["node"]] if p.get("node") else [])}
        elif t == "replan":
            replan = p
        elif t == "resumed":
            resumed = p
        elif t == "recovery":
            phases = p.get("phases") or {}
            before = (replan or {}).get("old_short") or in_force
            after = (resumed or {}).get("short") or (replan or {}).get("new_short") or before
            rows.append({
                "event_id": ev.get("id"),
                "ts": ev.get("ts"),
                "cause": p.get("cause") or (failure or {}).get("type") or "unknown",
                "reason": (failure or {}).get("reason", ""),
                "nodes": (failure or {}).get("nodes", []),
                "failed_at_step": (failure or {}).get("step"),
                "resumed_from_step": (resumed or {}).get("from_step"),
                "steps_redone": (resumed or {}).get("steps_redone"),
                "decision": (replan or {}).get("decision"),
                "before": before,
                "after": after,
                "phases": {k: float(phases.get(k) or 0.0) for k in PHASES},
                "total_s": float(p.get("total_s") or sum(float(phases.get(k) or 0.0) for k in PHASES)),
            })
            in_force = after
            failure = replan = resumed = None
    return rows


def rank_grid(events: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The plan in force as rank cells grouped by node; ``None`` before any rank was placed."""
    mapped = next((e for e in reversed(events) if e.get("type") == "ranks_mapped"), None)
    lost: dict[str, str] = {}
    for ev in events:
        p = ev.get("payload") or {}
        if ev.get("type") == "node_lost":
            for n in p.get("nodes") or []:
                lost[str(n)] = "lost"
        elif ev.get("type") == "node_excluded" and p.get("node"):
            lost[str(p["node"])] = "excluded"
    if mapped is None:
        return None
    p = mapped.get("payload") or {}
    try:
        layout = Layout.from_dict(p["layout"])
    except Exception:
        return None
    rank_to_node = [str(n) for n in p.get("rank_to_node") or []]
    cells = []
    for rank, node in enumerate(rank_to_node[: layout.world_size]):
        c = layout.coords(rank)
        cells.append({"rank": rank, "node": node, "tp": c.tp, "pp": c.pp, "cp": c.cp, "dp": c.dp})
    nodes = list(dict.fromkeys(rank_to_node))
    for n in lost:
        if n not in nodes:
            nodes.append(n)
    return {
        "layout": layout.to_dict(),
        "short": layout.short(),
        "world_size": layout.world_size,
        "event_id": mapped.get("id"),
        "nodes": [{"node": n, "status": lost.get(n, "in use") if n not in rank_to_node else "in use"}
                  for n in nodes],
        "cells": cells,
    }


def markers(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Plan changes and recoveries as ``{step, kind, label}`` for the curve's step axis: both at the
    step the failure (or the switch) happened."""
    out: list[dict[str, Any]] = []
    last_step: int | None = None
    for ev in events:
        t, p = ev.get("type"), ev.get("payload") or {}
        step = p.get("step")
        if t in FAILURES and isinstance(step, int):
            last_step = step
        if t == "replan" and p.get("decision") != "keep":
            out.append({"step": last_step or 0, "kind": "plan",
                        "label": f"{p.get('old_short')} → {p.get('new_short')}"})
        elif t == "recovery":
            out.append({"step": last_step or 0, "kind": "recovery",
                        "label": f"recovery from {p.get('cause')} ({float(p.get('total_s') or 0):.1f}s)"})
    return out
