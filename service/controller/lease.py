"""Leader election: one active controller among any number of service replicas.

A row of the ``leases`` table (``name`` primary key, ``holder``, ``epoch``, ``expires_at``) is the
lease. Every change is a compare-and-set ``UPDATE``:

* **renew**: ``... SET expires_at = now + ttl WHERE name AND holder = me AND epoch = mine AND
  expires_at > now`` — only the holder, only while it still holds it;
* **take over**: ``... SET holder = me, epoch = epoch + 1, expires_at = now + ttl WHERE name AND
  epoch = <the epoch I read> AND expires_at <= now`` — of two contenders that read the same expired
  row, exactly one matches (Postgres re-checks the ``WHERE`` on the row after the other's commit);
* **first ever**: ``INSERT`` of epoch 1; a concurrent insert loses on the primary key.

Times come from the database clock on Postgres (``clock_timestamp()``), never from the replicas'
clocks; SQLite (one host, zero-setup mode) uses this process's UTC clock.

Holding the lease is necessary but not sufficient to write: every controller transaction also calls
:meth:`LeaderLease.guard`, which re-reads the row *inside that transaction* (``FOR SHARE`` on
Postgres, so a takeover waits for the transaction to finish) and raises :class:`LeaseLost` when this
replica is no longer the holder of the epoch it thinks it holds. A paused or partitioned ex-leader
therefore cannot commit anything after another replica took over.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.db.models import Lease
from service.log import get_logger

log = get_logger("service.controller.lease")

LEASES: sa.Table = Lease.__table__  # type: ignore[assignment]

CONTROLLER_LEASE = "controller"


class LeaseLost(RuntimeError):
    """This replica is not (or no longer) the leader; whatever it was doing must not commit."""


def new_holder_id() -> str:
    """A holder id unique per controller instance (host-independent)."""
    return f"ctl-{uuid.uuid4().hex[:12]}"


def db_now(conn: Connection | Session) -> datetime:
    """The database's clock on Postgres, this process's UTC clock elsewhere (naive on SQLite)."""
    bind = conn.get_bind() if isinstance(conn, Session) else conn
    if bind.dialect.name == "postgresql":
        return conn.execute(sa.text("SELECT clock_timestamp()")).scalar_one()
    return datetime.now(UTC).replace(tzinfo=None)


class LeaderLease:
    """One replica's view of the controller lease.

    ``epoch`` is the lease epoch this replica holds (``None`` when it is not the leader);
    ``valid()`` is a local, conservative check (monotonic clock, a safety margin under the TTL) used
    to stop acting early; :meth:`guard` is the authoritative check inside a transaction.
    """

    def __init__(
        self,
        engine: Engine,
        holder: str | None = None,
        name: str = CONTROLLER_LEASE,
        ttl_s: float = 10.0,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be > 0")
        self.engine = engine
        self.holder = holder or new_holder_id()
        self.name = name
        self.ttl = timedelta(seconds=ttl_s)
        self.ttl_s = ttl_s
        self.epoch: int | None = None
        self._deadline = 0.0
        self._lock = threading.Lock()

    # -- local view -------------------------------------------------------------------------------
    def valid(self) -> bool:
        """True while this replica holds the lease and its local deadline has not passed."""
        with self._lock:
            return self.epoch is not None and time.monotonic() < self._deadline

    def _held(self, epoch: int, started: float) -> None:
        with self._lock:
            self.epoch = epoch
            # the lease runs from the DB's now (taken after `started`); keep a 20% margin
            self._deadline = started + 0.8 * self.ttl_s

    def _lost(self) -> None:
        with self._lock:
            if self.epoch is not None:
                log.warning("controller lease lost", extra={"holder": self.holder, "epoch": self.epoch})
            self.epoch = None
            self._deadline = 0.0

    # -- database operations ----------------------------------------------------------------------
    def acquire_or_renew(self) -> bool:
        """Renew the lease if held, else try to take it over; True when this replica is the leader."""
        started = time.monotonic()
        try:
            epoch = self._acquire_or_renew()
        except IntegrityError:
            epoch = None  # a concurrent first insert won
        if epoch is None:
            self._lost()
            return False
        if self.epoch != epoch:
            log.info("controller lease acquired", extra={"holder": self.holder, "epoch": epoch})
        self._held(epoch, started)
        return True

    def _acquire_or_renew(self) -> int | None:
        c = LEASES.c
        with self.engine.begin() as conn:
            now = db_now(conn)
            expires = now + self.ttl
            mine = self.epoch
            if mine is not None:
                res = conn.execute(
                    sa.update(LEASES)
                    .where(c.name == self.name, c.holder == self.holder, c.epoch == mine, c.expires_at > now)
                    .values(expires_at=expires)
                )
                if res.rowcount == 1:
                    return mine
            row = conn.execute(sa.select(c.holder, c.epoch, c.expires_at).where(c.name == self.name)).first()
            if row is None:
                conn.execute(
                    sa.insert(LEASES).values(name=self.name, holder=self.holder, epoch=1, expires_at=expires)
                )
                return 1
            if _as_naive_utc(row.expires_at) > _as_naive_utc(now):
                return None  # someone (maybe an earlier incarnation of me) holds it
            res = conn.execute(
                sa.update(LEASES)
                .where(c.name == self.name, c.epoch == row.epoch, c.expires_at <= now)
                .values(holder=self.holder, epoch=row.epoch + 1, expires_at=expires)
            )
            return row.epoch + 1 if res.rowcount == 1 else None

    def release(self) -> None:
        """Give the lease up now (graceful stop) so another replica can take over at once."""
        mine = self.epoch
        self._lost()
        if mine is None:
            return
        c = LEASES.c
        with self.engine.begin() as conn:
            now = db_now(conn)
            conn.execute(
                sa.update(LEASES)
                .where(c.name == self.name, c.holder == self.holder, c.epoch == mine)
                .values(expires_at=now - timedelta(seconds=1))
            )

    def guard(self, session: Session) -> None:
        """Inside a transaction: raise :class:`LeaseLost` unless this replica still holds its epoch.

        On Postgres the row is read ``FOR SHARE``, so a takeover (an ``UPDATE`` of the row) waits
        until this transaction ends: nothing this replica commits can interleave with a new leader.
        """
        mine = self.epoch
        if mine is None or not self.valid():
            raise LeaseLost(f"{self.holder} does not hold the controller lease")
        c = LEASES.c
        q = sa.select(c.holder, c.epoch, c.expires_at).where(c.name == self.name)
        if session.get_bind().dialect.name == "postgresql":
            q = q.with_for_update(read=True)
        row = session.execute(q).first()
        now = db_now(session)
        if (
            row is None
            or row.holder != self.holder
            or row.epoch != mine
            or _as_naive_utc(row.expires_at) <= _as_naive_utc(now)
        ):
            self._lost()
            raise LeaseLost(f"{self.holder} lost the controller lease (epoch {mine})")

    def current(self) -> tuple[str, int, datetime] | None:
        """(holder, epoch, expires_at) of the lease row, for tests and diagnostics."""
        c = LEASES.c
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(c.holder, c.epoch, c.expires_at).where(c.name == self.name)).first()
        return None if row is None else (row.holder, int(row.epoch), row.expires_at)


def _as_naive_utc(value: datetime) -> datetime:
    if value.tzinfo is not None:
        return value.astimezone(UTC).replace(tzinfo=None)
    return value
