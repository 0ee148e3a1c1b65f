"""Requests that count toward a tenant's submission rate without creating a job: the requests that
can make the planner search (dry runs, ``POST /v1/plans``, and the dashboard's explain) and refused
submissions. Kept in memory per API process (a sliding window of ``repo.RATE_WINDOW_S``);
``repo.check_limits`` adds them to the jobs the tenant created."""

from __future__ import annotations

import datetime as dt
import threading
from collections import deque

from sqlalchemy.orm import Session, sessionmaker

from service.api import repo
from service.db.models import Tenant, utcnow


class AttemptLog:
    """Timestamps of a tenant's job-less attempts within the rate window."""

    def __init__(self, window_s: float, max_tenants: int = 100_000) -> None:
        self.window = dt.timedelta(seconds=window_s)
        self.max_tenants = max_tenants
        self._at: dict[int, deque[dt.datetime]] = {}
        self._lock = threading.Lock()

    def record(self, tenant_id: int) -> None:
        now = utcnow()
        with self._lock:
            q = self._at.setdefault(tenant_id, deque())
            q.append(now)
            self._trim(q, now)
            if len(self._at) > self.max_tenants:  # forget idle tenants
                for tid in [t for t, d in self._at.items() if not d]:
                    del self._at[tid]

    def recent(self, tenant_id: int, limit: int) -> list[dt.datetime]:
        """Up to ``limit`` attempt times in the window, oldest first."""
        now = utcnow()
        with self._lock:
            q = self._at.get(tenant_id)
            if not q:
                return []
            self._trim(q, now)
            return list(q)[:limit]

    def _trim(self, q: deque[dt.datetime], now: dt.datetime) -> None:
        while q and q[0] <= now - self.window:
            q.popleft()


def charge_planning(sessions: sessionmaker[Session], attempts: AttemptLog, tenant: Tenant) -> None:
    """A request that may make the planner search without creating a job (a dry run, an explain):
    :class:`repo.LimitExceeded` (429) over the tenant's rate, else it is recorded. The limits are
    read in a short transaction of its own, ended before the caller plans."""
    with sessions() as db:
        repo.check_limits(db, tenant, lock=False, jobs=False,
                          attempts=attempts.recent(tenant.id, tenant.submit_per_minute))
    attempts.record(tenant.id)
