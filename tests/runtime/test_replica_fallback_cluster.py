"""Replica groups that run out (issue #38): the job re-plans instead of failing.

A job of 2 replica groups on the session cluster (3 nodes x 4 declared GPUs: a group per node, one
node spare), a group ``tp=1``, or ``pp=2`` (a pipeline inside each group), with the job's periodic checkpoints (every 2 steps) and in-memory
snapshots (every step). Both groups' nodes are killed in the middle of step 6 (``kill_node`` on the
first and the last rank: one of each group): every group is lost. Checked, as behaviour:

- the job SUCCEEDS: both groups ``replica_dropped`` at step 6, then a plan over the GPUs left
  (the spare node, ``max_gpus`` 2) and one ``resumed`` from the in-memory snapshot of step 5: one
  group takes the snapshots, the one whose ranks' second copy is on a node no group runs on (each
  snapshot is held on its node and the next node of the holders' ring), so the snapshot outlives
  every group; not from the checkpoint of step 4 (a replica group wrote the periodic checkpoints,
  at the job's cadence);
- every step runs once in order, and every step's loss is the single-process no-failure run's (1e-4
  relative): the steps after the fallback continue from the right state.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.controller import helpers as h
from workers.testbed.reference_run import reference_losses

pytestmark = pytest.mark.cluster

STEPS, KILL_AT = 10, 5  # 0-based step the kill interrupts (reported as step 6)


def _spec(tmp_path: Path, hint: dict[str, int]) -> dict[str, Any]:
    return {
        "model": "tiny", "steps": STEPS, "global_batch": 12, "seed": 5, "max_gpus": 2,
        "layout_hint": hint, "checkpoint_dir": str(tmp_path / "ckpt"),
        "checkpoint": {"min_every_steps": 2, "max_every_steps": 2},
        "runtime": {**h.FAST_RUNTIME, "grow": False, "replica_groups": 2, "warm_ranks_per_node": 0,
                    "snapshots": True, "snapshot_every": 1},
        "faults": [{"kind": "kill_node", "at_step": KILL_AT, "rank": 0},
                   {"kind": "kill_node", "at_step": KILL_AT, "rank": -1}],
    }


@pytest.mark.timeout(600)
# pipeline groups' fallback in the soak rotation (the CI budget): the default run falls back from
# groups of one rank, and a pipeline group heals from a peer in test_replica_layouts_cluster.py
@pytest.mark.parametrize("hint", [{"tp": 1, "micro_batch": 2},
                                  pytest.param({"pp": 2, "micro_batch": 1}, marks=pytest.mark.soak)], ids=["tp1", "pp2"])
def test_a_replica_job_that_loses_every_group_replans_from_memory_and_finishes(ray_cluster, tmp_path: Path,
                                                                                hint: dict[str, int]) -> None:
    import ray

    from workers.runtime.recovery.memory_snapshots import buddy_of
    from workers.runtime.supervision.launch import start_supervisor, stop_supervisor

    spec = _spec(tmp_path, hint)
    nodes = ray_cluster.worker_node_ids()  # a snapshot holder on each
    t0 = time.monotonic()
    sup = start_supervisor("t-replica-fallback", 1, spec, enable_fault_injection=True)
    try:
        result = ray.get(sup.run.remote(), timeout=500)
        events = ray.get(sup.events.remote(0))
    finally:
        stop_supervisor("t-replica-fallback", 1)
    took = time.monotonic() - t0
    story = [{k: v for k, v in e.items() if k not in ("layout", "cadence", "old", "new")}
             for e in events if e["type"] != "step"]
    assert result["state"] == "SUCCEEDED", (result["error"], story)

    placed = [e for e in events if e["type"] == "placed"]
    group_nodes = [e["bundle_nodes"][0] for e in placed[:2]]
    spare = (set(nodes) - set(group_nodes)).pop()
    dropped = [e for e in events if e["type"] == "replica_dropped"]
    assert sorted((e["group"], e["step"]) for e in dropped) == [(0, KILL_AT + 1), (1, KILL_AT + 1)], story
    saved = [e["step"] for e in events if e["type"] == "checkpoint"]
    assert saved[:2] == [2, 4], story  # written by a replica group, at the job's cadence
    resumed = [e for e in events if e["type"] == "resumed"]
    assert len(resumed) == 1, story
    snapper = [g for g, n in enumerate(group_nodes) if buddy_of(n, nodes) == spare]
    assert snapper, (group_nodes, nodes)  # the ring has one: the spare's predecessor runs a group
    assert (resumed[0]["source"], resumed[0]["from_step"], resumed[0]["steps_redone"]) == ("memory", KILL_AT, 0), story
    assert resumed[0]["world_size"] <= 2 and set(placed[-1]["bundle_nodes"]) == {spare}, story

    steps_ev = [e for e in events if e["type"] == "step"]
    assert [e["step"] for e in steps_ev] == list(range(1, STEPS + 1))
    ref = reference_losses({k: v for k, v in spec.items() if k not in ("faults", "runtime")}
                           | {"checkpoint_dir": str(tmp_path / "r")})
    rel = [abs(e["loss"] - ref[e["step"] - 1]) / abs(ref[e["step"] - 1]) for e in steps_ev]
    assert max(rel) <= 1e-4, [f"{e['step']}:{q:.1e}" for e, q in zip(steps_ev, rel, strict=True)]
    print(json.dumps({"hint": hint, "test_s": round(took, 1), "max_rel_loss_diff": max(rel), "source": resumed[0]["source"],
                      "world_sizes": [e["world_size"] for e in steps_ev]}))
