"""Prometheus metrics of the API process (``GET /metrics``), in a registry per app.

From the job store, read at most every ``metrics_cache_s``: ``orthoplex_jobs{state}``,
``orthoplex_gpus_allocated{tenant}``, ``orthoplex_queue_wait_seconds`` (submission → admission of
jobs admitted in the last 24 h), ``orthoplex_pending_oldest_seconds``, ``orthoplex_recoveries_total``
(transitions into RECOVERING). From the requests: ``orthoplex_api_request_seconds{method,route,status}``
(time to the response head; ``method`` is one of :data:`METHODS` or ``other``, ``route`` a route
template or ``unmatched``: every label value comes from a bounded set).

Per-tenant series (``orthoplex_gpus_allocated{tenant}``) live in a second registry that
``GET /metrics`` adds only for the admin token or ``ORTHOPLEX_METRICS_TOKEN``.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.db.models import Event, Job, Tenant, utcnow
from workers.states import JobState

TENANT_FAMILY = "orthoplex_gpus_allocated"
WAIT_BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 24 * 3600.0)
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def _aware(t: dt.datetime) -> dt.datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=dt.UTC)


class StoreCollector(Collector):
    """Gauges computed from the job store at scrape time (cached)."""

    def __init__(self, sessions: Any, cache_s: float) -> None:
        self.sessions = sessions
        self.cache_s = cache_s
        self._lock = threading.Lock()
        self._at = 0.0
        self._cached: list[Metric] = []

    def collect(self) -> Iterator[Metric]:
        """The series without tenant labels."""
        yield from (m for m in self._metrics() if m.name != TENANT_FAMILY)

    def tenant_series(self) -> Collector:
        """A collector of the per-tenant series only (for the restricted registry)."""
        store = self

        class _Tenant(Collector):
            def collect(self) -> Iterator[Metric]:
                yield from (m for m in store._metrics() if m.name == TENANT_FAMILY)

        return _Tenant()

    def _metrics(self) -> list[Metric]:
        with self._lock:
            if not self._cached or time.monotonic() - self._at > self.cache_s:
                self._cached = self._read()
                self._at = time.monotonic()
            return self._cached

    def _read(self) -> list[Metric]:
        now = utcnow()
        with self.sessions() as s:
            by_state = dict(s.execute(sa.select(Job.state, sa.func.count()).group_by(Job.state)).all())
            gpus = s.execute(
                sa.select(Tenant.name, sa.func.coalesce(sa.func.sum(Job.gpus_allocated), 0))
                .join(Job, Job.tenant_id == Tenant.id)
                .where(Job.gpus_allocated > 0)
                .group_by(Tenant.name)
            ).all()
            waits = s.execute(
                sa.select(Job.created_at, Job.admitted_at)
                .where(Job.admitted_at.is_not(None), Job.admitted_at > now - dt.timedelta(days=1))
                .limit(100_000)
            ).all()
            oldest = s.scalar(sa.select(sa.func.min(Job.created_at)).where(Job.state == JobState.PENDING))
            recoveries = s.scalar(
                sa.select(sa.func.count()).select_from(Event).where(
                    Event.type == "transition", Event.payload["to"].as_string() == str(JobState.RECOVERING)
                )
            )
        jobs = GaugeMetricFamily("orthoplex_jobs", "Jobs by state", labels=["state"])
        for state in JobState:
            jobs.add_metric([state], by_state.get(state, 0))
        alloc = GaugeMetricFamily("orthoplex_gpus_allocated", "GPUs allocated per tenant", labels=["tenant"])
        for name, n in gpus:
            alloc.add_metric([name], float(n))
        values = [(_aware(a) - _aware(c)).total_seconds() for c, a in waits]
        buckets = [(str(b), sum(1 for v in values if v <= b)) for b in WAIT_BUCKETS]
        buckets.append(("+Inf", len(values)))
        wait = HistogramMetricFamily("orthoplex_queue_wait_seconds",
                                     "Submission to admission, jobs admitted in the last 24 h",
                                     buckets=buckets, sum_value=sum(values))
        pending = GaugeMetricFamily("orthoplex_pending_oldest_seconds", "Age of the oldest pending job",
                                    value=(now - _aware(oldest)).total_seconds() if oldest else 0.0)
        rec = CounterMetricFamily("orthoplex_recoveries", "Transitions into RECOVERING", value=recoveries or 0)
        return [jobs, alloc, wait, pending, rec]


def make_registry(sessions: Any, cache_s: float) -> tuple[CollectorRegistry, CollectorRegistry, Histogram]:
    """``(public registry, per-tenant registry, request latency histogram)``."""
    registry = CollectorRegistry(auto_describe=False)
    store = StoreCollector(sessions, cache_s)
    registry.register(store)
    tenants = CollectorRegistry(auto_describe=False)
    tenants.register(store.tenant_series())
    latency = Histogram("orthoplex_api_request_seconds", "API latency (to the response head)",
                        ["method", "route", "status"], registry=registry, buckets=LATENCY_BUCKETS)
    return registry, tenants, latency


class LatencyMiddleware:
    """Pure ASGI middleware observing the time to the response head, labelled by route template."""

    def __init__(self, app: ASGIApp, histogram: Histogram) -> None:
        self.app = app
        self.histogram = histogram

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()

        async def timed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                route = scope.get("route")
                path = getattr(route, "path", None) or "unmatched"
                method = scope["method"] if scope["method"] in METHODS else "other"
                self.histogram.labels(method, path, str(message["status"])).observe(
                    time.perf_counter() - start
                )
            await send(message)

        await self.app(scope, receive, timed_send)
