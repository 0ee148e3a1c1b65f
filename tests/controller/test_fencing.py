"""Fencing in the controller's writes: a stale attempt, or an ex-leader, writes nothing."""

from __future__ import annotations

import time

import pytest

from service.controller.context import ControllerConfig
from service.controller.events_pull import JobRef, store_events
from service.controller.lease import LeaseLost
from service.controller.loop import Controller
from service.db import transitions as tx
from service.db.session import make_engine, make_sessionmaker
from tests.controller import helpers as h
from workers.runtime.contract import events as ev


def _step(seq: int, loss: float) -> dict:
    return ev.StepDone(seq=seq, ts=time.time(), step=0, loss=loss, wall_s=0.1, busy_max_s=0.1, world_size=2,
                       tokens_per_s=10.0).to_dict()


def _finished(seq: int) -> dict:
    return ev.Finished(seq=seq, ts=time.time(), final_step=4, final_loss=1.0, failures=0, recoveries=0).to_dict()

pytestmark = pytest.mark.postgres


def test_stale_attempt_and_ex_leader_write_nothing(migrated_db_url: str, tmp_path) -> None:
    engine = make_engine(migrated_db_url)
    tenant = h.add_tenant(engine, "t")
    job_id = h.add_job(engine, tenant, "j", h.tiny_spec(4), gpus=2)
    cfg = ControllerConfig(lease_ttl_s=2.0, storage_path=tmp_path)
    leader, standby = Controller(engine, cfg, holder="a"), Controller(engine, cfg, holder="b")
    assert leader.heartbeat() and not standby.heartbeat()
    sm = make_sessionmaker(engine)
    with sm() as s:  # attempt 1, then attempt 2 (as after a vanished supervisor)
        assert (
            tx.start_attempt(s, job_id, expected={"PENDING"}, new="ADMITTED", expected_epoch=0, reason="t")
            == 1
        )
        assert tx.transition(s, job_id, expected={"ADMITTED"}, new="RUNNING", epoch=1, reason="t")
    old = JobRef(job_id, "RUNNING", attempt=1, epoch=1)
    step = _step(1, 5.0)
    assert leader.heartbeat()  # (renew before each write: the machine may be slow)
    assert store_events(leader.ctx, old, [step]).stored == 1
    with sm() as s:
        assert (
            tx.start_attempt(s, job_id, expected={"RUNNING"}, new="RECOVERING", expected_epoch=1, reason="t")
            == 2
        )
    before = (len(h.events(engine, job_id)), len(h.metrics(engine, job_id)), h.state(engine, job_id))
    # attempt 1 is fenced: its later events (a step, a checkpoint, even "finished") change nothing
    late = [
        ev.CheckpointSaved(seq=2, ts=time.time(), step=1, path="/x", seconds=0.1, bytes=1, next_interval_steps=2,
                           cadence={}).to_dict(),
        _finished(3),
    ]
    assert leader.heartbeat()
    res = store_events(leader.ctx, old, late)
    assert res.stale and res.stored == 0 and res.final is None
    assert (len(h.events(engine, job_id)), len(h.metrics(engine, job_id)), h.state(engine, job_id)) == before
    assert h.checkpoints(engine, job_id) == []
    # the current attempt writes, once, even when the same batch is stored twice
    cur = JobRef(job_id, "RECOVERING", attempt=2, epoch=2)
    plan = ev.PlanChosen(seq=1, ts=time.time(), layout={"tp": 1, "dp": 2}, short="dp2", num_gpus=2, nodes=["n1"],
                         predicted_tokens_per_s=10.0, predicted_step_time_s=0.1).to_dict()
    placed = ev.Placed(seq=2, ts=time.time(), gpus=2, placement_group="orthoplex-1-a2", gpus_per_node={"n1": 2},
                       bundle_nodes=["n1", "n1"], seconds=0.1, strategy="PACK").to_dict()
    batch = [plan, placed, _step(3, 4.0)]
    assert leader.heartbeat()
    assert store_events(leader.ctx, cur, batch).stored == 3
    assert h.state(engine, job_id) == "RUNNING"  # a step of the new attempt ends the recovery
    last = h.attempts(engine, job_id)[-1]
    assert (last.epoch, last.state, last.plan["short"]) == (2, "RUNNING", "dp2")
    # where the GPUs are is on the attempt row (what the scheduler's snapshot reads)
    assert (last.placement, last.placement_group, last.gpus) == ({"n1": 2}, "orthoplex-1-a2", 2)
    leader.ctx.cursors.clear()
    assert leader.heartbeat()
    assert store_events(leader.ctx, cur, batch).stored == 0
    # the leader stops renewing; the standby takes over; the ex-leader, still believing, writes nothing
    held = leader.lease.epoch
    assert held is not None
    time.sleep(2.1)
    assert standby.heartbeat() and standby.lease.epoch == held + 1
    leader.lease.epoch, leader.lease._deadline = held, time.monotonic() + 60
    before = len(h.events(engine, job_id))
    with pytest.raises(LeaseLost):
        store_events(leader.ctx, cur, [_finished(4)])
    assert len(h.events(engine, job_id)) == before and h.state(engine, job_id) == "RUNNING"
    assert leader.tick().leader is False  # the lease check demoted it
    engine.dispose()
