"""A cancel racing a preemption: the tenant cancels a running job just as the controller preempts
it. The job must end CANCELLED (it used to sit in PENDING with ``cancel_requested`` forever, never
admitted, never cancelled, still counted against ``max_jobs``)."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session, sessionmaker

from service.db import transitions as tr
from service.db.models import Job
from tests.service.conftest import new_job, new_tenant

pytestmark = pytest.mark.postgres


def _running(sessions: sessionmaker[Session], name: str) -> int:
    jid = new_job(sessions, new_tenant(sessions, name))
    with sessions() as s:
        assert tr.start_attempt(s, jid, expected={"PENDING"}, new="ADMITTED", expected_epoch=0, reason="t", gpus=2)
        assert tr.transition(s, jid, expected={"ADMITTED"}, new="RUNNING", epoch=1, reason="t")
    return jid


def test_cancel_then_preempt_ends_cancelled(pg_sessions: sessionmaker[Session]) -> None:
    jid = _running(pg_sessions, "race-preempt")
    with pg_sessions() as s:
        assert tr.request_cancel(s, jid) is tr.CancelOutcome.REQUESTED
    with pg_sessions() as s:  # the controller's preemption, as events_pull does it
        assert tr.transition(s, jid, expected={"RUNNING"}, new="PREEMPTED", epoch=1, reason="preempted", commit=False)
        tr.transition(s, jid, expected={"PREEMPTED"}, new="PENDING", epoch=1, reason="requeued", commit=False)
        s.commit()
    with pg_sessions() as s:
        job = s.get(Job, jid)
        assert (job.state, job.gpus_allocated) == ("CANCELLED", 0)
        assert job.finished_at is not None
        assert tr.request_cancel(s, jid) is tr.CancelOutcome.TERMINAL


def test_cancel_then_admission_undo_ends_cancelled(pg_sessions: sessionmaker[Session]) -> None:
    jid = new_job(pg_sessions, new_tenant(pg_sessions, "race-requeue"))
    with pg_sessions() as s:
        assert tr.start_attempt(s, jid, expected={"PENDING"}, new="ADMITTED", expected_epoch=0, reason="t", gpus=1)
        assert tr.request_cancel(s, jid) is tr.CancelOutcome.REQUESTED
        # placement timed out: the controller requeues the admission
        tr.transition(s, jid, expected={"ADMITTED"}, new="PENDING", epoch=1, reason="placement timed out")
    with pg_sessions() as s:
        assert s.get(Job, jid).state == "CANCELLED"
