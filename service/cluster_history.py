"""What this cluster's own history says about failures and recoveries, read from the event store.

- :func:`recorded_phases`: the phases (detect, plan, place, start, load, first_step) of every ``recovery``
  event whose cause is a failure (``workers/runtime/contract/events.py``, ``Recovered``), newest first;
  :func:`calibration` combines them with the prior (:func:`planner.recovery_cost.calibrate`).
- :func:`node_exposure`: node losses (``node_lost`` events, one per node named) and node-days (every
  attempt's nodes x its wall time), leaving out jobs whose failures were injected on purpose (a
  ``fault_injected`` event: tests, the demo, benchmarks).
- :func:`cluster_rates`: ``failure_rates: cluster`` resolved into numbers for the pure planner, once
  :data:`MIN_NODE_DAYS` node-days are recorded. Why that many: at Llama 3's rate (3.8 unexpected
  failures per 1000 node-days) 1,000 node-days expect about 4 losses, the fewest for which a Poisson
  count's relative standard error (1/sqrt(n)) is at most 50%. With fewer the plan uses ``llama3`` and
  says so.

The planner's spec gets the results as plain numbers (``recovery_phases``, ``failure_rates``), so the
planner stays pure.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from planner.recovery_cost import PHASES, Calibration, calibrate
from service.api.job_story import FAILURES
from service.db.models import Attempt, Event

#: node-days of history needed before ``failure_rates: cluster`` uses this cluster's own rate
MIN_NODE_DAYS = 1000.0
#: the newest recorded recoveries used (older ones describe an older runtime)
MAX_RECOVERIES = 200
DAY_S = 86_400.0


def recorded_phases(session: Session, limit: int = MAX_RECOVERIES) -> list[dict[str, float]]:
    """Phases of the newest ``limit`` recoveries from a failure, newest first."""
    rows = session.execute(sa.select(Event.payload).where(Event.type == "recovery")
                           .order_by(Event.id.desc()).limit(limit * 4)).scalars()
    out: list[dict[str, float]] = []
    for payload in rows:
        if not isinstance(payload, dict) or payload.get("cause") not in FAILURES:
            continue
        phases = payload.get("phases")
        if isinstance(phases, dict) and all(p in phases for p in PHASES):
            out.append({p: phases[p] for p in PHASES})
            if len(out) >= limit:
                break
    return out


def calibration(session: Session) -> Calibration:
    """The base recovery phases: this cluster's recorded recoveries, the prior when there are none."""
    return calibrate(recorded_phases(session))


def _injected_jobs(session: Session) -> set[int]:
    return set(session.execute(sa.select(Event.job_id).where(Event.type == "fault_injected").distinct()).scalars())


def node_exposure(session: Session, gpus_per_node: int, now: dt.datetime | None = None) -> tuple[int, float]:
    """(node losses, node-days) over every attempt of jobs without injected faults."""
    skip = _injected_jobs(session)
    now = now or dt.datetime.now(dt.UTC)
    node_days = 0.0
    for a in session.execute(sa.select(Attempt)).scalars():
        if a.job_id in skip:
            continue
        nodes = len(a.placement) if a.placement else math.ceil(max(0, a.gpus) / max(1, gpus_per_node))
        start = a.started_at if a.started_at.tzinfo else a.started_at.replace(tzinfo=dt.UTC)
        end = a.ended_at or now
        end = end if end.tzinfo else end.replace(tzinfo=dt.UTC)
        node_days += nodes * max(0.0, (end - start).total_seconds()) / DAY_S
    losses = 0
    for job_id, payload in session.execute(sa.select(Event.job_id, Event.payload).where(Event.type == "node_lost")):
        if job_id not in skip:
            nodes = payload.get("nodes") if isinstance(payload, dict) else None
            losses += len(nodes) if isinstance(nodes, list) and nodes else 1
    return losses, node_days


def cluster_rates(session: Session, gpus_per_node: int) -> tuple[dict[str, Any] | str, str]:
    """(what the planner spec's ``failure_rates`` gets, a note): the cluster's numbers once
    :data:`MIN_NODE_DAYS` are recorded, else ``"llama3"`` and why."""
    losses, days = node_exposure(session, gpus_per_node)
    if days < MIN_NODE_DAYS:
        return "llama3", (f"failure_rates cluster: only {days:,.1f} node-days recorded (< {MIN_NODE_DAYS:,.0f} "
                          "needed); priced with llama3")
    return ({"name": "cluster", "node_failures_per_node_day": losses / days, "node_days": round(days, 2),
             "node_losses": losses}, f"failure_rates cluster: {losses} node losses in {days:,.1f} node-days")


def planner_inputs(session: Session, failure_rates: str, gpus_per_node: int) -> tuple[dict[str, Any], str]:
    """The goodput keys of a planner spec (``failure_rates``, ``recovery_phases``) from the event store,
    and a note ("" when none)."""
    note = ""
    rates: dict[str, Any] | str = failure_rates
    if failure_rates == "cluster":
        rates, note = cluster_rates(session, gpus_per_node)
    return {"failure_rates": rates, "recovery_phases": calibration(session).to_dict()}, note


def calibration_at(url: str) -> Calibration:
    """The base recovery phases recorded in the service's database at ``url`` (the prior when none)."""
    from service.db.session import make_engine, make_sessionmaker

    engine = make_engine(url)
    try:
        with make_sessionmaker(engine)() as db:
            return calibration(db)
    finally:
        engine.dispose()


def from_database(url: str, gpus_per_node: int, *, failure_rates: str | None = None,
                  phases: bool = True) -> tuple[dict[str, Any], str]:
    """For the CLI (``orthoplex plan``, ``orthoplex simulate --calibration cluster``): the goodput keys read
    from the service's database at ``url`` (``failure_rates`` only when given; ``recovery_phases`` when
    ``phases``), and a note."""
    from service.db.session import make_engine, make_sessionmaker

    engine = make_engine(url)
    try:
        with make_sessionmaker(engine)() as db:
            out: dict[str, Any] = {}
            note = ""
            if failure_rates is not None:
                out["failure_rates"], note = (cluster_rates(db, gpus_per_node) if failure_rates == "cluster"
                                              else (failure_rates, ""))
            if phases:
                out["recovery_phases"] = calibration(db).to_dict()
            return out, note
    finally:
        engine.dispose()
