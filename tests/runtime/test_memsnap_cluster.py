"""Re-plan from memory, then from storage, in one job on the session cluster (3 nodes x 4 GPUs).

A 4-GPU job (``tp=2,dp=2``, all on one node) snapshots every rank's shard after every step into
holder actors on its own node and on the next node. Its node is killed before step 3: the job
re-plans onto another node and resumes from the step-3 snapshot in the surviving holder's memory
(nothing redone, no storage read: the only checkpoint is older). Then every holder is killed and
the new node is killed too before step 7: with both memory copies gone, the job resumes from the
newest checkpoint in storage. Each node keeps 2 pre-started rank actors: the re-planned gangs take
them. Every step's loss (including the redone ones) matches the no-failure
run to 1e-4; nothing leaks (the fixture checks: holders are freed at the end).

A second, short test checks the restore's fetch: a holder hands out handles to a snapshot's files,
and a rank on another node that fetches one brings only that one to its node.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.controller import helpers as h
from workers.runtime.recovery.memory_snapshots import METADATA
from workers.testbed.reference_run import reference_losses

pytestmark = pytest.mark.cluster

STEPS = 9


def _spec(tmp_path: Path) -> dict[str, Any]:
    return {
        "model": "tiny", "steps": STEPS, "global_batch": 4, "seed": 5, "min_gpus": 4, "max_gpus": 4,
        "layout_hint": "tp=2,dp=2", "checkpoint_dir": str(tmp_path / "ckpt"),
        "checkpoint": {"min_every_steps": 4, "max_every_steps": 4},
        "runtime": {**h.FAST_RUNTIME, "grow": False, "warm_ranks_per_node": 2, "snapshots": True},
        "faults": [{"kind": "kill_node", "at_step": 3, "rank": -1},
                   {"kind": "drop_snapshots", "at_step": 7}, {"kind": "kill_node", "at_step": 7, "rank": -1}],
    }


@pytest.mark.timeout(900)
def test_replan_from_memory_then_from_storage_when_the_memory_copies_are_gone(ray_cluster, tmp_path: Path) -> None:
    import ray

    from workers.runtime.supervision.launch import start_supervisor, stop_supervisor

    spec = _spec(tmp_path)
    sup = start_supervisor("t-memsnap", 1, spec, enable_fault_injection=True)
    try:
        result = ray.get(sup.run.remote(), timeout=800)
        events = ray.get(sup.events.remote(0))
    finally:
        stop_supervisor("t-memsnap", 1)
    assert result["state"] == "SUCCEEDED", result["error"]
    resumed = [e for e in events if e["type"] == "resumed"]
    assert [(e["cause"], e["source"]) for e in resumed] == [("node_lost", "memory"), ("node_lost", "storage")]
    lost = [e for e in events if e["type"] == "node_lost"]
    assert len({e["nodes"][0] for e in lost}) == 2
    # from memory: the snapshot of step 3 (or of step 2 when the kill beat step 3's snapshot's push);
    # the only checkpoint then is of step 0: storage would have redone 3 steps
    assert resumed[0]["from_step"] in (2, 3) and resumed[0]["steps_redone"] <= 1
    ckpts = [e["step"] for e in events if e["type"] == "checkpoint" and resumed[0]["seq"] < e["seq"] < lost[1]["seq"]]
    assert ckpts and resumed[1]["from_step"] == max(ckpts)  # the newest checkpoint, memory copies gone
    # every step's loss, the redone ones too, as in the run without failures
    ref = reference_losses({k: v for k, v in spec.items() if k != "faults"} | {"checkpoint_dir": str(tmp_path / "r")})
    for e in (e for e in events if e["type"] == "step"):
        want = ref[e["step"] - 1]
        assert abs(e["loss"] - want) <= 1e-4 * abs(want), (e["step"], e["loss"], want)
        # what the step waited for its snapshot, there on every step (snapshots on), within the step
        assert e["snapshot_s"] is not None and 0.0 <= e["snapshot_s"] <= e["wall_s"], e
    assert sorted(int(k) for k in result["losses"]) == list(range(1, STEPS + 1))
    # the re-planned gangs took pre-started ranks from their node's pool (2 per node), the first none
    started = [e for e in events if e["type"] == "started"]
    assert [e["warm_ranks"] for e in started] == [0, 2, 2], started


@pytest.mark.timeout(300)
def test_a_restoring_rank_fetches_only_the_snapshot_files_it_asks_for(ray_cluster) -> None:
    """A holder hands out handles (``refs``) to a snapshot's files; a rank on another node that
    fetches one of them brings only that one to its node (the others stay on the holder's node)."""
    import ray
    from ray.experimental import get_object_locations
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from workers.runtime.recovery.memory_snapshots import Holders

    a, b = ray_cluster.worker_node_ids()[:2]
    holders = Holders(keep=2)
    try:
        holder = holders.ensure([a], needed=[a])[a]
        files = {METADATA: b"m" * 1024, "__0_0.distcp": b"0" * (2 << 20), "__1_0.distcp": b"1" * (2 << 20)}
        ray.get(holder.put.remote(1, 4, 2, files))
        assert ray.get(holder.get.remote(1, 4, [METADATA])) == {METADATA: files[METADATA]}

        @ray.remote(num_cpus=0)
        def fetch_one(handles: dict[str, Any], name: str) -> tuple[str, int]:
            return ray.get_runtime_context().get_node_id(), len(ray.get(handles[name]))

        handles = ray.get(holder.refs.remote(1, 4, sorted(files)))
        assert sorted(handles) == sorted(files)
        on_b = fetch_one.options(scheduling_strategy=NodeAffinitySchedulingStrategy(b, soft=False))
        assert ray.get([on_b.remote(handles, "__1_0.distcp") for _ in range(2)]) == [(b, 2 << 20)] * 2
        where = get_object_locations([handles["__0_0.distcp"], handles["__1_0.distcp"]])
        assert b in where[handles["__1_0.distcp"]]["node_ids"]
        assert b not in where[handles["__0_0.distcp"]]["node_ids"]  # never asked for: never moved
    finally:
        holders.kill()
