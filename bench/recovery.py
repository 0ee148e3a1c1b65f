"""Recovery benchmark: the same workload and the same node failure under Orthoplex's runtime and under
Ray Train's own restart (``TorchTrainer`` + ``FailureConfig``, elastic ``ScalingConfig``), side by side.

Workload: the engine's tiny model, global batch 12, data-parallel at the start (Ray Train only does
DP), checkpoints into the engine's layout-independent store every 2 steps. Cluster: a local
``cluster_utils`` cluster, 2 worker nodes x 2 declared GPUs. Failure: before step ``KILL_AT`` the
node of the last rank is crashed (its raylet gets SIGKILL), the same hook for both systems.

Phases: ours come from the supervisor's ``recovery`` event (detect, plan, place, start, load,
first_step). Ray Train does not expose phases, so its train function logs timestamps and we split
from the outside: ``detect+restart`` (crash -> the new worker group enters the train function, which
covers detection, teardown, placement, worker start and process-group init), ``load``, ``first_step``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

NODES, GPUS_PER_NODE, GLOBAL_BATCH, KILL_AT, SAVE_EVERY = 2, 2, 12, 4, 2


def _ours(cluster: Any, work: Path, steps: int) -> dict[str, Any]:
    import ray

    from workers.runtime.launch import start_supervisor, stop_supervisor

    spec = {
        "model": "tiny", "steps": steps, "global_batch": GLOBAL_BATCH, "checkpoint_dir": str(work / "ours"),
        "layout_hint": "tp=1,pp=1,cp=1", "min_gpus": 1,
        "checkpoint": {"min_every_steps": SAVE_EVERY, "max_every_steps": SAVE_EVERY},
        "faults": [{"kind": "kill_node", "at_step": KILL_AT, "rank": -1}],
    }
    t0 = time.time()
    handle = start_supervisor("bench-recovery", 1, spec, enable_fault_injection=True)
    result = ray.get(handle.run.remote(), timeout=1800)
    events = ray.get(handle.events.remote(0))
    stop_supervisor("bench-recovery", 1)
    rec = next((e for e in events if e["type"] == "recovery"), None)
    if result["state"] != "SUCCEEDED" or rec is None:
        raise RuntimeError(f"our run did not recover: {result['state']} {result['error']}")
    layouts = [e["short"] for e in events if e["type"] == "plan"] + \
        [e["new_short"] for e in events if e["type"] == "replan"]
    return {"system": "orthoplex runtime", "total_s": rec["total_s"], "phases": rec["phases"],
            "wall_s": round(time.time() - t0, 2), "final_loss": result["final_loss"], "layouts": layouts}


def _train_fn(config: dict[str, Any]) -> None:
    """Ray Train worker: the engine's RankTrainer, data-parallel over Ray Train's process group."""
    import ray.train
    import torch

    from planner.layout import Layout
    from workers.engine.config import TrainConfig
    from workers.engine.trainer import RankTrainer
    from workers.runtime.worker import _kill_own_node

    torch.set_num_threads(1)
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    log = Path(config["log"])

    def note(kind: str, **kw: Any) -> None:
        with log.open("a") as f:
            f.write(json.dumps({"ts": time.time(), "event": kind, "rank": rank, "world": world, **kw}) + "\n")

    note("enter")
    cfg = TrainConfig.from_dict(config["train"])
    trainer = RankTrainer(cfg, Layout(dp=world), rank, world)
    start = trainer.restore()
    note("restored", step=start)
    for step in range(start, cfg.steps):
        if step == config["kill_at"] and rank == world - 1 and world == config["full_world"]:
            note("fault", step=step)
            _kill_own_node()
        res = trainer.step()
        note("step", step=step, loss=res.loss)
        if (step + 1) % config["save_every"] == 0 or step + 1 == cfg.steps:
            trainer.save()
        ray.train.report({"step": step, "loss": res.loss})
    trainer.close()


def _ray_train(work: Path, steps: int, start_timeout_s: float | None) -> dict[str, Any]:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from workers.runtime.jobspec import parse_job

    if start_timeout_s is not None:
        os.environ["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"] = str(start_timeout_s)
    else:
        os.environ.pop("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", None)
    tag = "tuned" if start_timeout_s else "defaults"
    log = work / f"raytrain-{tag}.jsonl"
    train = parse_job({"model": "tiny", "steps": steps, "global_batch": GLOBAL_BATCH,
                       "checkpoint_dir": str(work / f"raytrain-{tag}")}).train
    full = NODES * GPUS_PER_NODE
    trainer = TorchTrainer(
        _train_fn,
        train_loop_config={"train": train, "log": str(log), "kill_at": KILL_AT, "save_every": SAVE_EVERY,
                           "full_world": full},
        scaling_config=ScalingConfig(num_workers=(1, full), use_gpu=True,
                                     resources_per_worker={"CPU": 0.05, "GPU": 1},
                                     elastic_resize_monitor_interval_s=5),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RunConfig(storage_path=str(work / "ray_results"), name=f"bench-{tag}",
                             failure_config=FailureConfig(max_failures=2)),
    )
    t0 = time.time()
    trainer.fit()
    wall = time.time() - t0
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    fault = next(r for r in rows if r["event"] == "fault")
    after = [r for r in rows if r["ts"] > fault["ts"]]
    enter = min(r["ts"] for r in after if r["event"] == "enter")
    restored = max(r["ts"] for r in after if r["event"] == "restored" and r["ts"] >= enter)
    first = min(r["ts"] for r in after if r["event"] == "step" and r["ts"] >= restored)
    phases = {"detect+restart": enter - fault["ts"], "load": restored - enter, "first_step": first - restored}
    losses = {r["step"]: r["loss"] for r in rows if r["event"] == "step"}
    worlds = sorted({r["world"] for r in rows})
    return {"system": f"Ray Train restart ({tag})", "total_s": round(first - fault["ts"], 3),
            "phases": {k: round(v, 3) for k, v in phases.items()}, "wall_s": round(wall, 2),
            "final_loss": losses[max(losses)], "layouts": [f"dp{w}" for w in worlds[::-1]]}


def _markdown(rows: list[dict[str, Any]], ratio: float) -> str:
    lines = ["| system | recovery (s) | phases (s) | layouts | run wall (s) | final loss |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        ph = ", ".join(f"{k} {v:.2f}" for k, v in r["phases"].items())
        lines.append(f"| {r['system']} | {r['total_s']:.2f} | {ph} | {' -> '.join(r['layouts'])} | "
                     f"{r['wall_s']:.1f} | {r['final_loss']:.4f} |")
    lines.append("")
    lines.append(f"Ray Train (defaults) / Orthoplex recovery time: **{ratio:.1f}x**. Workload: tiny model, "
                 f"global batch {GLOBAL_BATCH}, {NODES} nodes x {GPUS_PER_NODE} declared GPUs (CPU torch), "
                 f"node of the last rank crashed before step {KILL_AT}.")
    return "\n".join(lines)


def run(quick: bool = False) -> dict[str, Any]:
    """Both systems, same workload and failure, one invocation; ``quick`` skips the tuned Ray Train run."""
    from workers.runtime.local_cluster import InProcessCluster

    steps = 8 if quick else 12
    work = Path(tempfile.mkdtemp(prefix="orthoplex-bench-recovery-"))
    cluster = InProcessCluster(nodes=NODES, gpus_per_node=GPUS_PER_NODE).start()
    rows: list[dict[str, Any]] = []
    try:
        rows.append(_ours(cluster, work, steps))
        cluster.restore()
        rows.append(_ray_train(work, steps, None))
        if not quick:
            cluster.restore()
            rows.append(_ray_train(work, steps, 10.0))
    finally:
        cluster.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    ratio = rows[1]["total_s"] / rows[0]["total_s"]
    return {"name": "recovery", "rows": rows, "ratio_raytrain_over_ours": round(ratio, 2),
            "markdown": _markdown(rows, ratio)}


if __name__ == "__main__":
    from bench.common import write_result

    out = run(quick=bool(os.environ.get("QUICK")))
    print(out["markdown"])
    write_result(out)
