"""The state machine and fenced writes: legal/illegal edges, compare-and-set, stale epochs."""

from __future__ import annotations

import itertools
import threading

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from service.db import transitions as tr
from service.db.models import Attempt, Checkpoint, Event, Job, Metric
from service.db.session import make_engine, make_sessionmaker
from tests.service.conftest import new_job, new_tenant
from workers.states import TERMINAL, JobState

STATES = tuple(s.value for s in JobState)

pytestmark = pytest.mark.postgres

DESIGN_EDGES = {
    ("PENDING", "ADMITTED"), ("ADMITTED", "RUNNING"), ("RUNNING", "RECOVERING"), ("RECOVERING", "RUNNING"),
    ("RUNNING", "SUCCEEDED"), ("RUNNING", "FAILED"), ("RECOVERING", "SUCCEEDED"), ("RECOVERING", "FAILED"),
    ("RUNNING", "PREEMPTED"), ("PREEMPTED", "PENDING"),
    ("ADMITTED", "PENDING"), ("ADMITTED", "FAILED"),  # undoing an admission that could not launch
} | {(s, "CANCELLED") for s in STATES if s not in TERMINAL}


@pytest.fixture(scope="module")
def tenant(pg_sessions: sessionmaker[Session]) -> int:
    return new_tenant(pg_sessions, "transitions")


def _job(s: sessionmaker[Session], tenant: int) -> tuple[Session, int, Job]:
    session = s()
    job = session.get(Job, new_job(s, tenant))
    assert job is not None
    return session, job.id, job


def _state(s: sessionmaker[Session], job_id: int) -> tuple[str, int, int]:
    with s() as session:
        j = session.get(Job, job_id)
        assert j is not None
        return j.state, j.epoch, j.event_seq


def _force(s: sessionmaker[Session], job_id: int, state: str) -> None:
    with s() as session:
        session.execute(sa.update(Job).where(Job.id == job_id).values(state=state))
        session.commit()


def test_edge_table_is_design() -> None:
    table = {(a, b) for a, nexts in tr.TRANSITIONS.items() for b in nexts}
    assert table == DESIGN_EDGES
    assert set(tr.TRANSITIONS) == set(STATES)


@pytest.mark.parametrize("old,new", list(itertools.product(STATES, STATES)))
def test_every_pair(pg_sessions: sessionmaker[Session], tenant: int, old: str, new: str) -> None:
    job_id = new_job(pg_sessions, tenant)
    _force(pg_sessions, job_id, old)
    with pg_sessions() as session:
        if (old, new) in DESIGN_EDGES:
            assert tr.transition(session, job_id, expected={old}, new=new, epoch=None, reason="t")
            assert _state(pg_sessions, job_id)[0] == new
            ev = session.scalars(sa.select(Event).where(Event.job_id == job_id)).all()
            assert [(e.type, e.payload["from"], e.payload["to"], e.seq) for e in ev] == [
                ("transition", old, new, 1)
            ]
        else:
            with pytest.raises(tr.IllegalTransition):
                tr.transition(session, job_id, expected={old}, new=new, epoch=None, reason="t")
            assert _state(pg_sessions, job_id) == (old, 0, 0)


def test_cas_refuses_when_state_moved(pg_sessions: sessionmaker[Session], tenant: int) -> None:
    job_id = new_job(pg_sessions, tenant)
    with pg_sessions() as s:
        assert tr.transition(s, job_id, expected={"PENDING"}, new="ADMITTED", epoch=None, reason="a")
        # a second writer that still believes the job is PENDING loses
        assert not tr.transition(s, job_id, expected={"PENDING"}, new="CANCELLED", epoch=None, reason="late")
        assert not tr.transition(s, 10**9, expected={"PENDING"}, new="ADMITTED", epoch=None, reason="missing")
    assert _state(pg_sessions, job_id) == ("ADMITTED", 0, 1)


def test_full_life_with_attempts_and_fencing(pg_sessions: sessionmaker[Session], tenant: int) -> None:
    job_id = new_job(pg_sessions, tenant)
    with pg_sessions() as s:
        e1 = tr.start_attempt(s, job_id, expected={"PENDING"}, new="ADMITTED", expected_epoch=0, reason="admit",
                              plan={"tp": 1}, gpus=2, supervisor="orthoplex-job-1-a1")
        assert e1 == 1
        # a second controller racing with the same view loses
        assert tr.start_attempt(s, job_id, expected={"PENDING"}, new="ADMITTED", expected_epoch=0,
                                reason="dup") is None
        assert tr.transition(s, job_id, expected={"ADMITTED"}, new="RUNNING", epoch=e1, reason="placed")
        assert tr.set_attempt_state(s, job_id, epoch=e1, state="RUNNING")
        assert tr.record_metric(s, job_id, epoch=e1, step=1, loss=2.5) is tr.Recorded.WRITTEN
        assert tr.record_metric(s, job_id, epoch=e1, step=1, loss=9.9) is tr.Recorded.DUPLICATE
        assert tr.record_checkpoint(s, job_id, epoch=e1, step=1, location="/c/1") is tr.Recorded.WRITTEN
        # the attempt is lost; the controller opens attempt 2 (RUNNING -> RECOVERING)
        e2 = tr.start_attempt(s, job_id, expected={"RUNNING"}, new="RECOVERING", expected_epoch=e1,
                              reason="node lost", gpus=1)
        assert e2 == 2
        assert tr.end_attempt(s, job_id, epoch=e1, state="LOST", reason="node lost")
        assert not tr.end_attempt(s, job_id, epoch=e1, state="FAILED")
        before = _counts(s, job_id)
        # every write of the zombie attempt 1 writes nothing
        assert not tr.transition(s, job_id, expected={"RECOVERING"}, new="FAILED", epoch=e1, reason="zombie")
        assert tr.record_metric(s, job_id, epoch=e1, step=2, loss=1.0) is tr.Recorded.STALE
        assert tr.record_checkpoint(s, job_id, epoch=e1, step=2, location="/z") is tr.Recorded.STALE
        assert tr.record_event(s, job_id, epoch=e1, source="a1", seq=7, type="step") is tr.Recorded.STALE
        assert not tr.set_attempt_state(s, job_id, epoch=e1, state="RUNNING")
        assert _counts(s, job_id) == before
        assert _state(pg_sessions, job_id)[:2] == ("RECOVERING", 2)
        # the live attempt writes
        assert tr.record_checkpoint(s, job_id, epoch=e2, step=1, location="/again") is tr.Recorded.DUPLICATE
        assert tr.record_event(s, job_id, epoch=e2, source="a2", seq=0, type="resumed") is tr.Recorded.WRITTEN
        assert tr.record_event(s, job_id, epoch=e2, source="a2", seq=0, type="resumed") is tr.Recorded.DUPLICATE
        assert tr.transition(s, job_id, expected={"RECOVERING"}, new="RUNNING", epoch=e2, reason="resumed")
        assert tr.transition(s, job_id, expected={"RUNNING"}, new="SUCCEEDED", epoch=e2, reason="done",
                             fields={"final_loss": 0.5, "final_step": 10})
        job = s.get(Job, job_id)
        assert job is not None
        assert (job.state, job.final_loss, job.final_step, job.gpus_allocated) == ("SUCCEEDED", 0.5, 10, 0)
        assert job.admitted_at and job.started_at and job.finished_at
        attempts = s.scalars(sa.select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.epoch)).all()
        assert [(a.number, a.epoch, a.state) for a in attempts] == [(1, 1, "LOST"), (2, 2, "STARTING")]
        control = s.scalars(sa.select(Event).where(Event.job_id == job_id, Event.source == "control")
                            .order_by(Event.seq)).all()
        path = [(e.payload["from"], e.payload["to"]) for e in control]
        assert path == [("PENDING", "ADMITTED"), ("ADMITTED", "RUNNING"), ("RUNNING", "RECOVERING"),
                        ("RECOVERING", "RUNNING"), ("RUNNING", "SUCCEEDED")]
        assert all(tr.is_legal(a, b) for a, b in path)
        assert [e.seq for e in control] == [1, 2, 3, 4, 5]


def _counts(s: Session, job_id: int) -> tuple[int, ...]:
    return tuple(
        s.scalar(sa.select(sa.func.count()).select_from(m).where(m.job_id == job_id)) or 0
        for m in (Event, Metric, Checkpoint, Attempt)
    )


def test_transition_rejects_unknown_fields(pg_sessions: sessionmaker[Session], tenant: int) -> None:
    job_id = new_job(pg_sessions, tenant)
    with pg_sessions() as s, pytest.raises(ValueError):
        tr.transition(s, job_id, expected={"PENDING"}, new="ADMITTED", epoch=None, reason="x",
                      fields={"tenant_id": 99})
    assert _state(pg_sessions, job_id) == ("PENDING", 0, 0)


def test_request_cancel(pg_sessions: sessionmaker[Session], tenant: int) -> None:
    other = new_tenant(pg_sessions, "cancel-other")
    pending, running, done = (new_job(pg_sessions, tenant) for _ in range(3))
    _force(pg_sessions, running, "RUNNING")
    _force(pg_sessions, done, "SUCCEEDED")
    with pg_sessions() as s:
        assert tr.request_cancel(s, pending, tenant_id=other) is tr.CancelOutcome.MISSING
        assert tr.request_cancel(s, pending, tenant_id=tenant) is tr.CancelOutcome.CANCELLED
        assert tr.request_cancel(s, running, tenant_id=tenant) is tr.CancelOutcome.REQUESTED
        assert tr.request_cancel(s, running, tenant_id=tenant) is tr.CancelOutcome.ALREADY_REQUESTED
        assert tr.request_cancel(s, done) is tr.CancelOutcome.TERMINAL
    assert _state(pg_sessions, pending)[0] == "CANCELLED"
    with pg_sessions() as s:
        job = s.get(Job, running)
        assert job is not None and job.state == "RUNNING" and job.cancel_requested


def test_racing_writers_exactly_one_wins(pg_url: str, tenant: int, pg_sessions: sessionmaker[Session]) -> None:
    """16 threads race PENDING -> ADMITTED / CANCELLED on 20 jobs: each job moves exactly once."""
    engine = make_engine(pg_url, pool_size=16)
    sessions = make_sessionmaker(engine)
    jobs = [new_job(pg_sessions, tenant) for _ in range(20)]
    wins: list[tuple[int, str]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(16)

    def worker(i: int) -> None:
        target = "ADMITTED" if i % 2 else "CANCELLED"
        barrier.wait()
        with sessions() as s:
            for j in jobs:
                if tr.transition(s, j, expected={"PENDING"}, new=target, epoch=None, reason=f"w{i}"):
                    with lock:
                        wins.append((j, target))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    engine.dispose()
    assert sorted(j for j, _ in wins) == sorted(jobs)
    with pg_sessions() as s:
        for j, target in wins:
            job = s.get(Job, j)
            assert job is not None and job.state == target and job.event_seq == 1
            n = s.scalar(sa.select(sa.func.count()).select_from(Event).where(Event.job_id == j))
            assert n == 1


def test_sqlite_cas_and_fencing(sqlite_url: str) -> None:
    engine = make_engine(sqlite_url)
    sessions = make_sessionmaker(engine)
    t = new_tenant(sessions, "lite")
    job_id = new_job(sessions, t)
    with sessions() as s:
        e1 = tr.start_attempt(s, job_id, expected={"PENDING"}, new="ADMITTED", expected_epoch=0, reason="a")
        assert e1 == 1
        assert tr.record_metric(s, job_id, epoch=1, step=1, loss=1.0)
        assert tr.record_metric(s, job_id, epoch=1, step=1, loss=1.0) is tr.Recorded.DUPLICATE
        assert tr.record_metric(s, job_id, epoch=0, step=2, loss=1.0) is tr.Recorded.STALE
        assert not tr.transition(s, job_id, expected={"ADMITTED"}, new="RUNNING", epoch=0, reason="stale")
        assert tr.transition(s, job_id, expected={"ADMITTED"}, new="RUNNING", epoch=1, reason="ok")
        job = s.get(Job, job_id)
        assert job is not None and job.state == "RUNNING" and job.started_at is not None
        assert job.started_at.tzinfo is not None
    engine.dispose()
