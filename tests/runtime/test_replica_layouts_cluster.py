"""Replica groups with a pipeline, or ZeRO-1, inside each group, through the Ray runtime (issue #38):
a lost group's rows go to the survivor in whole blocks and a replacement heals from a peer.

A job of 2 replica groups of ``pp=2`` (2 stages, 1-row micro-batches: a pass and a block are 2
rows), or of ``dp=2,zero=1`` (each rank steps the optimizer state it owns and heals only that), on
the session cluster (3 nodes x 4 declared GPUs: a group per node, one node spare). Group 1's node
is killed in the middle of step 4 (``kill_node`` on the last rank). Checked, as behaviour:

- no ``resumed`` (nothing is re-planned): ``replica_dropped`` for group 1 at step 4, then a
  ``replica_joined`` replacement on the spare node that took its ranks' state from group 0 (``peer``);
- the survivor redid only the interrupted step, with the lost group's 6 rows added to its own;
- every step runs once, each with the single-process no-failure loss (1e-4 relative over the first
  40 steps, 1e-3 after: float reassociation), and the
  steps after the replacement's healing step run with 2 groups again (4 ranks); a checkpoint after
  the heal (step 70) is written by a group, so the healed optimizer state is a valid one.
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

STEPS, KILL_AT = 80, 3  # 0-based step the kill interrupts (reported as step 4)


def _spec(tmp_path: Path, hint: dict[str, int]) -> dict[str, Any]:
    return {
        "model": "tiny", "steps": STEPS, "global_batch": 12, "seed": 5,
        "layout_hint": hint, "checkpoint_dir": str(tmp_path / "ckpt"),
        "checkpoint": {"min_every_steps": 70, "max_every_steps": 70},
        "runtime": {**h.FAST_RUNTIME, "grow": False, "replica_groups": 2, "warm_ranks_per_node": 0},
        "faults": [{"kind": "kill_node", "at_step": KILL_AT, "rank": -1}],
    }


@pytest.mark.timeout(600)
# ZeRO-1 groups in the soak rotation (the CI budget): the default run heals a pipeline group, and
# tests/engine/test_replica_layouts.py checks ZeRO and FSDP groups against one process
@pytest.mark.parametrize("hint", [{"pp": 2, "micro_batch": 1},
                                  pytest.param({"dp": 2, "zero": 1, "micro_batch": 1}, marks=pytest.mark.soak)],
                         ids=["pp2", "dp2-zero1"])
def test_a_group_is_replaced_from_a_peer_and_the_losses_stay(ray_cluster, tmp_path: Path,
                                                             hint: dict[str, int]) -> None:
    import ray

    from workers.runtime.supervision.launch import start_supervisor, stop_supervisor

    spec = _spec(tmp_path, hint)
    t0 = time.monotonic()
    sup = start_supervisor("t-replica-pp", 1, spec, enable_fault_injection=True)
    try:
        result = ray.get(sup.run.remote(), timeout=500)
        events = ray.get(sup.events.remote(0))
    finally:
        stop_supervisor("t-replica-pp", 1)
    took = time.monotonic() - t0
    story = [{k: v for k, v in e.items() if k not in ("layout", "cadence")} for e in events if e["type"] != "step"]
    assert result["state"] == "SUCCEEDED", (result["error"], story)
    kinds = [e["type"] for e in events]
    assert "resumed" not in kinds, story
    reps = result["replicas"]
    groups = reps["groups"]
    dropped = [e for e in events if e["type"] == "replica_dropped"]
    assert [(e["group"], e["step"]) for e in dropped] == [(1, KILL_AT + 1)], story
    joined = [e for e in events if e["type"] == "replica_joined"]
    assert len(joined) == 1 and joined[0]["source"] == "peer" and joined[0]["from_group"] == 0, (joined, story)
    new = str(joined[0]["group"])
    assert groups[new]["node"] not in {*dropped[0]["nodes"], groups["0"]["node"]}
    assert len(groups["0"]["pids"]) == 2 and set(groups["0"]["aborted"]) <= {KILL_AT}, groups["0"]
    redo = [a for a in groups["0"]["attempts"].values()
            if a["step"] == KILL_AT and a["event"] == "step" and a["participants"] == 1]
    assert redo and all(a.get("kept_rows") == 6.0 for a in redo if "kept_rows" in a), redo

    steps_ev = [e for e in events if e["type"] == "step"]
    assert [e["step"] for e in steps_ev] == list(range(1, STEPS + 1))
    sizes = [e["world_size"] for e in steps_ev]
    # 2 groups of 2 stages again after the replacement's (healing) step
    assert sizes[joined[0]["step"]:] == [4] * (STEPS - joined[0]["step"]) and len(sizes) > joined[0]["step"], \
        (sizes, joined)
    ref = reference_losses({k: v for k, v in spec.items() if k not in ("faults", "runtime")}
                           | {"checkpoint_dir": str(tmp_path / "r")})
    rel = [abs(e["loss"] - ref[e["step"] - 1]) / abs(ref[e["step"] - 1]) for e in steps_ev]
    # 1e-4 relative over the first 40 steps, 1e-3 after: float reassociation (1 or 2 groups summing
    # partial gradients against one process) drifts with every step (9e-5 seen by step 80 with ZeRO-1)
    for e, q in zip(steps_ev, rel, strict=True):
        assert q <= (1e-4 if e["step"] <= 40 else 1e-3), \
            [f"{x['step']}:{r:.1e}/{x['world_size']}" for x, r in zip(steps_ev, rel, strict=True)]
    saved = [e["step"] for e in events if e["type"] == "checkpoint"]
    assert saved == [70, STEPS] or joined[0]["step"] > 70, (saved, joined)
    print(json.dumps({"hint": hint, "test_s": round(took, 1), "max_rel_loss_diff": max(rel), "joined_at_step": joined[0]["step"],
                      "world_sizes": [e["world_size"] for e in steps_ev]}))
