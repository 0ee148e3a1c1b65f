"""Live resize of a running job: the scheduler shrinks an elastic borrower for a job within quota,
then grows it back when the GPUs are free again -- in place, one attempt, no preemption.

Real everything: a controller process (``python -m service.controller``) on Postgres, the session
Ray cluster, tiny jobs trained by the real runtime. Eight of the twelve GPUs are held by "other
work" (an idle placement group), so the scheduler sees one node with four free GPUs:

1. tenant ``b`` (quota 1) submits an elastic job (1..4 GPUs): admitted on all 4 (borrowing 3);
2. tenant ``a`` (quota 3) submits a 2-GPU job: its quota is guaranteed, so the scheduler reclaims
   from the borrower -- an elastic Shrink of ``b``'s job to 2 (not a preemption); the supervisor
   checkpoints at a step boundary, re-plans onto 2 GPUs and goes on; ``a``'s job is admitted on the
   GPUs released and runs to the end;
3. the freed GPUs are idle: the scheduler grows ``b``'s job back to 4, which re-plans onto them;
4. ``b``'s job is cancelled.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from service.db import transitions as tx
from service.db.session import make_engine, make_sessionmaker
from tests.controller import helpers as h

pytestmark = [pytest.mark.postgres, pytest.mark.cluster]


def _runtime_events(engine: Any, job_id: int, type_: str) -> list[Any]:
    return [e for e in h.events(engine, job_id, type_=type_) if e.source.startswith("runtime:")]


def _resumed_on(engine: Any, job_id: int, gpus: int) -> int:
    """How many times the job's runtime resumed on ``gpus`` GPUs."""
    return sum(e.payload.get("world_size") == gpus for e in _runtime_events(engine, job_id, "resumed"))


def _decisions(engine: Any, job_id: int) -> list[tuple[str, int | None, str]]:
    return [
        (e.payload["kind"], e.payload.get("gpus"), e.payload["outcome"])
        for e in h.events(engine, job_id, source="scheduler", type_="decision")
    ]


@pytest.mark.timeout(900)
def test_shrink_for_a_quota_job_then_grow_back_in_place(ray_cluster, migrated_db_url: str, tmp_path: Path):
    engine = make_engine(migrated_db_url)
    nodes = ray_cluster.worker_node_ids()
    hog = h.GpuHog(nodes[1:], leave_free=0)  # other work: 4 GPUs left, on one node
    proc: h.ControllerProcess | None = None
    try:
        b_tenant = h.add_tenant(engine, "b", quota=1)
        a_tenant = h.add_tenant(engine, "a", quota=3)
        elastic = h.add_job(engine, b_tenant, "elastic", h.tiny_spec(3000, every=5), gpus=1, max_gpus=4)
        proc = h.ControllerProcess(
            migrated_db_url, ray_cluster.address, tmp_path / "storage", tmp_path / "c.log", holder="c1"
        )

        # 1. the elastic job takes every free GPU
        h.wait_for(lambda: len(h.metrics(engine, elastic)) >= 2, 300, "the elastic job training")
        row = h.job(engine, elastic)
        assert (row.state, row.gpus_allocated) == ("RUNNING", 4), row
        assert _decisions(engine, elastic)[0][:2] == ("admit", 4)

        # 2. a job within its tenant's quota arrives: the borrower is shrunk, not preempted
        quota_job = h.add_job(engine, a_tenant, "quota", h.tiny_spec(10, every=5), gpus=2)
        h.wait_for(lambda: _resumed_on(engine, elastic, 2), 300, "the elastic job resumed on 2 GPUs")
        assert ("shrink", 2, "requested") in _decisions(engine, elastic)
        h.wait_for(lambda: h.job(engine, elastic).gpus_allocated == 2, 60, "gpus_allocated 2")
        h.wait_for(lambda: h.state(engine, quota_job) == "SUCCEEDED", 300, "the quota job SUCCEEDED")
        assert _decisions(engine, quota_job)[-1][:2] == ("admit", 2)

        # 3. its GPUs are free again: the elastic job grows back onto them
        h.wait_for(lambda: _resumed_on(engine, elastic, 4), 300, "the elastic job resumed on 4 GPUs")
        assert ("grow", 4, "requested") in _decisions(engine, elastic)
        h.wait_for(lambda: h.job(engine, elastic).gpus_allocated == 4, 60, "gpus_allocated 4")

        # one attempt throughout, never preempted, every step stored once and in order
        assert [a.number for a in h.attempts(engine, elastic)] == [1]
        assert not h.transitions_to(engine, elastic, "PREEMPTED")
        causes = [e.payload.get("cause") for e in _runtime_events(engine, elastic, "resumed")]
        assert causes == ["resize", "resize"], causes
        replans = [e.payload["change"].get("max_gpus") for e in _runtime_events(engine, elastic, "replan")]
        assert replans == [2, 4], replans
        steps = [m.step for m in h.metrics(engine, elastic)]
        assert steps == list(range(1, len(steps) + 1)), steps[:50]

        # 4. cancel the elastic job (as the API does: through the job store)
        with make_sessionmaker(engine)() as s:
            assert tx.request_cancel(s, elastic) is tx.CancelOutcome.REQUESTED
        h.wait_for(lambda: h.job(engine, elastic).state == "CANCELLED", 120, "the elastic job CANCELLED")
        h.wait_for(lambda: not h.live_supervisors(elastic), 60, "no supervisor left")
    finally:
        if proc is not None:
            proc.stop()
        hog.release()
