"""Minimal reproduction: Ray Train + ``TorchftConfig``'s ``fit()`` never returns when the lost replica
group's placement-group bundle cannot be placed again (Ray 2.60, torchft 0.2.0).

Ray Train replaces a failed replica group *at the same placement-group slots*
(``WorkerGroup.replace_replica_group``): the bundle on the dead node goes RESCHEDULING and the
controller waits, inside its loop, for the new worker to start. When no alive node can host the
bundle (here: the spare node's GPUs are held by another placement group), the replacement never
starts, the surviving groups finish their steps, and ``fit()`` blocks forever: no timeout, no error.
This script holds the spare node's GPUs, runs the benchmark's torchft peer with a deadline, and
prints what the cluster looked like at the deadline (the trainer's placement group RESCHEDULING, one
bundle on no node).

``python -m bench.torchft_hang_repro [--free]`` (``--free``: the same without the held GPUs, which
recovers). What was ours and what is Ray's: in the recovery compare runs the hang came from our
harness, which started a peer run before the GCS had marked the node killed in the run before dead,
so no spare node was restored and the lost group had nowhere to go (the diagnosis of 2026-12-07
09:07: 2 worker nodes alive, the bundle RESCHEDULING); ``bench.recovery_replicas.settle`` now waits
for a settled cluster before every run. Ray's part: a replica group that cannot be placed again
makes ``fit()`` wait forever instead of failing or going on with fewer groups; the benchmark ends
such a run at a deadline and reports it as invalid, with this diagnosis.
"""

from __future__ import annotations

import json
import sys


def main(free: bool) -> dict:
    import ray
    from ray.util.placement_group import placement_group

    from bench.recovery_peers import GPUS_PER_NODE, NODES, run_peer
    from workers.testbed.local_cluster import InProcessCluster

    cluster = InProcessCluster(nodes=NODES, gpus_per_node=GPUS_PER_NODE).start()
    try:
        if not free:  # another job's leftover: one node's GPUs held (the node the trainer leaves spare)
            hold = placement_group([{"GPU": GPUS_PER_NODE, "CPU": 0.01}], strategy="STRICT_PACK")
            ray.get(hold.ready(), timeout=60)
        out = run_peer("torchft", cluster=cluster, fit_timeout_s=150.0)
    finally:
        cluster.shutdown()
    return {"held_spare_gpus": not free, "fit_hung": out["fit_hung"], "full_strength_s": out["full_strength_s"],
            "last_step": out["last_step"], "hang_diagnosis": out.get("hang_diagnosis")}


if __name__ == "__main__":
    print(json.dumps(main("--free" in sys.argv), indent=2, default=str))
