"""The supervisor's event log: every decision is an event with a timestamp and a reason.

Events are plain dicts ``{"seq", "ts", "type", "reason", ...}`` (see ``docs/contracts.md``); the
control plane *pulls* them with ``since(seq)``, so a supervisor keeps training while the service is
down and the service catches up later. An optional JSONL sink gets every event as it happens.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

EVENT_TYPES: frozenset[str] = frozenset(
    {
        "plan",
        "placed",
        "placement_timeout",
        "ranks_mapped",
        "started",
        "step",
        "checkpoint",
        "node_lost",
        "rank_failed",
        "hang",
        "straggler",
        "node_excluded",
        "replan",
        "resize_requested",
        "resize_refused",
        "waiting_for_gpus",
        "resumed",
        "recovery",
        "fault_injected",
        "finished",
        "failed",
        "cancelled",
        "preempted",
    }
)

RECOVERY_PHASES: tuple[str, ...] = ("detect", "plan", "place", "start", "load", "first_step")


class EventLog:
    """Append-only, thread-safe list of events with monotonically increasing ``seq`` (from 1)."""

    def __init__(self, sink: str | Path | None = None, *, clock: Any = time.time) -> None:
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._clock = clock
        self._sink = Path(sink) if sink else None
        if self._sink is not None:
            self._sink.parent.mkdir(parents=True, exist_ok=True)

    def emit(self, type: str, reason: str = "", **fields: Any) -> dict[str, Any]:
        """Record one event; unknown types are refused so the vocabulary stays the documented one."""
        if type not in EVENT_TYPES:
            raise ValueError(f"unknown event type {type!r}")
        with self._lock:
            event = {"seq": len(self._events) + 1, "ts": round(self._clock(), 6), "type": type, "reason": reason}
            event.update(fields)
            self._events.append(event)
            if self._sink is not None:
                with self._sink.open("a") as f:
                    f.write(json.dumps(event, default=str) + "\n")
        return event

    def since(self, seq: int = 0) -> list[dict[str, Any]]:
        """Events with ``seq > seq`` (copies), oldest first."""
        with self._lock:
            return [dict(e) for e in self._events[max(0, int(seq)) :]]

    def of_type(self, type: str) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(e) for e in self._events if e["type"] == type]

    @property
    def last_seq(self) -> int:
        with self._lock:
            return len(self._events)


def recovery_event_fields(phases: dict[str, float], cause: str) -> dict[str, Any]:
    """The body of a ``recovery`` event: every phase (seconds) and their sum."""
    missing = [p for p in RECOVERY_PHASES if p not in phases]
    if missing:
        raise ValueError(f"recovery phases missing: {', '.join(missing)}")
    clean = {p: round(float(phases[p]), 4) for p in RECOVERY_PHASES}
    return {"cause": cause, "phases": clean, "total_s": round(sum(clean.values()), 4)}
