"""The elastic runtime against real network faults: every node in its own network namespace.

Ray runs across the namespaces as across hosts (3 nodes x 2 declared GPUs, the head in a namespace
of its own, the test process the driver on the bridge). A job of 4 ranks runs on two nodes; faults
hit the link of a node that hosts ranks:

1. a partition that lasts: the node is declared lost although its raylet lives, the job re-plans
   without it and finishes; when the link heals the node is fenced: Ray keeps it dead (its raylet
   exits), the gang epoch has moved on, and no step is reported twice beyond the recovery contract;
2. a partition healed before the deadline: a stall, no failure and no re-plan;
3. a lossy link (10 % each way): the job survives and finishes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.netns.probes import wait_until

pytestmark = [pytest.mark.cluster]

STEPS = 16


def _spec(tmp_path: Path, steps: int = STEPS) -> dict[str, Any]:
    # 4 ranks, TP inside a node and DP across two nodes: the all-reduce crosses a node link (the
    # third node is free, so a lost node is replaced at the same size)
    return {"model": "tiny", "steps": steps, "global_batch": 8, "min_gpus": 4, "max_gpus": 4,
            "checkpoint_dir": str(tmp_path / "ckpt"), "layout_hint": "tp=2,dp=2",
            "checkpoint": {"min_every_steps": 1, "max_every_steps": 3},
            "runtime": {"heartbeat_s": 1, "heartbeat_timeout_s": 8, "hang_timeout_s": 90,
                        "collective_timeout_s": 45, "node_confirm_s": 8, "grow": False},
            "events_out": str(tmp_path / "events.jsonl")}


class Job:
    def __init__(self, job_id: str, spec: dict[str, Any]) -> None:
        from workers.runtime.launch import start_supervisor

        self.job_id = job_id
        self.h = start_supervisor(job_id, 1, spec)
        self.events: list[dict[str, Any]] = []

    def pull(self) -> list[dict[str, Any]]:
        import ray

        new = ray.get(self.h.events.remote(self.events[-1]["seq"] if self.events else 0))
        self.events.extend(new)
        return new

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]

    def wait_step(self, step: int, timeout_s: float = 600) -> None:
        wait_until(lambda: (self.pull() or True) and any(e["step"] >= step for e in self.of("step")),
                   timeout_s, f"step {step} of {self.job_id}")

    def finish(self, timeout_s: float = 900) -> dict[str, Any]:
        import ray

        res = ray.get(self.h.run.remote(), timeout=timeout_s)
        self.pull()
        return res

    def stop(self) -> None:
        from workers.runtime.launch import stop_supervisor

        stop_supervisor(self.job_id, 1)


def _victim(job: Job, netns_ray: Any) -> tuple[str, str]:
    """(ray node id, namespace node name) of the node hosting the last rank."""
    mapped = job.of("ranks_mapped")[-1]
    node_id = mapped["rank_to_node"][-1]
    return node_id, netns_ray.node_name(node_id)


def _no_step_lost(job: Job, res: dict[str, Any]) -> None:
    assert res["state"] == "SUCCEEDED", res
    steps = sorted({e["step"] for e in job.of("step")})
    assert steps == list(range(1, STEPS + 1)), steps  # a step event names the steps done (1-based)
    # at-least-once steps: a step is run again only after a resume from an earlier checkpoint
    runs = [e["step"] for e in job.of("step")]
    redone = len(runs) - len(set(runs))
    assert redone == sum(r["steps_redone"] for r in job.of("resumed")), (runs, job.of("resumed"))


def _raylet_or_workers(pids: list[int]) -> list[int]:
    out = []
    for p in pids:
        try:
            comm = Path(f"/proc/{p}/comm").read_text().strip()
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if comm == "raylet" or "default_worker" in cmd or cmd.startswith("ray::"):
            out.append(p)
    return out


def _no_leaks(netns_ray: Any) -> None:
    wait_until(lambda: not netns_ray.live_placement_groups() and not netns_ray.live_actors(), 60,
               "no placement group and no actor left")


@pytest.mark.timeout(1200)
def test_partition_declares_the_node_lost_recovers_and_fences_the_node_when_it_returns(
        netns_ray: Any, tmp_path: Path) -> None:
    import ray

    from workers.runtime import fencing

    job = Job("nn-part", _spec(tmp_path))
    name = ""
    try:
        job.wait_step(4)
        node_id, name = _victim(job, netns_ray)
        epoch_before = fencing.current(tmp_path / "ckpt")
        t_fault = time.time()
        netns_ray.faults.partition(name)
        assert netns_ray.cluster.processes(name), "the partitioned node's processes live on"
        res = job.finish()
    finally:
        job.stop()
    lost = job.of("node_lost")
    assert lost and lost[0]["nodes"] == [node_id], job.of("node_lost") + job.of("rank_failed")
    detect_s = lost[0]["ts"] - t_fault
    print(f"partition -> node_lost in {detect_s:.1f} s")
    assert job.of("resumed")[0]["cause"] == "node_lost"
    assert node_id not in job.of("placed")[-1]["bundle_nodes"]
    _no_step_lost(job, res)
    assert fencing.current(tmp_path / "ckpt") > epoch_before
    with pytest.raises(fencing.Fenced):
        fencing.check(tmp_path / "ckpt", epoch_before, "write a checkpoint")
    _no_leaks(netns_ray)

    # the node comes back: Ray keeps it dead (its raylet learns it was declared dead and exits,
    # taking the old ranks with it), so nothing of the old gang can act again
    netns_ray.faults.heal(name)
    wait_until(lambda: not _raylet_or_workers(netns_ray.cluster.processes(name)), 120,
               f"the old raylet and workers of {name} to exit")
    assert not any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes())
    netns_ray.cluster.restart_node(name)  # a repaired machine joins as a new node


@pytest.mark.soak
@pytest.mark.timeout(900)
def test_partition_healed_before_the_deadline_costs_only_a_stall(netns_ray: Any, tmp_path: Path) -> None:
    job = Job("nn-blip", _spec(tmp_path))
    try:
        job.wait_step(3)
        _, name = _victim(job, netns_ray)
        netns_ray.faults.partition(name)
        time.sleep(2.0)  # shorter than the GCS's 5 missed 1 s health checks and the 8 s heartbeat limit
        netns_ray.faults.heal(name)
        res = job.finish()
    finally:
        job.stop()
    assert res["state"] == "SUCCEEDED", res
    assert not (job.of("node_lost") or job.of("rank_failed") or job.of("hang") or job.of("resumed")), \
        [e for e in job.events if e["type"] in ("node_lost", "rank_failed", "hang", "resumed")]
    assert len(job.of("plan")) == 1
    _no_step_lost(job, res)
    _no_leaks(netns_ray)


@pytest.mark.soak
@pytest.mark.timeout(900)
def test_lossy_link_the_job_survives(netns_ray: Any, tmp_path: Path) -> None:
    job = Job("nn-loss", _spec(tmp_path))
    name = ""
    try:
        job.wait_step(2)
        _, name = _victim(job, netns_ray)
        netns_ray.faults.loss(name, 10)
        job.wait_step(8)
        netns_ray.faults.heal(name)
        res = job.finish()
    finally:
        if name:
            netns_ray.faults.heal(name)
        job.stop()
    _no_step_lost(job, res)
    _no_leaks(netns_ray)


@pytest.mark.soak
@pytest.mark.timeout(900)
def test_slow_link_shows_as_a_link_straggler_and_is_replanned_around(netns_ray: Any, tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    spec["runtime"]["straggler_window"] = 3
    job = Job("nn-slow", spec)
    name = ""
    try:
        job.wait_step(2)
        node_id, name = _victim(job, netns_ray)
        netns_ray.faults.rate(name, 1)  # 1 Mbit/s: the DP all-reduce crossing this link crawls
        res = job.finish()
    finally:
        if name:
            netns_ray.faults.heal(name)
        job.stop()
    flagged = [e for e in job.of("straggler") if e["node"] == node_id]
    assert flagged and flagged[0]["cause"] == "link", job.of("straggler")
    assert job.of("replan") and job.of("replan")[0]["change"]["slow_nodes"], job.of("replan")
    _no_step_lost(job, res)
    _no_leaks(netns_ray)
