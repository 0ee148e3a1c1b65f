"""Leader election on the ``leases`` table: exactly one holder, takeover after expiry, fencing."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa

from service.controller.lease import LEASES, LeaderLease, LeaseLost
from service.db.session import make_engine, make_sessionmaker

pytestmark = pytest.mark.postgres


def test_one_holder_then_takeover_after_expiry(migrated_db_url: str) -> None:
    engine = make_engine(migrated_db_url)
    a = LeaderLease(engine, "ctl-a", name="t-takeover", ttl_s=2.5)
    b = LeaderLease(engine, "ctl-b", name="t-takeover", ttl_s=2.5)
    assert a.acquire_or_renew() is True
    assert a.epoch == 1
    assert b.acquire_or_renew() is False and b.epoch is None
    assert a.acquire_or_renew() is True and a.epoch == 1  # renewal keeps the epoch
    time.sleep(2.7)  # a stops renewing
    assert b.acquire_or_renew() is True and b.epoch == 2  # takeover increments the epoch
    # the old holder cannot renew, and its guard refuses inside a transaction
    assert a.acquire_or_renew() is False
    sm = make_sessionmaker(engine)
    with sm() as s, pytest.raises(LeaseLost):
        a.epoch, a._deadline = 1, time.monotonic() + 10  # a paused ex-leader that still believes
        a.guard(s)
    with sm() as s:
        b.guard(s)  # the new holder passes
    b.release()
    assert a.acquire_or_renew() is True and a.epoch == 3  # release lets the next one in at once
    engine.dispose()


def test_concurrent_contenders_elect_exactly_one(migrated_db_url: str) -> None:
    """16 threads race for an expired lease 5 times over: every round has exactly one winner."""
    engine = make_engine(migrated_db_url)
    for rnd in range(5):
        contenders = [LeaderLease(engine, f"c{rnd}-{i}", name="t-race", ttl_s=30) for i in range(16)]
        barrier = threading.Barrier(len(contenders))
        results: list[bool] = []

        def go(lease: LeaderLease, barrier: threading.Barrier, results: list[bool]) -> None:
            barrier.wait()
            results.append(lease.acquire_or_renew())

        threads = [threading.Thread(target=go, args=(c, barrier, results)) for c in contenders]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sum(results) == 1, results
        winner = next(c for c in contenders if c.epoch is not None)
        assert winner.epoch == rnd + 1
        with engine.begin() as conn:  # expire it for the next round
            conn.execute(
                sa.update(LEASES)
                .where(LEASES.c.name == "t-race")
                .values(expires_at=sa.func.now() - sa.text("interval '1 second'"))
            )
    engine.dispose()


def test_guard_blocks_takeover_until_the_transaction_ends(migrated_db_url: str) -> None:
    """A takeover UPDATE waits for the leader's open transaction (FOR SHARE), so nothing interleaves."""
    engine = make_engine(migrated_db_url)
    a = LeaderLease(engine, "ctl-a", name="t-guard", ttl_s=3.0)
    b = LeaderLease(engine, "ctl-b", name="t-guard", ttl_s=5.0)
    assert a.acquire_or_renew()
    sm = make_sessionmaker(engine)
    took: list[float] = []
    with sm() as s:
        a.guard(s)  # (within 80% of the TTL of the acquisition above)
        t0 = time.monotonic()
        time.sleep(3.1)  # a's lease expires while its transaction is still open
        th = threading.Thread(
            target=lambda: took.append(time.monotonic() - t0) if b.acquire_or_renew() else None
        )
        th.start()
        time.sleep(0.8)
        assert took == []  # b is blocked behind a's share lock
        s.commit()
    th.join(timeout=10)
    assert took and took[0] >= 3.9 and b.epoch == 2
    engine.dispose()
