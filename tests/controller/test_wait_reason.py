"""A PENDING job's ``reason`` says why it still waits: the scheduler's latest ``Wait`` reason, written
by the controller (fenced on the job's epoch), shown by ``status`` and the API without reading events."""

from __future__ import annotations

import pytest

from service.controller.apply import apply_decisions
from service.controller.cluster_snapshot import load_db_state
from service.controller.context import ControllerConfig, Ctx
from service.controller.lease import LeaderLease
from service.controller.supervisors import Supervisors
from service.db import transitions as tx
from service.db.session import make_engine
from service.scheduler.types import Wait
from tests.controller import helpers as h

pytestmark = pytest.mark.postgres


def test_wait_reason_reaches_the_job_row_and_follows_the_cause(migrated_db_url: str) -> None:
    engine = make_engine(migrated_db_url)
    try:
        lease = LeaderLease(engine, "ctl-wait", name="t-wait", ttl_s=30)
        assert lease.acquire_or_renew()
        ctx = Ctx(engine, lease, Supervisors(), ControllerConfig())
        tid = h.add_tenant(engine, "waiter")
        jid = h.add_job(engine, tid, "w", h.tiny_spec(4), gpus=1)
        assert h.job(engine, jid).reason == "submitted"

        def jobs():
            with ctx.read() as s:
                return {j.id: j for j in load_db_state(s).jobs}

        no_gpus = "needs at least 1 GPU(s); the cluster has 0 (no healthy node declares GPUs)"
        apply_decisions(ctx, jobs(), [Wait(jid, no_gpus)])
        assert h.job(engine, jid).reason == no_gpus
        assert [e.payload["reason"] for e in h.events(engine, jid) if e.type == "decision"] == [no_gpus]
        # the cause changes: so does the reason (and one more decision event)
        quota = "non-preemptible jobs run only within quota: tenant quota of 4 GPUs, 4 in use by jobs 3, 7"
        apply_decisions(ctx, jobs(), [Wait(jid, quota)])
        assert h.job(engine, jid).reason == quota
        # fenced: a stale epoch writes nothing; a job that left PENDING keeps its own reason
        with ctx.txn() as s:
            assert not tx.set_wait_reason(s, jid, epoch=99, reason="stale", commit=False)
        with ctx.txn() as s:
            assert tx.transition(s, jid, expected={"PENDING"}, new="CANCELLED", epoch=None, reason="cancelled",
                                 commit=False)
        with ctx.txn() as s:
            assert not tx.set_wait_reason(s, jid, epoch=0, reason="late", commit=False)
        assert h.job(engine, jid).reason == "cancelled"
    finally:
        engine.dispose()
