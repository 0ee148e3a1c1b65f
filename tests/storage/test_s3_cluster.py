"""A job whose checkpoints live on ``s3://`` loses a node with its memory copies: the re-plan
restores from the object store (one job on the session cluster, against the session's S3 server).

A 2-GPU job (``tp=2``) checkpoints to ``s3://<bucket>/job`` every 2 steps and snapshots into memory
after every step. Before step 5 every snapshot holder is killed and so is the job's node: no memory
copy is left, so the re-planned gang on another node loads the newest checkpoint from the object
store (step 4) and finishes; every step's loss matches the run without failures.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.controller import helpers as h
from workers import object_store
from workers.testbed.reference_run import reference_losses

pytestmark = [pytest.mark.cluster, pytest.mark.s3]

STEPS = 6


def _spec(ckpt: str) -> dict[str, Any]:
    return {
        "model": "tiny", "steps": STEPS, "global_batch": 4, "seed": 11, "min_gpus": 2, "max_gpus": 2,
        "layout_hint": "tp=2", "checkpoint_dir": ckpt,
        "checkpoint": {"min_every_steps": 2, "max_every_steps": 2},
        "runtime": {**h.FAST_RUNTIME, "grow": False, "snapshots": True},
        "faults": [{"kind": "drop_snapshots", "at_step": 5}, {"kind": "kill_node", "at_step": 5, "rank": -1}],
    }


@pytest.mark.timeout(600)
def test_a_node_kill_with_memory_gone_restores_from_s3(ray_cluster, s3_bucket: str) -> None:
    import ray

    from workers.runtime.supervision.launch import start_supervisor, stop_supervisor

    spec = _spec(f"{s3_bucket}/job")
    sup = start_supervisor("t-s3-replan", 1, spec, enable_fault_injection=True)
    try:
        result = ray.get(sup.run.remote(), timeout=500)
        events = ray.get(sup.events.remote(0))
    finally:
        stop_supervisor("t-s3-replan", 1)
    assert result["state"] == "SUCCEEDED", result["error"]
    resumed = [e for e in events if e["type"] == "resumed"]
    assert [(e["cause"], e["source"], e["from_step"]) for e in resumed] == [("node_lost", "storage", 4)], resumed
    saved = [e for e in events if e["type"] == "checkpoint"]
    assert saved and all(str(e["path"]).startswith(f"{s3_bucket}/job/step-") for e in saved), saved
    # on the object store: committed prefixes only (each with its marker), the fence, `latest`
    names = object_store.find(f"{s3_bucket}/job")
    prefixes = {n.split("/")[0] for n in names if n.startswith("step-")}
    assert prefixes and all(f"{p}/manifest.json" in names for p in prefixes), names
    assert ".orthoplex-fence" in names
    ref = reference_losses({k: v for k, v in spec.items() if k != "faults"} | {"checkpoint_dir": f"{s3_bucket}/ref"})
    for e in (e for e in events if e["type"] == "step"):
        want = ref[e["step"] - 1]
        assert abs(e["loss"] - want) <= 1e-4 * abs(want), (e["step"], e["loss"], want)
    assert sorted(int(k) for k in result["losses"]) == list(range(1, STEPS + 1))
