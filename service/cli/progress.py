"""What ``orthoplex status JOB`` shows about one job: progress, the plan in force, the last event.

Pure functions over what the REST API returns (the job, its newest metrics rows, its events), so
they are tested without a service. Steps are counted as the API counts them: steps completed.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass
from typing import Any

from workers.states import TERMINAL

#: How many of the newest metrics rows the step rate (and so the ETA) is measured over.
RATE_WINDOW = 20


@dataclass(frozen=True)
class Progress:
    step: int | None  # newest step reported (None before the first)
    steps: int  # the job's total
    loss: float | None
    tokens_per_s: float | None
    steps_per_s: float | None
    eta_s: float | None  # None when unknown or the job has ended
    layout: str | None  # the plan in force, e.g. "tp2·pp2·dp2" or a layout dict's short form
    gpus: int | None
    last_event: dict[str, Any] | None  # {"type", "ts", "summary"}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _ts(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    try:
        return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def step_rate(metrics: list[dict[str, Any]]) -> float | None:
    """Steps per second over the newest :data:`RATE_WINDOW` rows (None with fewer than two)."""
    rows = [m for m in metrics if _ts(m.get("ts")) is not None and m.get("step") is not None]
    rows.sort(key=lambda m: (_ts(m["ts"]), m["step"]))
    rows = rows[-RATE_WINDOW:]
    if len(rows) < 2:
        return None
    dsteps = rows[-1]["step"] - rows[0]["step"]
    dt_s = _ts(rows[-1]["ts"]) - _ts(rows[0]["ts"])  # type: ignore[operator]
    if dsteps <= 0 or dt_s <= 0:
        return None
    return dsteps / dt_s


def _layout_of(payload: dict[str, Any]) -> str | None:
    for key in ("layout_short", "short", "layout"):
        value = payload.get(key)
        if isinstance(value, str) and value:
            return value
        if isinstance(value, dict):
            parts = [f"{k}{v}" for k, v in value.items() if k in ("tp", "pp", "cp", "dp", "vpp") and v not in (None, 1)]
            return "·".join(parts) or "single"
    return None


def summarize_event(ev: dict[str, Any]) -> str:
    """One line for an event: a transition's ``from -> to  reason``, else its payload's message."""
    p = ev.get("payload") or {}
    if ev.get("type") in ("transition", "attempt_started"):
        return f"{p.get('from')} -> {p.get('to')}  {p.get('reason', '')}".strip()
    for key in ("message", "msg", "reason"):
        if isinstance(p.get(key), str) and p[key]:
            return p[key]
    return " ".join(f"{k}={v}" for k, v in p.items())[:160]


def progress(job: dict[str, Any], metrics: list[dict[str, Any]], events: list[dict[str, Any]]) -> Progress:
    """The job's progress from its newest metrics rows and its events (oldest first)."""
    steps = int((job.get("spec") or {}).get("steps") or 0)
    newest = max(metrics, key=lambda m: (m.get("step", -1), _ts(m.get("ts")) or 0.0), default=None)
    step = newest.get("step") if newest else job.get("final_step")
    loss = newest.get("loss") if newest else job.get("final_loss")
    rate = step_rate(metrics)
    ended = job.get("state") in TERMINAL
    eta = None
    if rate and step is not None and steps and not ended:
        eta = max(0.0, (steps - step) / rate)
    layout, gpus = None, None
    for ev in events:  # the newest event that names a layout is the plan in force
        found = _layout_of(ev.get("payload") or {})
        if found:
            layout = found
            world = (ev.get("payload") or {}).get("world_size") or (ev.get("payload") or {}).get("num_gpus")
            gpus = int(world) if isinstance(world, int | float) else gpus
    last = events[-1] if events else None
    return Progress(
        step=step, steps=steps, loss=loss, tokens_per_s=newest.get("tokens_per_s") if newest else None,
        steps_per_s=rate, eta_s=eta, layout=layout, gpus=gpus if gpus is not None else job.get("gpus_allocated"),
        last_event={"type": last["type"], "ts": last.get("ts"), "summary": summarize_event(last)} if last else None,
    )


def format_eta(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = round(seconds)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{sec:02d}s" if m else f"{sec}s"
