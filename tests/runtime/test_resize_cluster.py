"""Resize, capacity waits and preemption of one job on the session cluster (3 nodes x 4 GPUs).

One supervisor, driven from outside the way the control plane drives it:

0. the other two nodes are busy ("other tenants' work"), so the job's 4 GPUs are on one node; a
   rank process is killed (its node stays up): ``rank_failed``, not ``node_lost`` -- the node's
   raylet still answers -- and the job restarts the same layout on the same node; when a rank dies
   there a second time, the node is suspect (``node_excluded``): the job waits for GPUs elsewhere
   rather than going back to it, and moves to another node once one is free;
1. it starts on 4 GPUs (``dp=4`` hint) and is asked to shrink to 2 (``resize(2)``, the scheduler's
   Shrink): at the next step boundary it checkpoints, re-plans within 2 GPUs and resumes from that
   checkpoint with no step lost;
2. every other free GPU is taken ("other tenants' work") and the job's node is killed: the job
   reports ``node_lost``, finds no GPUs, and *waits* (``waiting_for_gpus``) instead of failing;
3. the GPUs are released: the job resumes on 2 GPUs -- its grant -- although 8 are free (a re-plan
   never grows a job beyond what the scheduler gave it);
4. it is preempted: checkpoint, gang released, ``PREEMPTED`` with the step it can resume from.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.controller import helpers as h
from workers.engine.checkpoint.store import list_checkpoints

pytestmark = pytest.mark.cluster


def _spec(tmp_path: Path) -> dict[str, Any]:
    return {
        "model": "tiny",
        "steps": 5000,  # ended by the preemption below
        "global_batch": 4,
        "seed": 11,
        "min_gpus": 2,
        "max_gpus": 4,
        "layout_hint": {"dp": 4},
        "checkpoint_dir": str(tmp_path / "ckpt"),
        "checkpoint": {"min_every_steps": 5, "max_every_steps": 5},
        "runtime": {**h.FAST_RUNTIME, "grow": False},
        "faults": [{"kind": "kill_rank", "at_step": 2, "rank": 1}, {"kind": "kill_rank", "at_step": 6, "rank": 1}],
    }


@pytest.mark.timeout(900)
def test_crash_suspect_node_shrink_wait_for_gpus_capped_recovery_and_preempt(ray_cluster, tmp_path: Path) -> None:
    import ray

    from workers.runtime.supervision.launch import start_supervisor, stop_supervisor

    workers = ray_cluster.worker_node_ids()
    hog: h.GpuHog | None = h.GpuHog(workers[1:], leave_free=0)  # only workers[0] has free GPUs
    try:
        sup = start_supervisor("t-resize", 1, _spec(tmp_path), enable_fault_injection=True)
    except BaseException:
        hog.release()
        raise
    seen: list[dict[str, Any]] = []

    def events() -> list[dict[str, Any]]:
        seen.extend(ray.get(sup.events.remote(seen[-1]["seq"] if seen else 0), timeout=60))
        return seen

    def first(kind: str, **match: Any) -> dict[str, Any] | None:
        return next((e for e in events() if e["type"] == kind and all(e.get(k) == v for k, v in match.items())),
                    None)

    try:
        # 0. a rank dies on a live node: same layout again, on the same node, from the last checkpoint
        crashed = h.wait_for(lambda: first("rank_failed"), 300, "rank_failed")
        assert crashed["ranks"] == [1] and crashed["nodes"] == [workers[0]] and not first("node_lost")
        again = h.wait_for(lambda: first("resumed", cause="rank_failed"), 300, "resumed after the crash")
        assert again["world_size"] == 4 and again["from_step"] == 0
        assert not first("node_excluded")
        # ... and again there: the node is suspect; with no other GPU free the job waits, not returns
        excluded = h.wait_for(lambda: first("node_excluded"), 300, "node_excluded")
        assert excluded["node"] == workers[0] and excluded["deaths"] == 2
        h.wait_for(lambda: first("waiting_for_gpus"), 120, "waiting_for_gpus (only the suspect node is free)")
        hog.release()
        hog = None
        moved = h.wait_for(lambda: next((e for e in events() if e["type"] == "resumed" and e["seq"] > excluded["seq"]),
                                        None), 300, "resumed off the suspect node")
        assert moved["world_size"] == 4 and moved["cause"] == "rank_failed"
        assert workers[0] not in ray.get(sup.status.remote(), timeout=60)["nodes"]
        step4 = h.wait_for(lambda: next((e for e in events() if e["type"] == "step" and e["seq"] > moved["seq"]),
                                        None), 120, "a step on 4 GPUs after the move")
        assert step4["world_size"] == 4

        # 1. shrink to 2 GPUs at a step boundary
        answer = ray.get(sup.resize.remote(2), timeout=60)
        assert answer["armed"] and answer["gpus"] == 2, answer
        assert ray.get(sup.resize.remote(2), timeout=60)["armed"] is False  # a repeat arms nothing
        with pytest.raises(ray.exceptions.RayTaskError, match="gpus must be >= 1"):
            ray.get(sup.resize.remote(0), timeout=60)
        resumed = h.wait_for(lambda: first("resumed", cause="resize"), 300, "resumed after the resize")
        assert resumed["world_size"] == 2
        replan = next(e for e in events() if e["type"] == "replan" and e["change"].get("max_gpus") == 2)
        assert replan["decision"] != "keep" and "more than the 2" in replan["reason"]
        ckpt = max(e["step"] for e in events() if e["type"] == "checkpoint" and e["seq"] < resumed["seq"])
        assert resumed["from_step"] == ckpt >= step4["step"]
        last_before = max(e["step"] for e in events() if e["type"] == "step" and e["seq"] < resumed["seq"])
        assert ckpt == last_before  # the resize checkpointed at the boundary: nothing redone
        h.wait_for(lambda: first("step", step=ckpt + 1, world_size=2), 120, "a step on 2 GPUs")

        # 2. all other GPUs busy, the job's node dies: it waits for GPUs instead of failing
        job_nodes = set(ray.get(sup.status.remote(), timeout=60)["nodes"])
        survivors = [n for n in ray_cluster.worker_node_ids() if n not in job_nodes]
        hog = h.GpuHog(survivors, leave_free=0)
        assert hog.count >= 4
        victim = sorted(job_nodes)[0]
        ray_cluster.kill_node(victim)
        lost = h.wait_for(lambda: first("node_lost"), 120, "node_lost")
        assert victim in lost["nodes"]
        waiting = h.wait_for(lambda: next((e for e in events() if e["type"] == "waiting_for_gpus"
                                           and e["seq"] > lost["seq"]), None), 120, "waiting_for_gpus")
        assert waiting["max_gpus"] == 2
        time.sleep(3)  # still waiting, not failed
        status = ray.get(sup.status.remote(), timeout=60)
        assert status["state"] == "RECOVERING", status
        assert not any(e["type"] == "failed" for e in events())
        # nothing runs while the job waits: storage holds what a resume can use
        on_disk = max(r.step for r in list_checkpoints(tmp_path / "ckpt") if r.manifest is not None)
        announced = max(e["step"] for e in events() if e["type"] == "checkpoint")

        # 3. GPUs come back (8 free): the job resumes on its grant of 2, not on all of them
        hog.release()
        hog = None
        back = h.wait_for(lambda: first("resumed", cause="node_lost"), 300, "resumed after the node loss")
        assert back["world_size"] == 2, back
        # from the newest committed checkpoint on storage: at least the newest one announced, and newer
        # when the node died after a save committed but before every rank answered (no event for it then)
        assert back["from_step"] == on_disk >= announced, (back, on_disk, announced)
        h.wait_for(lambda: any(e["type"] == "step" and e["seq"] > back["seq"] for e in events()), 120,
                   "a step after the recovery")

        # 4. preemption: checkpoint, release, PREEMPTED with the step to resume from
        assert ray.get(sup.preempt.remote(), timeout=60)
        summary = ray.get(sup.run.remote(), timeout=300)
        assert summary["state"] == "PREEMPTED", summary
        pre = first("preempted")
        assert pre is not None and pre["checkpoint_step"] == summary["last_checkpoint_step"] == summary["steps_done"]
        assert [p["num_gpus"] for p in summary["plans"]] == [4, 4, 2, 2]  # a "keep" adds no plan
        steps = {e["step"] for e in events() if e["type"] == "step"}
        assert set(range(1, summary["steps_done"] + 1)) <= steps  # every step ran, none skipped
        after = [e["step"] for e in events() if e["type"] == "step" and e["seq"] > back["seq"]]
        assert after == list(range(back["from_step"] + 1, summary["steps_done"] + 1))  # resumed in order
    finally:
        if hog is not None:
            hog.release()
        stop_supervisor("t-resize", 1)
