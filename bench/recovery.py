"""Recovery benchmark: the same workload and the same node failure under Orthoplex's runtime and under
Ray Train's own restart (``TorchTrainer`` + ``FailureConfig``, elastic ``ScalingConfig``), side by side;
then Orthoplex's re-plan path restoring from in-memory snapshots vs from storage (``_replan``).

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

    from workers.runtime.supervision.launch import start_supervisor, stop_supervisor

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
    from workers.runtime.cluster.rank_worker import _kill_own_node

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

    from workers.runtime.contract.job_spec import parse_job

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


# ---------------------------------------------------------------------------------- re-plan path
# The re-plan case: 3 nodes x 4 declared GPUs, one replica group (tp=4, pp=2 on 8 GPUs, at most
# 8 GPUs), the node of the last rank killed before step KILL_STEP of RE_STEPS; checkpoints to storage
# at most every CKPT_EVERY steps. Runs, all in one invocation on one cluster:
#   off     no fault, snapshots off            (the step-time baseline)
#   on      no fault, snapshots on             (snapshot overhead; the loss reference)
#   memory  the fault, snapshots on            (re-plan restores from memory)
#   storage the fault, snapshots on, every holder killed with the node (re-plan restores from storage)
RE_NODES, RE_GPUS, RE_STEPS, KILL_STEP, CKPT_EVERY, RE_HINT = 3, 4, 40, 15, 10, "tp=4,pp=2"


def _replan_run(tag: str, work: Path, *, steps: int, snapshots: bool, fault: bool, drop: bool,
                warm: int, every: int = 1) -> dict[str, Any]:
    import ray

    from workers.runtime.supervision.launch import start_supervisor, stop_supervisor

    faults: list[dict[str, Any]] = []
    if drop:
        faults.append({"kind": "drop_snapshots", "at_step": KILL_STEP})
    if fault:
        faults.append({"kind": "kill_node", "at_step": KILL_STEP, "rank": -1})
    spec = {"model": "tiny", "steps": steps, "global_batch": GLOBAL_BATCH, "checkpoint_dir": str(work / tag),
            "layout_hint": RE_HINT, "min_gpus": 1, "max_gpus": 8,
            "checkpoint": {"min_every_steps": 1, "max_every_steps": CKPT_EVERY},
            "runtime": {"snapshots": snapshots, "snapshot_every": every, "warm_ranks_per_node": warm,
                        "hang_timeout_s": 120, "start_timeout_s": 600},
            "faults": faults}
    job = f"bench-replan-{tag}"
    handle = start_supervisor(job, 1, spec, enable_fault_injection=bool(faults))
    result = ray.get(handle.run.remote(), timeout=3600)
    events = ray.get(handle.events.remote(0))
    stop_supervisor(job, 1)
    if result["state"] != "SUCCEEDED":
        raise RuntimeError(f"re-plan run {tag} did not finish: {result['state']} {result['error']}")
    steps_ev = [e for e in events if e["type"] == "step"]
    losses: dict[int, float] = {}
    for e in steps_ev:
        losses[e["step"]] = e["loss"]  # the last run of a redone step
    row: dict[str, Any] = {"run": tag, "snapshots": snapshots, "losses": losses, "final_loss": result["final_loss"],
                           "step_walls": [e["wall_s"] for e in steps_ev],
                           "step_numbers": [e["step"] for e in steps_ev],
                           "snapshot_waits": [e.get("snapshot_s") for e in steps_ev],
                           "snapshot_pushes": [e.get("snapshot_push_s") for e in steps_ev],
                           "all_step_losses": [(e["step"], e["loss"]) for e in steps_ev]}
    row["resumes"] = [(e["cause"], e["source"], e["from_step"]) for e in events if e["type"] == "resumed"]
    lost = next((e for e in events if e["type"] == "node_lost"), None)
    # the resume and recovery *after* the node loss (a loaded host can add an earlier one, e.g. a hang)
    resumed = next((e for e in events if e["type"] == "resumed" and lost is not None and e["seq"] > lost["seq"]), None)
    if lost is not None and resumed is not None:
        rec = next(e for e in events if e["type"] == "recovery" and e["seq"] > resumed["seq"])
        started = [e for e in events if e["type"] == "started"]
        row.update({"node_lost_to_resumed_s": round(resumed["ts"] - lost["ts"], 3), "source": resumed["source"],
                    "from_step": resumed["from_step"], "steps_redone": resumed["steps_redone"],
                    "recovery_total_s": rec["total_s"], "phases": rec["phases"],
                    "warm_ranks": started[-1].get("warm_ranks", 0),
                    "start_detail": {k: started[-1].get(k) for k in ("actors_s", "setup_s")},
                    "layouts": [e["short"] for e in events if e["type"] == "plan"] + [resumed["short"]]})
    return row


def _median(xs: list[float]) -> float:
    ys = sorted(xs)
    n = len(ys)
    return ys[n // 2] if n % 2 else (ys[n // 2 - 1] + ys[n // 2]) / 2


INJOB_EVERY = 3  # the in-job measure's cadence: a step that snapshots, the one its push overlaps, a clean one
INJOB_FIRST = 6  # ... and its first step counted (the gang's warm-up steps before it are left out)


def in_job_overhead(steps: list[int], walls: list[float], every: int = INJOB_EVERY,
                    first: int = INJOB_FIRST) -> list[float]:
    """What a snapshot after *every* step would cost, per step, estimated inside one job that snapshots
    after every ``every``-th step (``every`` >= 3), so that clean steps run between the snapshot
    steps, on the same gang at the same time. Each snapshot costs the step that takes it (``S``: the
    copy into host memory) and the one its background push overlaps (``P``); a step with neither
    (``C``) is the baseline. Per snapshot at step ``S``: ``(T_S + T_P - 2 T_C) / T_C`` with ``T_C`` the
    mean of the clean steps just before ``S`` and just after ``P`` (a slow drift of the host cancels);
    steps before ``first`` (the gang's warm-up) are left out. A push that outlasts ``P`` would leak
    into the next clean step and be under-counted: the caller checks the pushes against ``T_P``."""
    if every < 3:
        raise ValueError("in_job_overhead: every must be >= 3 (a clean step between two snapshot steps)")
    wall = dict(zip(steps, walls, strict=True))
    out = []
    for s in sorted(wall):
        if s % every or s - 1 < first or not all(k in wall for k in (s - 1, s + 1, s + 2)):
            continue
        clean = (wall[s - 1] + wall[s + 2]) / 2
        out.append((wall[s] + wall[s + 1] - 2 * clean) / clean)
    return out


def _restore_trace(path: Path) -> dict[str, Any]:
    """What the ranks' snapshot restores did (``ORTHOPLEX_SNAPSHOT_TRACE`` lines, see ``snapshot``)."""
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    path.unlink()
    if not rows:
        return {}
    return {"ranks": len(rows), "files_fetched": sorted(len(r["fetched"]) for r in rows), "files_of": rows[0]["of"],
            "mib_fetched_per_rank_max": round(max(r["bytes"] for r in rows) / 2**20, 2),
            "fetch_s_max": round(max(r["fetch_s"] for r in rows), 3),
            "read_s_max": round(max(r["read_s"] for r in rows), 3),
            "load_s_max": round(max(r["total_s"] for r in rows), 3)}


def _replan(quick: bool) -> dict[str, Any]:
    """The four runs on one cluster; the overhead pair (off, on) ``RECOVERY_OVERHEAD_REPS`` times
    (default 3: off, on before the fault runs, then on, off and off, on after them, so neither setting
    always runs first; ``quick``: 1, to keep the quick bench short). One pair's difference is within
    this host's run-to-run noise (+-10 % seen), so the goal is judged on the median of the pairs,
    and also inside ``RECOVERY_INJOB_RUNS`` jobs (default 2; ``quick``: 1) that snapshot after every
    ``INJOB_EVERY``-th step (:func:`in_job_overhead`: no job-to-job swing)."""
    from workers.testbed.local_cluster import InProcessCluster

    steps = 20 if quick else RE_STEPS
    reps = int(os.environ.get("RECOVERY_OVERHEAD_REPS", "1" if quick else "3"))
    # the in-job measure: jobs that snapshot every INJOB_EVERY-th step, long enough for 15+ snapshots each
    injob_runs = int(os.environ.get("RECOVERY_INJOB_RUNS", "1" if quick else "2"))
    injob_steps = 30 if quick else 61
    work = Path(tempfile.mkdtemp(prefix="orthoplex-bench-replan-"))
    trace = work / "restores.jsonl"
    os.environ["ORTHOPLEX_SNAPSHOT_TRACE"] = str(trace)  # inherited by the cluster's workers
    cluster = InProcessCluster(nodes=RE_NODES, gpus_per_node=RE_GPUS).start()
    runs: dict[str, dict[str, Any]] = {}
    pairs: list[tuple[dict[str, Any], dict[str, Any]]] = []
    loads: list[float] = [os.getloadavg()[0]]
    try:
        runs["off"] = _replan_run("off", work, steps=steps, snapshots=False, fault=False, drop=False, warm=0)
        runs["on"] = _replan_run("on", work, steps=steps, snapshots=True, fault=False, drop=False, warm=0)
        pairs.append((runs["off"], runs["on"]))
        loads.append(os.getloadavg()[0])
        runs["memory"] = _replan_run("memory", work, steps=steps, snapshots=True, fault=True, drop=False, warm=4)
        runs["memory"]["restore"] = _restore_trace(trace)
        loads.append(os.getloadavg()[0])
        cluster.restore()
        runs["storage"] = _replan_run("storage", work, steps=steps, snapshots=True, fault=True, drop=True, warm=4)
        loads.append(os.getloadavg()[0])
        injob = []
        for i in range(injob_runs):
            cluster.restore()
            injob.append(_replan_run(f"every{INJOB_EVERY}-{i + 1}", work, steps=injob_steps, snapshots=True,
                                     fault=False, drop=False, warm=0, every=INJOB_EVERY))
            loads.append(os.getloadavg()[0])
        for i in range(1, reps):
            cluster.restore()
            pair = {}
            for snap in ((True, False) if i % 2 else (False, True)):  # alternate which runs first
                pair[snap] = _replan_run(f"{'on' if snap else 'off'}{i + 1}", work, steps=steps, snapshots=snap,
                                         fault=False, drop=False, warm=0)
            pairs.append((pair[False], pair[True]))
            loads.append(os.getloadavg()[0])
    finally:
        os.environ.pop("ORTHOPLEX_SNAPSHOT_TRACE", None)
        cluster.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    ref = runs["on"]["losses"]
    for tag in ("memory", "storage", "off"):
        r = runs[tag]
        r["max_rel_loss_diff_vs_no_fault"] = max(abs(loss - ref[s]) / abs(ref[s]) for s, loss in r["all_step_losses"])
    steady = slice(5, None)  # after the first gang's warm-up steps
    overheads = []
    for off, on in pairs:
        off_s, on_s = _median(off["step_walls"][steady]), _median(on["step_walls"][steady])
        waits = [w for w in on["snapshot_waits"][steady] if w is not None]
        blocked = _median(waits) if waits else None  # inside the snapshots-on job: its steps' wait for the snapshot
        overheads.append({"off_s": round(off_s, 4), "on_s": round(on_s, 4), "overhead": round(on_s / off_s - 1.0, 4),
                          "blocked_s": None if blocked is None else round(blocked, 4),
                          "blocked_share": None if blocked is None else round(blocked / on_s, 4)})
    out = {"steps": steps, "kill_step": KILL_STEP, "hint": RE_HINT, "checkpoint_every_max": CKPT_EVERY,
           "step_s_snapshots_off": overheads[0]["off_s"], "step_s_snapshots_on": overheads[0]["on_s"],
           "snapshot_overhead": overheads[0]["overhead"], "overhead_pairs": overheads,
           "snapshot_overhead_median": round(_median([o["overhead"] for o in overheads]), 4),
           "load_average_1min": [round(x, 1) for x in loads],
           "runs": {k: {kk: vv for kk, vv in v.items()
                        if kk not in ("losses", "all_step_losses", "step_walls", "snapshot_waits")}
                    for k, v in runs.items()}}
    shares = [o["blocked_share"] for o in overheads if o["blocked_share"] is not None]
    if shares:
        out["snapshot_blocked_share_median"] = round(_median(shares), 4)
    if injob:
        out["in_job"] = _in_job_summary(injob, steps=injob_steps)
    return out


def _in_job_summary(jobs: list[dict[str, Any]], *, steps: int) -> dict[str, Any]:
    """The in-job estimate over ``jobs`` (each a :func:`_replan_run` row of a job snapshotting every
    ``INJOB_EVERY``-th step), with the checks its model needs: each push against the step it overlaps."""
    per_job, pushes_over = [], 0
    all_est: list[float] = []
    for job in jobs:
        nums, walls = job["step_numbers"], job["step_walls"]
        est = in_job_overhead(nums, walls)
        all_est += est
        wall = dict(zip(nums, walls, strict=True))
        # step s reports the push of the snapshot taken INJOB_EVERY steps before; it overlapped step s - every + 1
        push = {s: p for s, p in zip(nums, job["snapshot_pushes"], strict=True) if p is not None}
        over = [s for s, p in push.items() if s - INJOB_EVERY + 1 in wall and p > wall[s - INJOB_EVERY + 1]]
        pushes_over += len(over)
        stage = [w for s, w in zip(nums, job["snapshot_waits"], strict=True) if w is not None and s >= INJOB_FIRST]
        clean = [wall[s] for s in nums if s % INJOB_EVERY == INJOB_EVERY - 1 and s >= INJOB_FIRST]
        per_job.append({"run": job["run"], "snapshots_timed": len(est), "median": round(_median(est), 4),
                        "clean_step_s": round(_median(clean), 4),
                        "stage_s_median": round(_median(stage), 4) if stage else None,
                        "push_s_median": round(_median(list(push.values())), 4) if push else None,
                        "push_s_max": round(max(push.values()), 4) if push else None,
                        "pushes_longer_than_their_step": len(over)})
    return {"every": INJOB_EVERY, "steps": steps, "jobs": per_job, "estimates": [round(x, 4) for x in all_est],
            "median": round(_median(all_est), 4), "pushes_longer_than_their_step": pushes_over}


def _replan_markdown(r: dict[str, Any]) -> str:
    mem, sto = r["runs"]["memory"], r["runs"]["storage"]
    lines = ["### Re-plan path: restore from memory vs from storage", "",
             f"3 nodes x 4 declared GPUs (CPU torch), `{r['hint']}` on 8 GPUs (`max_gpus` 8), tiny model, global "
             f"batch {GLOBAL_BATCH}, {r['steps']} steps; the node of the last rank killed before step "
             f"{r['kill_step']}; storage checkpoints at most every {r['checkpoint_every_max']} steps; 4 warm "
             "ranks per node. Storage run: every snapshot holder is killed with the node.", "",
             "| restore from | node_lost -> resumed (s) | recovery phases (s) | steps redone | warm ranks | "
             "max rel. loss diff vs no-fault | final loss |", "|---|---|---|---|---|---|---|"]
    for row in (mem, sto):
        ph = ", ".join(f"{k} {v:.2f}" for k, v in row["phases"].items())
        lines.append(f"| {row['source']} | {row['node_lost_to_resumed_s']:.2f} | {ph} | {row['steps_redone']} | "
                     f"{row['warm_ranks']} | {row['max_rel_loss_diff_vs_no_fault']:.1e} | {row['final_loss']:.4f} |")
    lines += ["", f"Storage / memory, node_lost -> resumed: **{sto['node_lost_to_resumed_s'] / mem['node_lost_to_resumed_s']:.2f}x**; "
              f"steps redone {sto['steps_redone']} vs {mem['steps_redone']}.", "",
              "Snapshot overhead (no fault, steady-state median step time, steps 6-" + str(r["steps"]) + "; "
              "baseline = the same job with snapshots off, same cluster, same invocation): "
              + "; ".join(f"off {p['off_s']:.3f} s, on {p['on_s']:.3f} s: **{100 * p['overhead']:+.1f}%**"
                          for p in r.get("overhead_pairs", [{"off_s": r["step_s_snapshots_off"],
                                                             "on_s": r["step_s_snapshots_on"],
                                                             "overhead": r["snapshot_overhead"]}])) + "; "
              f"median of the pairs **{100 * r.get('snapshot_overhead_median', r['snapshot_overhead']):+.1f}%**."]
    if r.get("snapshot_blocked_share_median") is not None:
        lines += ["", "Measured inside the snapshots-on jobs (the `step` events' `snapshot_s`: the longest wait of any "
                  "rank's step for its snapshot, steady-state median): "
                  + "; ".join(f"{p['blocked_s'] * 1000:.0f} ms of {p['on_s']:.3f} s = {100 * p['blocked_share']:.1f}%"
                              for p in r["overhead_pairs"] if p.get("blocked_share") is not None)
                  + f"; median **{100 * r['snapshot_blocked_share_median']:.1f}%**. This is the time the steps stop "
                  "for the snapshot; the background push's CPU (which on this 2-core host competes with the ranks) "
                  "is in the off/on pairs only."]
    ij = r.get("in_job")
    if ij:
        lines += ["", f"**In-job measure** ({len(ij['jobs'])} job(s) of {ij['steps']} steps snapshotting after every "
                  f"{ij['every']}rd step, no fault, same cluster and invocation): per snapshot, the step that takes it "
                  "and the step its push overlaps, against the clean steps just before and just after, "
                  "`(T_S + T_P - 2 T_C) / T_C`: what snapshotting after every step costs per step, with the baseline "
                  "measured between the snapshots on the same gang (no job-to-job swing). "
                  + "; ".join(f"{j['run']}: {j['snapshots_timed']} snapshots, median **{100 * j['median']:+.1f}%** "
                              f"(clean step {j['clean_step_s']:.3f} s, copy to host memory "
                              f"{1000 * (j['stage_s_median'] or 0):.0f} ms, push median {1000 * (j['push_s_median'] or 0):.0f} ms, "
                              f"max {1000 * (j['push_s_max'] or 0):.0f} ms)" for j in ij["jobs"])
                  + f"; all snapshots: median **{100 * ij['median']:+.1f}%** (spread "
                  f"{100 * min(ij['estimates']):+.1f} to {100 * max(ij['estimates']):+.1f}%). Pushes longer than the "
                  f"step they overlap (the model's assumption broken): {ij['pushes_longer_than_their_step']}."]
    rest = mem.get("restore") or {}
    if rest:
        lines += ["", f"Memory restore, per rank: files fetched {rest['files_fetched']} of {rest['files_of']} "
                  f"(max {rest['mib_fetched_per_rank_max']} MiB), fetch <= {rest['fetch_s_max']:.2f} s, "
                  f"read + reshard <= {rest['read_s_max']:.2f} s, whole load <= {rest['load_s_max']:.2f} s; "
                  f"gang start: actors {mem['start_detail']['actors_s']:.2f} s, setup {mem['start_detail']['setup_s']:.2f} s."]
    if r.get("load_average_1min"):
        lines += ["", f"_Host load average (1 min) at the start and after each part: {r['load_average_1min']}._"]
    return "\n".join(lines)


def _goals_markdown(samples: list[dict[str, Any]]) -> str:
    """The issue's re-plan goals against the measured samples (one per ``_replan`` run), verdicts computed."""
    mem = [s["runs"]["memory"] for s in samples]
    sto = [s["runs"]["storage"] for s in samples]
    ov = [p["overhead"] for s in samples for p in s.get("overhead_pairs", [{"overhead": s["snapshot_overhead"]}])]
    loss = max(m["max_rel_loss_diff_vs_no_fault"] for m in mem + sto)
    shares = [s["snapshot_blocked_share_median"] for s in samples if s.get("snapshot_blocked_share_median") is not None]
    blocked = f"; steps blocked by the snapshot {', '.join(f'{100 * x:.1f}%' for x in shares)}" if shares else ""

    def secs(rows: list[dict[str, Any]]) -> str:
        return ", ".join(f"{r['node_lost_to_resumed_s']:.1f} s" for r in rows)

    def yes(ok: bool) -> str:
        return "yes" if ok else "**no**"

    def overhead_verdict(xs: list[float]) -> str:
        med = _median(xs)  # one pair is within the host's run-to-run noise: the median of the pairs
        if med > 0.05:
            return f"**no** (median {100 * med:+.1f}%)"
        return f"yes (median {100 * med:+.1f}%)" + (" (single pairs above 5%: noise)" if any(o > 0.05 for o in xs) else "")

    injob = [s["in_job"] for s in samples if s.get("in_job")]
    injob_row = []
    if injob:
        meds = [x["median"] for x in injob]
        broken = sum(x["pushes_longer_than_their_step"] for x in injob)
        ok = all(m <= 0.05 for m in meds) and not broken
        injob_row = [
            f"| snapshot overhead <= 5% of step time, in-job (snapshots every {injob[0]['every']}rd step; the clean steps "
            f"between them are the baseline) | median of {sum(len(x['estimates']) for x in injob)} snapshots "
            f"{', '.join(f'{100 * m:+.1f}%' for m in meds)}; pushes outlasting their step: {broken} | {yes(ok)} |"]

    return "\n".join([
        "### Goals (issue 14, re-plan path)", "", "| goal | measured | met? |", "|---|---|---|",
        f"| node_lost -> resumed <= 5 s, from memory | {secs(mem)} (storage: {secs(sto)}) | "
        f"{yes(all(m['node_lost_to_resumed_s'] <= 5 for m in mem))} |",
        f"| at most one step redone | memory {', '.join(str(m['steps_redone']) for m in mem)} "
        f"(storage {', '.join(str(s['steps_redone']) for s in sto)}) | {yes(all(m['steps_redone'] <= 1 for m in mem))} |",
        f"| every step's loss within 1e-4 of the no-fault run | max rel. diff {loss:.1e} | {yes(loss <= 1e-4)} |",
        f"| snapshot overhead <= 5% of step time, job vs job | off/on pairs {', '.join(f'{100 * o:+.1f}%' for o in ov)}"
        f"{blocked} | {overhead_verdict(ov)} |", *injob_row])


PARTS = ("baseline", "compare", "replan", "product", "product-single", "product-replica")


def _carried(parts: list[str], path: Path | None = None) -> dict[str, Any]:
    """The parts not rerun, from the last results file (``carried``: part -> the run it comes from).
    The planner and the goodput simulator take their prior recovery phases from the baseline rows (planner/recovery_cost.py ``PRIOR_PHASES``),
    so a partial run keeps them, and the other parts, saying which run they come from."""
    from bench.common import RESULTS_DIR

    path = path or RESULTS_DIR / "recovery.json"
    if not path.exists():
        return {}
    before = json.loads(path.read_text())
    out: dict[str, Any] = {}
    carried = dict(before.get("carried") or {})
    keys = {"baseline": ("rows", "ratio_raytrain_over_ours"), "compare": ("compare",), "replan": ("replan",),
            "product": ("product",)}
    for part in keys:
        if part in parts or keys[part][0] not in before:
            continue
        out.update({k: before.get(k) for k in keys[part]})
        out.setdefault("carried", {})[part] = carried.get(part) or before.get("finished_at", "?")
    return out


def render_markdown(result: dict[str, Any]) -> str:
    """The recovery results' tables, rendered from ``result``'s data (``bench.render``)."""
    from bench.recovery_replicas import compare_markdown

    carried = result.get("carried") or {}

    def since(part: str) -> list[str]:
        return [f"_Not rerun in this run: from the run finished {carried[part]}._"] if part in carried else []

    md: list[str] = []
    if result.get("rows"):
        md += [_markdown(result["rows"], result["ratio_raytrain_over_ours"]), *since("baseline")]
    if result.get("compare"):
        md += [compare_markdown(result["compare"]), *since("compare")]
    if result.get("replan"):
        md += [_replan_markdown(result["replan"]), _goals_markdown([result["replan"]]), *since("replan")]
    if result.get("product"):
        from bench.recovery_product import product_markdown

        md += [product_markdown(result["product"]), *since("product")]
    return "\n\n".join(md)


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """The history row of a recovery run: the parts it ran (not the carried ones), headline numbers."""
    from bench.recovery_replicas import compare_summary

    carried = result.get("carried") or {}
    out: dict[str, Any] = {"parts": ",".join(p for p in PARTS if p not in carried and p in (result.get("parts") or PARTS)
                                             and result.get({"baseline": "rows", "product-single": "product",
                                                                   "product-replica": "product"}.get(p, p)))}
    if result.get("rows") and "baseline" not in carried:
        out["restart / ours"] = result.get("ratio_raytrain_over_ours")
    if result.get("compare") and "compare" not in carried:
        out.update(compare_summary(result["compare"]))
    if result.get("replan") and "replan" not in carried:
        r = result["replan"]
        out["replan memory s"] = r["runs"]["memory"]["node_lost_to_resumed_s"]
        out["replan storage s"] = r["runs"]["storage"]["node_lost_to_resumed_s"]
        out["snapshot overhead"] = r.get("snapshot_overhead_median", r.get("snapshot_overhead"))
    if result.get("product") and "product" not in carried:
        from bench.recovery_product import product_summary

        out.update(product_summary(result["product"]))
    return out


def run(quick: bool = False, parts: list[str] | None = None, repeat: int = 1) -> dict[str, Any]:
    """Both systems, same workload and failure, one invocation; ``quick`` skips the tuned Ray Train run.
    Then replica groups (``compare``: Orthoplex tp=2 and tp=1 replica groups, Ray Train + torchft and Ray
    Train restart, same cluster and failure, ``repeat`` times, see ``bench.recovery_replicas``) and the
    re-plan path (memory vs storage) on the issue's 3 x 4 cluster; ``product``: issue 38's goals through
    the service with default options. ``parts`` (default: all, or
    ``RECOVERY_PARTS``): the parts to run; the others are carried from the last results file."""
    from workers.testbed.local_cluster import InProcessCluster

    parts = parts or os.environ.get("RECOVERY_PARTS", ",".join(PARTS)).split(",")
    parts = ["compare" if p == "replicas" else p for p in parts]  # ``replicas``: the old name of compare
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise ValueError(f"unknown recovery part(s) {unknown}; choose from {', '.join(PARTS)}")
    steps = 8 if quick else 12
    rows: list[dict[str, Any]] = []
    out: dict[str, Any] = {"name": "recovery", "quick": quick, "parts": parts, **_carried(parts)}
    if "baseline" in parts:
        work = Path(tempfile.mkdtemp(prefix="orthoplex-bench-recovery-"))
        cluster = InProcessCluster(nodes=NODES, gpus_per_node=GPUS_PER_NODE).start()
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
        out.update({"rows": rows, "ratio_raytrain_over_ours": round(ratio, 2)})
    if "compare" in parts:
        from bench.recovery_replicas import compare

        out["compare"] = compare(quick, repeat=repeat)
    if "replan" in parts:
        out["replan"] = _replan(quick)
    if "product" in parts:  # issue 38's goals through the service (bench.recovery_product)
        from bench.recovery_product import product

        out["product"] = product(quick)
    elif {"product-single", "product-replica"} & set(parts):  # one job's runs; the other's carried over
        from bench.recovery_product import merge, product

        keys = tuple(k for k in ("replica", "single") if f"product-{k}" in parts)
        before_at = (out.get("carried") or {}).pop("product", "?")
        out["product"] = merge(out.get("product"), product(quick, keys=keys), before_at)
    return out


if __name__ == "__main__":
    from bench.common import write_result

    out = run(quick=bool(os.environ.get("QUICK")))
    print(render_markdown(out))
    write_result(out)
