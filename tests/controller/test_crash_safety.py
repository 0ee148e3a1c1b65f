"""kill -9 of controller processes during admission, running, recovery and cancel; two replicas.

One scenario, real everything: controller processes (``python -m service.controller``, what a
service replica runs) against a Postgres database and the session Ray cluster, a tiny model trained
by the real runtime. Each controller is SIGKILLed at a different point and another one started:

1. admission, attempt persisted but no supervisor yet      (crash point ``admit:persisted``)
2. admission, supervisor started but RUNNING not recorded   (crash point ``admit:started``)
3. running: two replicas; only the lease holder acts; kill -9 it; the standby takes over
4. recovery: a worker node of the job is killed; once the job is RECOVERING, kill -9 the controller
5. cancel: ``cancel()`` sent to a second job's supervisor, nothing recorded yet (``cancel:asked``)

and in the end: the first job SUCCEEDED exactly once, with every step's metric and every checkpoint
stored once, the runtime's events stored without gap or duplicate, never two supervisors of one job
alive at once, the cancelled job CANCELLED once, and no supervisor left behind.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from service.controller.cluster import cluster_view
from service.controller.lease import LeaderLease
from service.db import transitions as tx
from service.db.session import make_engine, make_sessionmaker
from tests.controller import helpers as h

pytestmark = [pytest.mark.postgres, pytest.mark.cluster]

STEPS = 200  # long enough to be still running at stage 4 on a quiet machine (a tiny step is ~0.1 s)
# one gang whose placement group the attempt row records (``recovery: auto`` would make these 2-GPU
# jobs two replica groups of one GPU, each with a placement group of its own; the controller's
# accounting of those: tests/controller/test_recovery_groups.py)
ONE_GANG = {"policy": "replan"}


def _job_nodes(engine, job_id: int) -> set[str]:
    """The nodes of the job's GPUs as its attempt row records them (from the runtime's ``placed``
    event), checked against the placement group Ray reports under the name recorded with them."""
    live = h.attempts(engine, job_id)[-1]
    recorded = set((live.placement or {}).keys())
    view = cluster_view()
    in_ray = {n.node_id for n in view.alive_nodes for a in n.allocations if a.name == live.placement_group}
    assert recorded == in_ray, (live.placement, live.placement_group, in_ray)
    return recorded


@pytest.mark.timeout(900)  # a few minutes on an idle machine; far longer on a loaded one
def test_kill9_during_admission_running_recovery_and_cancel(
    ray_cluster, migrated_db_url: str, tmp_path: Path
):
    engine = make_engine(migrated_db_url)
    tenant = h.add_tenant(engine, "acme", quota=12)
    a = h.add_job(engine, tenant, "survivor", h.tiny_spec(STEPS, every=3, recovery=ONE_GANG), gpus=2)
    procs: list[h.ControllerProcess] = []
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    n = 0

    def controller(crash_at: str | None = None) -> h.ControllerProcess:
        nonlocal n
        n += 1
        p = h.ControllerProcess(
            migrated_db_url,
            ray_cluster.address,
            tmp_path / "storage",
            tmp_path / f"c{n}.log",
            holder=f"c{n}",
            crash_at=crash_at,
        )
        procs.append(p)
        return p

    def at_most_one_supervisor() -> None:
        assert len(h.live_supervisors(a)) <= 1, h.live_supervisors(a)

    def lease_holder() -> str | None:
        cur = LeaderLease(engine).current()
        return cur[0] if cur else None

    try:
        # 1. kill -9 after the attempt is persisted, before its supervisor exists
        c1 = controller("admit:persisted")
        assert c1.wait(120) == -9, c1.log_text()
        assert h.state(engine, a) == "ADMITTED"
        assert [(x.number, x.state) for x in h.attempts(engine, a)] == [(1, "STARTING")]
        assert h.live_supervisors(a) == []
        timings["1_admission_persisted_s"] = time.monotonic() - t0

        # 2. restart: attempt 1 has no supervisor -> attempt 2; kill -9 once its supervisor exists
        c2 = controller("admit:started")
        assert c2.wait(120) == -9, c2.log_text()
        assert h.state(engine, a) == "ADMITTED"
        assert [(x.number, x.state) for x in h.attempts(engine, a)] == [(1, "LOST"), (2, "STARTING")]
        assert h.live_supervisors(a) == [2]
        timings["2_admission_started_s"] = time.monotonic() - t0

        # 3. two replicas: the first takes the lease, reattaches, records RUNNING; the second idles
        c3 = controller()
        h.wait_for(lambda: lease_holder() == c3.holder, 60, "c3 to hold the lease")
        c3s = controller()
        h.wait_for(lambda: h.state(engine, a) == "RUNNING", 60, "job RUNNING after reattaching")
        h.wait_for(lambda: len(h.metrics(engine, a)) >= 3, 240, "three steps stored")
        at_most_one_supervisor()
        # attempt 2 replaced attempt 1 with every node alive: it was pinned to the scheduler's
        # placement, and the placement its gang reported (stored on its row) is that one
        first, second = h.attempts(engine, a)
        assert second.placement == first.placement and sum(first.placement.values()) == 2, (first, second)
        assert lease_holder() == c3.holder
        assert "controller lease acquired" not in c3s.log_text()
        assert "reconciled" not in c3s.log_text() and "supervisor started" not in c3s.log_text()
        epoch_before = LeaderLease(engine).current()[1]
        steps_at_kill = len(h.metrics(engine, a))
        c3.kill9()
        killed = time.monotonic()
        h.wait_for(
            lambda: lease_holder() == c3s.holder, 30, "the standby to take the lease over", interval_s=0.1
        )
        timings["takeover_s"] = time.monotonic() - killed
        assert LeaderLease(engine).current()[1] == epoch_before + 1
        h.wait_for(lambda: len(h.metrics(engine, a)) > steps_at_kill + 2, 120, "steps stored by the standby")
        assert [x.number for x in h.attempts(engine, a)] == [1, 2]  # reattached, no new attempt
        at_most_one_supervisor()

        # 4. kill the worker node the job trains on; kill -9 the controller while RECOVERING
        assert h.state(engine, a) == "RUNNING", "the job ended before its node could be killed: raise STEPS"
        nodes = _job_nodes(engine, a)
        assert nodes, "the job holds no GPUs on any node"
        victim = sorted(nodes)[0]
        node_killed_at = time.monotonic()
        ray_cluster.kill_node(victim)
        h.wait_for(lambda: h.state(engine, a) == "RECOVERING", 120, "job RECOVERING", interval_s=0.1)
        timings["node_kill_to_recovering_s"] = time.monotonic() - node_killed_at
        c3s.kill9()
        c4 = controller("cancel:asked")
        h.wait_for(lambda: h.state(engine, a) in ("RUNNING", "SUCCEEDED"), 240, "recovery to finish")
        timings["node_kill_to_running_s"] = time.monotonic() - node_killed_at
        row = h.job(engine, a)
        assert row.state == "SUCCEEDED" or row.gpus_allocated == 2, row  # its grant, not all GPUs left
        at_most_one_supervisor()

        # 5. a second job; kill -9 the controller right after it asked the supervisor to cancel
        b = h.add_job(engine, tenant, "to-cancel", h.tiny_spec(500, every=50, recovery=ONE_GANG), gpus=2)
        h.wait_for(lambda: h.state(engine, b) == "RUNNING", 240, "second job RUNNING")
        with make_sessionmaker(engine)() as s:
            assert tx.request_cancel(s, b) is tx.CancelOutcome.REQUESTED
        assert c4.wait(120) == -9, c4.log_text()
        assert h.state(engine, b) == "RUNNING" and h.job(engine, b).cancel_requested
        c5 = controller()
        h.wait_for(lambda: h.state(engine, b) == "CANCELLED", 120, "second job CANCELLED")
        h.wait_for(lambda: h.state(engine, a) == "SUCCEEDED", 300, "first job SUCCEEDED")
        timings["total_s"] = time.monotonic() - t0
        h.wait_for(lambda: not h.live_supervisors(a) and not h.live_supervisors(b), 60, "supervisors reaped")
        c5.stop()

        # exactly once, nothing lost
        assert len(h.transitions_to(engine, a, "SUCCEEDED")) == 1
        assert len(h.transitions_to(engine, b, "CANCELLED")) == 1
        assert [(x.number, x.state) for x in h.attempts(engine, a)] == [(1, "LOST"), (2, "SUCCEEDED")]
        steps = [m.step for m in h.metrics(engine, a)]
        assert steps == list(range(1, STEPS + 1)), steps  # one metric per step (1-based), none twice
        runtime = h.events(engine, a, source="runtime:a2")
        assert [e.seq for e in runtime] == list(range(1, len(runtime) + 1))  # no gap, no duplicate
        kinds = [e.type for e in runtime]
        assert "node_lost" in kinds and "resumed" in kinds and kinds[-1] == "finished"
        ckpt_events = sorted({e.payload["step"] for e in runtime if e.type == "checkpoint"})
        assert [c.step for c in h.checkpoints(engine, a)] == ckpt_events
        assert all(c.epoch == 2 for c in h.checkpoints(engine, a))
        final = h.job(engine, a)
        assert final.final_step == STEPS and final.epoch == 2 and not final.cancel_requested
        print("crash-safety timings:", json.dumps({k: round(v, 1) for k, v in timings.items()}))
    except BaseException:
        for job_id in (a, locals().get("b")):
            if job_id is not None:
                for e in h.events(engine, job_id):
                    if e.type not in ("step", "decision"):
                        print("EVENT", job_id, e.source, e.seq, e.type, json.dumps(e.payload)[:200])
        for p in procs:
            text = "\n".join(line for line in p.log_text().splitlines() if "service." in line)
            print(f"---- controller {p.holder} (rc {p.proc.poll()}) ----\n{text[-6000:]}")
        raise
    finally:
        for p in procs:
            if p.alive:
                p.kill9()
        from service.controller.supervisors import AttemptKey, Supervisors

        sups = Supervisors()
        for job_id in (a, locals().get("b")):
            if job_id is not None:
                for attempt in range(1, 6):
                    sups.kill(AttemptKey(job_id, attempt))
        engine.dispose()
